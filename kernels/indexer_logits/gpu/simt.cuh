// The portable SIMT indexer kernel (CUDA and HIP, any H <= 128, D a multiple of 16, any
// alignment, keys in contiguous rows or in 16-token tiles), shared by the prefill (kPaged = false)
// and paged (kPaged = true) operators.
//
// A CTA of 256 threads owns a block of queries (queries_per_block = 128 / H, so at most 128
// (query, head) columns) and a key chunk. It fills -inf outside the union of its rows' windows,
// then walks the union in tiles of 64 keys: S = K·Qᵀ over D in slabs of 16 (fp8 decoded to f32 in
// shared memory, a 4 keys × 8 columns register tile per thread), then relu(S)·w per column into
// shared memory, then one thread per (key, query) sums the heads, multiplies the key's scale and
// stores the logit (or -inf outside the row's window / for a masked key).
#pragma once

#include <stdint.h>

#include "kernels/common/gpu/convert.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/indexer_logits/gpu/common.cuh"

namespace attnd::kernels::indexer_logits::gpu {

inline constexpr int kSimtThreads = 256;
inline constexpr int kSimtBlockM = 128;  // (query, head) columns per CTA, at most
inline constexpr int kSimtBlockN = 64;   // keys per tile
inline constexpr int kSimtSlab = 16;     // head-dim values per shared-memory slab
static_assert(kSimtSlab == 16, "a slab is one 16-byte piece of a tiled paged key (problem.h)");
inline constexpr int kSimtCtasPerSm = 4;  // for the key-chunk split

struct SimtShared {
  static constexpr int kQStride = kSimtBlockM + 4;  // floats; rows stay 16-B aligned
  static constexpr int kKStride = kSimtBlockN + 4;
  static constexpr int kSStride = kSimtBlockM + 1;  // odd: the head sums read conflict-free
  alignas(16) union {
    struct {
      float q[kSimtSlab][kQStride];  // slab of the query block, [d][column]
      float k[kSimtSlab][kKStride];  // slab of the key tile, [d][key]
    } slab;
    float s[kSimtBlockN][kSStride];  // relu(S)·w, [key][column]
  } u;
  float w[kSimtBlockM];                 // weights of the block's columns
  const uint8_t* key_row[kSimtBlockN];  // the tile's key rows, null when masked or past the union
  float scale[kSimtBlockN];             // their scales (0 when masked)
  int64_t lo[kSimtBlockM], hi[kSimtBlockM];  // row windows (<= 128 rows per block)
};
static_assert(sizeof(SimtShared) <= 48 * 1024, "SIMT shared memory must not need an opt-in");

// Four bytes at p (any alignment) as the f32 they encode (little-endian).
__device__ __forceinline__ float LoadUnalignedF32(const uint8_t* p) {
  return ::attnd::gpu::BitsToFloat(
      static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
      (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24));
}

// One tile's keys: rows and scales of keys [t0, t0 + kSimtBlockN), masked past `uhi`.
template <bool kPaged>
__device__ __forceinline__ void LocateTile(const IndexerProblem& p, const BlockWork& w, int64_t t0,
                                           int64_t uhi, SimtShared& s) {
  const int i = threadIdx.x;
  if (i >= kSimtBlockN) return;
  const int64_t n = t0 + i;
  const uint8_t* row = nullptr;
  const float* scale = nullptr;
  const bool valid = n < uhi && LocateKey<kPaged>(p, w.group, n, &row, &scale);
  s.key_row[i] = valid ? row : nullptr;
  // Paged scales sit at an offset of the caller's byte rows: no alignment is promised.
  s.scale[i] =
      !valid ? 0.0f : (kPaged ? LoadUnalignedF32(reinterpret_cast<const uint8_t*>(scale)) : *scale);
}

// Slab [d0, d0 + kSimtSlab) of the query block and of the key tile, decoded to f32.
__device__ __forceinline__ void StageSlab(const IndexerProblem& p, const BlockWork& w, int64_t d0,
                                          SimtShared& s) {
  const int columns = w.count * p.heads;
  const uint8_t* q_block = p.q + w.group * p.q_group_stride + w.first * p.q_row_stride + d0;
  // Four consecutive threads take four consecutive bytes of one column (coalesced reads).
#pragma unroll
  for (int it = 0; it < kSimtBlockM * kSimtSlab / kSimtThreads; ++it) {
    const int e = it * kSimtThreads + threadIdx.x;
    const int d = 4 * (e / (4 * kSimtBlockM)) + (e & 3);
    const int c = (e >> 2) & (kSimtBlockM - 1);
    float v = 0.0f;
    if (c < columns) {
      const int qi = c / p.heads, h = c - qi * p.heads;
      v = ::attnd::gpu::Fp8E4M3ToFloat(q_block[qi * p.q_row_stride + h * p.q_head_stride + d]);
    }
    s.u.slab.q[d][c] = v;
  }
#pragma unroll
  for (int it = 0; it < kSimtBlockN * kSimtSlab / kSimtThreads; ++it) {
    const int e = it * kSimtThreads + threadIdx.x;
    const int d = 4 * (e / (4 * kSimtBlockN)) + (e & 3);
    const int key = (e >> 2) & (kSimtBlockN - 1);
    const uint8_t* row = s.key_row[key];
    // The slab is one 16-byte piece of the key, 16·G bytes after the previous (problem.h).
    s.u.slab.k[d][key] =
        row != nullptr ? ::attnd::gpu::Fp8E4M3ToFloat(row[(d0 << p.key_tile_shift) + d]) : 0.0f;
  }
}

// Launch with sizeof(SimtShared) bytes of dynamic shared memory (< 48 KB: no opt-in needed).
template <bool kPaged>
__global__ void __launch_bounds__(kSimtThreads) IndexerSimtKernel(const IndexerProblem p) {
  extern __shared__ __align__(16) uint8_t smem[];
  SimtShared& s = *reinterpret_cast<SimtShared*>(smem);
  const BlockWork w = DecodeBlock</*kLongestFirst=*/!kPaged>(p);
  const int tid = threadIdx.x;
  if (tid < w.count) RowWindow<kPaged>(p, w.group, w.first + tid, &s.lo[tid], &s.hi[tid]);
  const int columns = w.count * p.heads;
  const int64_t row0 = w.group * p.rows_per_group + w.first;
  for (int c = tid; c < columns; c += kSimtThreads) {
    const int qi = c / p.heads;
    s.w[c] = p.weights[(row0 + qi) * p.weights_stride + (c - qi * p.heads)];
  }
  __syncthreads();
  int64_t ulo, uhi;
  WindowUnion(s.lo, s.hi, w.count, w.c0, w.c1, &ulo, &uhi);
  if (p.clean) FillOutsideUnion(p, w, ulo, uhi);
  if (ulo >= uhi) return;

  const int tk = tid / 16, tc = tid % 16;  // keys 4tk..4tk+3; columns 4tc.., 64 + 4tc..
  for (int64_t t0 = ulo; t0 < uhi; t0 += kSimtBlockN) {
    __syncthreads();  // the previous tile's head sums are done with s.u and s.key_row
    LocateTile<kPaged>(p, w, t0, uhi, s);
    float acc[4][8] = {};
    for (int64_t d0 = 0; d0 < p.dim; d0 += kSimtSlab) {
      __syncthreads();  // key rows located; the previous slab consumed
      StageSlab(p, w, d0, s);
      __syncthreads();
#pragma unroll
      for (int d = 0; d < kSimtSlab; ++d) {
        const float4 kv = *reinterpret_cast<const float4*>(&s.u.slab.k[d][4 * tk]);
        const float4 qa = *reinterpret_cast<const float4*>(&s.u.slab.q[d][4 * tc]);
        const float4 qb = *reinterpret_cast<const float4*>(&s.u.slab.q[d][64 + 4 * tc]);
        const float key[4] = {kv.x, kv.y, kv.z, kv.w};
        const float col[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(key[i], col[j], acc[i][j]);
        }
      }
    }
    __syncthreads();  // slabs consumed: s.u becomes the relu(S)·w tile
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = (j < 4 ? 4 * tc : 64 + 4 * tc) + (j & 3);
      if (c >= columns) continue;
      const float wc = s.w[c];
#pragma unroll
      for (int i = 0; i < 4; ++i) s.u.s[4 * tk + i][c] = fmaxf(acc[i][j], 0.0f) * wc;
    }
    __syncthreads();
    for (int o = tid; o < kSimtBlockN * w.count; o += kSimtThreads) {
      const int key = o % kSimtBlockN, qi = o / kSimtBlockN;
      const int64_t n = t0 + key;
      if (n >= uhi) continue;  // past the union: filled (or left) by FillOutsideUnion
      float* out = p.logits + (row0 + qi) * p.ld + n;
      if (s.key_row[key] != nullptr && n >= s.lo[qi] && n < s.hi[qi]) {
        const float* sk = s.u.s[key] + qi * p.heads;
        float sum = 0.0f;
        for (int h = 0; h < p.heads; ++h) sum += sk[h];
        *out = sum * s.scale[key];
      } else if (p.clean) {
        *out = kNegInf;
      }
    }
  }
}

}  // namespace attnd::kernels::indexer_logits::gpu
