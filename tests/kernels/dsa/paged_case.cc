#include "tests/kernels/dsa/paged_case.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/common/fp8.h"
#include "kernels/sparse_mla/params.h"
#include "tests/harness/fp8_kv.h"
#include "tests/kernels/indexer_logits_paged/frontend_caches.h"

namespace attnd::testing {

using kernels::DType;

namespace {

constexpr int32_t kUnusedEntry = 1 << 24;  // past every pool: masked (or -1) if it were read

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t PagedDsaCase::kv_block_size() const {
  return spec_.separate_kv_table && spec_.kv_block_size != 0 ? spec_.kv_block_size
                                                             : spec_.index_block_size;
}

PagedDsaCase::PagedDsaCase(const PagedDsaSpec& spec, std::mt19937_64& rng)
    : spec_(spec), rng_(rng()) {
  const int64_t b = spec.batch, nn = spec.next_n, t = b * nn, pad = spec.pad;
  const int64_t hi = spec.index_heads, di = spec.index_dim, ibs = spec.index_block_size;
  index_q_ = HostTensor::RowStrided(DType::kFp8E4M3, {b, nn, hi, di}, nn * hi * di + pad);
  FillNormal(index_q_, rng_, 1.0);
  index_weights_ = HostTensor::RowStrided(DType::kF32, {t, hi}, hi + pad);
  FillNormal(index_weights_, rng_, 1.0);

  // The indexer cache, written slot by slot as vLLM's indexer_k_quant_and_cache does: block
  // s / bs, codes at offset (s % bs)·D, the scale after the block's bs keys. Row padding: 0xff.
  const int64_t block_bytes = ibs * (di + 4);
  index_cache_ =
      HostTensor::RowStrided(DType::kU8, {spec.index_blocks, block_bytes}, block_bytes + pad);
  std::memset(index_cache_.raw(), 0xff, static_cast<size_t>(index_cache_.bytes()));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> key(static_cast<size_t>(di));
  const int64_t cache_ld = index_cache_.tensor().stride(0);
  for (int64_t slot = 0; slot < spec.index_blocks * ibs; ++slot) {
    for (float& v : key) v = normal(rng_);
    const float scale = kernels::indexer_logits_paged::QuantScale(key.data(), di, false);
    uint8_t* block = index_cache_.data<uint8_t>() + (slot / ibs) * cache_ld;
    for (int64_t d = 0; d < di; ++d) {
      block[(slot % ibs) * di + d] = kernels::FloatToFp8E4M3(key[static_cast<size_t>(d)] / scale);
    }
    std::memcpy(block + ibs * di + 4 * (slot % ibs), &scale, 4);
  }

  // The MLA pool: blocks of kv_block_stride rows, the first kv_block_size of them this layer's;
  // the rest (other layers' rows) and row padding poisoned.
  const int64_t kbs = kv_block_size();
  const int64_t stride = spec.kv_block_stride != 0 ? spec.kv_block_stride : kbs;
  const int64_t kv_blocks =
      spec.separate_kv_table && spec.kv_blocks != 0 ? spec.kv_blocks : spec.index_blocks;
  const int64_t rows = kv_blocks * stride;
  if (spec.per_tensor_kv) {
    const int64_t row_bytes = spec.d_qk + pad;
    kv_ = HostTensor::RowStrided(DType::kU8, {rows, spec.d_qk}, row_bytes);
    std::memset(kv_.raw(), 0x7f, static_cast<size_t>(kv_.bytes()));  // NaN codes: poison
    std::vector<kernels::bf16_t> source(static_cast<size_t>(spec.d_qk));
    for (int64_t r = 0; r < rows; ++r) {
      if (r % stride >= kbs) continue;
      FillMlaSourceRow(source.data(), spec.d_qk, spec.kv_scale, rng_);
      QuantizeMlaRowPerTensor(source.data(), spec.d_qk, spec.kv_scale,
                              kv_.data<uint8_t>() + r * row_bytes);
    }
  } else if (spec.fp8_kv) {
    const int64_t row_bytes = kernels::sparse_mla::kFp8RowBytes + 4 * pad;
    kv_ = HostTensor::RowStrided(DType::kU8, {rows, kernels::sparse_mla::kFp8RowBytes}, row_bytes);
    std::memset(kv_.raw(), 0xff, static_cast<size_t>(kv_.bytes()));
    for (int64_t r = 0; r < rows; ++r) {
      if (r % stride < kbs) FillFp8Row(kv_.data<uint8_t>() + r * row_bytes, rng_, true);
    }
  } else {
    kv_ = HostTensor::RowStrided(DType::kBF16, {rows, spec.d_qk}, spec.d_qk + pad);
    FillNormal(kv_, rng_, 1.0);
    uint16_t* bits = kv_.data<uint16_t>();
    const int64_t ld = kv_.tensor().stride(0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t from = r % stride < kbs ? spec.d_qk : 0;
      std::fill(bits + r * ld + from, bits + (r + 1) * ld, uint16_t{0x7fc0});  // NaN
    }
  }
  index_table_ = HostTensor::RowStrided(DType::kI32, {b, spec.max_blocks}, spec.max_blocks + pad);
  if (spec.separate_kv_table) {
    const int64_t cols = CeilDiv(spec.max_blocks * ibs, kbs);
    kv_table_ = HostTensor::RowStrided(DType::kI32, {b, cols}, cols + pad);
  }
  context_lens_ = spec.per_token_lens ? HostTensor::RowStrided(DType::kI32, {b, nn}, nn + pad)
                                      : HostTensor::Dense(DType::kI32, {b});

  q_ = HostTensor::RowStrided(DType::kBF16, {t, spec.heads, spec.d_qk},
                              spec.heads * spec.d_qk + pad);
  FillNormal(q_, rng_, 1.0);
  if (spec.with_logits) {
    const int64_t n = spec.max_blocks * ibs;
    logits_ = HostTensor::RowStrided(DType::kF32, {t, n}, n + pad);
  }
  out_ = HostTensor::Dense(DType::kBF16, {t, spec.heads, kernels::sparse_mla::kDimV});
  if (spec.with_lse) lse_ = HostTensor::Dense(DType::kF32, {t, spec.heads});
  if (spec.with_indices) indices_ = HostTensor::Dense(DType::kI32, {t, spec.topk});
  SetContexts(std::vector<int64_t>(static_cast<size_t>(b), spec.max_blocks * ibs / 2));
}

void PagedDsaCase::SetContexts(const std::vector<int64_t>& contexts) {
  const int64_t ibs = spec_.index_block_size, kbs = kv_block_size();
  const int64_t cap = spec_.max_blocks * ibs;
  // Each table: a shuffled pool of block ids, handed out without reuse while it lasts.
  auto fill = [&](HostTensor& table, int64_t pool_blocks, int64_t block) {
    std::vector<int32_t> pool(static_cast<size_t>(pool_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng_);
    int32_t* data = table.data<int32_t>();
    std::fill(data, data + table.span_elements(), kUnusedEntry);
    size_t next = 0;
    for (int64_t b = 0; b < spec_.batch; ++b) {
      const int64_t used = CeilDiv(std::clamp<int64_t>(contexts[b], 0, cap), block);
      for (int64_t i = 0; i < used; ++i) {
        data[b * table.tensor().stride(0) + i] = pool[next++ % pool.size()];
      }
    }
  };
  fill(index_table_, spec_.index_blocks, ibs);
  if (spec_.separate_kv_table) {
    fill(kv_table_, spec_.kv_blocks != 0 ? spec_.kv_blocks : spec_.index_blocks, kbs);
  }
  int32_t* lens = context_lens_.data<int32_t>();
  if (spec_.per_token_lens) {
    std::fill(lens, lens + context_lens_.span_elements(), INT32_MAX);  // padding: would show
    for (int64_t b = 0; b < spec_.batch; ++b) {
      for (int64_t j = 0; j < spec_.next_n; ++j) {
        SetTokenLength(b, j, static_cast<int32_t>(contexts[b] - spec_.next_n + j + 1));
      }
    }
  } else {
    for (int64_t b = 0; b < spec_.batch; ++b) lens[b] = static_cast<int32_t>(contexts[b]);
  }
}

void PagedDsaCase::SetTokenLength(int64_t b, int64_t j, int32_t length) {
  context_lens_.data<int32_t>()[b * context_lens_.tensor().stride(0) + j] = length;
}

void PagedDsaCase::SetIndexBlock(int64_t b, int64_t i, int32_t id) {
  index_table_.data<int32_t>()[b * index_table_.tensor().stride(0) + i] = id;
}

void PagedDsaCase::SetKvBlock(int64_t b, int64_t i, int32_t id) {
  kv_table_.data<int32_t>()[b * kv_table_.tensor().stride(0) + i] = id;
}

kernels::dsa::Params PagedDsaCase::MakeParams() {
  kernels::dsa::Params p;
  p.index_q = index_q_.tensor();
  p.index_weights = index_weights_.tensor();
  p.index_cache = index_cache_.tensor();
  p.index_block_size = spec_.index_block_size;
  p.index_block_table = index_table_.tensor();
  p.context_lens = context_lens_.tensor();
  if (spec_.separate_kv_table) {
    p.kv_block_table = kv_table_.tensor();
    p.kv_block_size = spec_.kv_block_size;
  }
  p.kv_block_stride = spec_.kv_block_stride;
  p.topk = spec_.topk;
  p.q = q_.tensor();
  p.kv = kv_.tensor();
  if (spec_.per_tensor_kv) {
    p.kv_scale = spec_.kv_scale;
    p.kv_layout = spec_.d_qk == 576 ? kernels::CacheLayout::kFp8_576PerTensor
                                    : kernels::CacheLayout::kFp8_512PerTensor;
  }
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec_.d_qk)));
  if (spec_.with_logits) p.logits = logits_.tensor();
  p.out = out_.tensor();
  if (spec_.with_lse) p.lse = lse_.tensor();
  if (spec_.with_indices) p.indices = indices_.tensor();
  return p;
}

std::vector<HostTensor*> PagedDsaCase::Outputs() {
  std::vector<HostTensor*> outs = {&out_};
  if (spec_.with_lse) outs.push_back(&lse_);
  if (spec_.with_indices) outs.push_back(&indices_);
  if (spec_.with_logits) outs.push_back(&logits_);
  return outs;
}

}  // namespace attnd::testing
