// Indexer key caches built the way ROCm frontends build them (docs/INDEXER_CACHES.md says which
// release and file each writer below follows): each writer quantizes one token's key to fp8 with
// one f32 scale and stores it in a slot of a paged u8 cache tensor [num_blocks, block_size·(D+4)]
// (row stride may be padded), addressing bytes exactly as the frontend's cache writer does.
//   VllmRocmIndexerWriter w(kv_cache, block_size, dim);  w.Write(slot, key);  // SHUFFLE / NORMAL
//   FillFrontendCache(kv_cache, block_size, dim, Frontend::kVllmRocm, rng);  // every slot, random
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/common/fp8.h"
#include "tests/harness/host_tensor.h"

namespace attnd::kernels::indexer_logits_paged {

// The per-token quantization the frontends share: amax over the key, scale = max(amax, 1e-4) /
// 448 (e4m3fn's largest finite value; gfx950 and CUDA), optionally rounded up to a power of two
// (scale_fmt "ue8m0"); codes = fp8(key / scale).
inline float QuantScale(const float* key, int64_t dim, bool ue8m0) {
  float amax = 0.0f;
  for (int64_t d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(key[d]));
  float scale = std::max(amax, 1e-4f) / 448.0f;
  if (ue8m0) scale = std::exp2(std::ceil(std::log2(scale)));
  return scale;
}

// vLLM's ROCm indexer cache writer (indexer_k_quant_and_cache_triton): the cache viewed as
// [num_blocks, -1] bytes, its first block_size·D bytes per block the fp8 values, the rest the f32
// scales; layout SHUFFLE when block_size > 1 (16-token × 16-byte tiles), NORMAL at block_size 1.
class VllmRocmIndexerWriter {
 public:
  VllmRocmIndexerWriter(testing::HostTensor& cache, int64_t block_size, int64_t dim)
      : base_(cache.data<uint8_t>()),
        value_stride_(cache.tensor().stride(0)),
        block_size_(block_size),
        dim_(dim) {}

  void Write(int64_t slot, const float* key, bool ue8m0 = false) const {
    constexpr int64_t kBlockTile = 16, kHeadTile = 16;  // tokens; bytes (16 B / 1-byte fp8)
    const bool shuffle = block_size_ != 1;
    const int64_t block_id = slot / block_size_, block_offset = slot % block_size_;
    const int64_t tile_block_id = block_offset / kBlockTile;
    const int64_t tile_block_offset = block_offset % kBlockTile;
    const float scale = QuantScale(key, dim_, ue8m0);
    uint8_t* dst = shuffle ? base_ + block_id * value_stride_ + tile_block_id * kBlockTile * dim_ +
                                 tile_block_offset * kHeadTile
                           : base_ + block_id * value_stride_ + block_offset * dim_;
    for (int64_t offset = 0; offset < dim_; ++offset) {
      const int64_t tile_offset =
          shuffle ? offset / kHeadTile * kBlockTile * kHeadTile + offset % kHeadTile : offset;
      dst[tile_offset] = FloatToFp8E4M3(key[offset] / scale);
    }
    // kv_cache[:, block_size·D:] viewed as f32: row stride value_stride_ / 4 floats.
    std::memcpy(base_ + block_id * value_stride_ + block_size_ * dim_ + 4 * block_offset, &scale,
                4);
  }

 private:
  uint8_t* base_;
  int64_t value_stride_, block_size_, dim_;
};

// AITER's HIP writer (indexer_k_quant_and_cache with preshuffle, quant block = D): the cache as
// dense [num_blocks, block_size, D + 4] (no row padding), a 16-token group holding D/16 tiles of
// 16 × 16 bytes, each tile row-major (token, byte); the scales after the block's values.
class AiterIndexerWriter {
 public:
  AiterIndexerWriter(testing::HostTensor& cache, int64_t block_size, int64_t dim)
      : base_(cache.data<uint8_t>()), block_size_(block_size), dim_(dim) {}

  void Write(int64_t slot, const float* key, bool ue8m0 = false) const {
    constexpr int64_t kTile = 16;
    const int64_t cache_stride = dim_ + 4;  // bytes per token: D codes and one f32 scale
    const int64_t block_idx = slot / block_size_, block_offset = slot % block_size_;
    const float scale = QuantScale(key, dim_, ue8m0);
    for (int64_t head_dim_idx = 0; head_dim_idx < dim_; ++head_dim_idx) {
      const int64_t dst = block_idx * block_size_ * cache_stride +
                          block_offset / kTile * (kTile * dim_) +
                          head_dim_idx / kTile * (kTile * kTile) + block_offset % kTile * kTile +
                          head_dim_idx % kTile;
      base_[dst] = FloatToFp8E4M3(key[head_dim_idx] / scale);
    }
    // One scale per quant block of D values: (block_offset·D)·4 / D bytes into the scales.
    const int64_t scale_at =
        block_idx * block_size_ * cache_stride + block_size_ * dim_ + block_offset * 4;
    std::memcpy(base_ + scale_at, &scale, 4);
  }

 private:
  uint8_t* base_;
  int64_t block_size_, dim_;
};

// SGLang's NSA indexer pool writer (SetKAndS) as the HIP backend uses it, page size 1: the pool
// [num_pages, page_size·(D + 4)], key bytes at page·row + offset·D, the f32 scale at page·row +
// page_size·D + 4·offset (scale_fmt ue8m0 in DeepSeek-V3.2's config).
class SglangIndexerWriter {
 public:
  SglangIndexerWriter(testing::HostTensor& cache, int64_t page_size, int64_t dim)
      : base_(cache.data<uint8_t>()),
        numel_per_page_(cache.tensor().stride(0)),
        page_size_(page_size),
        dim_(dim) {}

  void Write(int64_t loc, const float* key, bool ue8m0 = true) const {
    const int64_t page = loc / page_size_, offset = loc % page_size_;
    const float scale = QuantScale(key, dim_, ue8m0);
    uint8_t* k = base_ + page * numel_per_page_ + offset * dim_;
    for (int64_t d = 0; d < dim_; ++d) k[d] = FloatToFp8E4M3(key[d] / scale);
    std::memcpy(base_ + page * numel_per_page_ + page_size_ * dim_ + offset * 4, &scale, 4);
  }

 private:
  uint8_t* base_;
  int64_t numel_per_page_, page_size_, dim_;
};

enum class Frontend { kVllmRocm, kAiter, kSglangHip };

// Poisons every byte of kv_cache (0xff: an fp8 NaN, a NaN scale), then writes a fresh random key
// (N(0, 1) times a per-token magnitude in [0.25, 4]) into every slot of every block, in a
// shuffled slot order (a slot mapping), with the frontend's writer. Row padding stays poisoned.
inline void FillFrontendCache(testing::HostTensor& kv_cache, int64_t block_size, int64_t dim,
                              Frontend frontend, std::mt19937_64& rng) {
  std::memset(kv_cache.raw(), 0xff, static_cast<size_t>(kv_cache.bytes()));
  const int64_t slots = kv_cache.tensor().dim(0) * block_size;
  std::vector<int64_t> slot_mapping(static_cast<size_t>(slots));
  std::iota(slot_mapping.begin(), slot_mapping.end(), 0);
  std::shuffle(slot_mapping.begin(), slot_mapping.end(), rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> magnitude(0.25f, 4.0f);
  std::vector<float> key(static_cast<size_t>(dim));
  const VllmRocmIndexerWriter vllm(kv_cache, block_size, dim);
  const AiterIndexerWriter aiter(kv_cache, block_size, dim);
  const SglangIndexerWriter sglang(kv_cache, block_size, dim);
  for (const int64_t slot : slot_mapping) {
    const float m = magnitude(rng);
    for (float& v : key) v = m * normal(rng);
    switch (frontend) {
      case Frontend::kVllmRocm: vllm.Write(slot, key.data()); break;
      case Frontend::kAiter: aiter.Write(slot, key.data()); break;
      case Frontend::kSglangHip: sglang.Write(slot, key.data()); break;
    }
  }
}

}  // namespace attnd::kernels::indexer_logits_paged
