// Device building blocks shared by the SIMT and tensor-core indexer kernels (prefill and paged):
// which query block and key chunk a CTA owns, each row's window (clamped, never trusted), the
// union of the windows inside the chunk, the -inf fill outside it, and where a key lives.
// Portable CUDA/HIP. Host side: the split of the work into CTAs (ChooseSplit).
#pragma once

#include <stdint.h>

#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/indexer_logits/gpu/problem.h"

namespace attnd::kernels::indexer_logits::gpu {

// The rows and columns one CTA owns.
struct BlockWork {
  int64_t group;   // request (paged) or 0 (prefill)
  int64_t first;   // first row of the block within the group
  int count;       // rows in the block, >= 1
  int64_t c0, c1;  // key chunk [c0, c1), c1 <= num_cols
};

// kLongestFirst: query blocks in reverse order (under causal windows the last rows see the most
// keys, so they start first and the tail of the grid is short).
template <bool kLongestFirst>
__device__ __forceinline__ BlockWork DecodeBlock(const IndexerProblem& p) {
  const int64_t bid = blockIdx.x;
  int64_t qb = bid / p.num_chunks;
  const int64_t chunk = bid - qb * p.num_chunks;
  if (kLongestFirst) qb = p.num_groups * p.blocks_per_group - 1 - qb;
  BlockWork w;
  w.group = qb / p.blocks_per_group;
  w.first = (qb - w.group * p.blocks_per_group) * p.queries_per_block;
  const int64_t left = p.rows_per_group - w.first;
  w.count = static_cast<int>(left < p.queries_per_block ? left : p.queries_per_block);
  w.c0 = chunk * p.key_chunk;
  w.c1 = p.num_cols - w.c0 < p.key_chunk ? p.num_cols : w.c0 + p.key_chunk;
  return w;
}

__device__ __forceinline__ int64_t Clamp64(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// Row j of `group`: its window [*lo, *hi) within [0, num_cols), *lo == *hi when empty.
template <bool kPaged>
__device__ __forceinline__ void RowWindow(const IndexerProblem& p, int64_t group, int64_t j,
                                          int64_t* lo, int64_t* hi) {
  if (kPaged) {
    *lo = 0;
    if (p.context_per_token) {
      *hi = Clamp64(p.context_lens[group * p.context_stride + j], 0, p.visible_cap);
    } else {
      const int64_t context = p.context_lens[group * p.context_stride];
      *hi = Clamp64(context - p.rows_per_group + j + 1, 0, p.visible_cap);
    }
  } else {
    const int64_t s = p.ks[j * p.ks_stride], e = p.ke[j * p.ke_stride];
    *lo = Clamp64(s, 0, p.num_cols);
    *hi = Clamp64(e, *lo, p.num_cols);
  }
}

// The union [*ulo, *uhi) of the rows' windows inside [c0, c1); *ulo >= *uhi when none meets it.
__device__ __forceinline__ void WindowUnion(const int64_t* lo, const int64_t* hi, int count,
                                            int64_t c0, int64_t c1, int64_t* ulo, int64_t* uhi) {
  int64_t a_min = c1, e_max = c0;
  for (int i = 0; i < count; ++i) {
    const int64_t a = lo[i] > c0 ? lo[i] : c0;
    const int64_t e = hi[i] < c1 ? hi[i] : c1;
    if (a < e) {
      a_min = a < a_min ? a : a_min;
      e_max = e > e_max ? e : e_max;
    }
  }
  *ulo = a_min;
  *uhi = e_max;
}

// -inf on columns [c0, c1) minus [ulo, uhi) of the block's rows (all of [c0, c1) when the union
// is empty). Called by every thread of the CTA.
__device__ __forceinline__ void FillOutsideUnion(const IndexerProblem& p, const BlockWork& w,
                                                 int64_t ulo, int64_t uhi) {
  const int64_t row0 = w.group * p.rows_per_group + w.first;
  const int64_t cut_lo = ulo < uhi ? ulo : w.c1;  // [c0, cut_lo) and [cut_hi, c1) are filled
  const int64_t cut_hi = ulo < uhi ? uhi : w.c1;
  for (int i = 0; i < w.count; ++i) {
    float* row = p.logits + (row0 + i) * p.ld;
    for (int64_t c = w.c0 + threadIdx.x; c < cut_lo; c += blockDim.x) row[c] = kNegInf;
    for (int64_t c = cut_hi + threadIdx.x; c < w.c1; c += blockDim.x) row[c] = kNegInf;
  }
}

// Where key n of `group` lives: its fp8 row (the first 16-byte piece of it when paged keys come
// in tiles: IndexerProblem.key_tile_shift) and its f32 scale, or false (masked: a page id out
// of range; nothing may be read). Requires 0 <= n < the group's longest visible length, so only
// block-table entries below ceil(length / block_size) are read.
template <bool kPaged>
__device__ __forceinline__ bool LocateKey(const IndexerProblem& p, int64_t group, int64_t n,
                                          const uint8_t** row, const float** scale) {
  if (!kPaged) {
    *row = p.k + n * p.k_stride;
    *scale = p.k_scale + n;
    return true;
  }
  // n < 2^31 (context_lens are i32) and block_size >= 1 fit 32-bit division.
  const uint32_t block = static_cast<uint32_t>(n) / static_cast<uint32_t>(p.block_size);
  const int64_t slot = n - static_cast<int64_t>(block) * p.block_size;
  const int64_t page = p.block_table[group * p.table_stride + block];
  if (page < 0 || page >= p.num_pages) return false;
  const uint8_t* base = p.cache + page * p.cache_stride;
  // The key's first 16-byte piece (problem.h): slot·dim when G = 1.
  const int64_t tile_first = (slot >> p.key_tile_shift) << p.key_tile_shift;
  *row = base + tile_first * p.dim + (slot - tile_first) * 16;
  *scale =
      reinterpret_cast<const float*>(base + static_cast<int64_t>(p.block_size) * p.dim + 4 * slot);
  return true;
}

// Σ_h w·relu(s) of a thread's share of one wgmma accumulator tile (keys on M, (query, head)
// columns on N; both Hopper indexer kernels): acc[4j + 2·rr + e] is key row rr (0: lane/4,
// 1: + 8) and column 8j + 2·(lane % 4) + e, whose weight is wt[j][e]; columns 8j .. 8j + 7 are
// one query's heads, so query j / (kHeads / 8). Adds into part[rr][query] (zeroed by the caller).
template <int kHeads, int kGroups, int kQueries>
__device__ __forceinline__ void AddWeightedRelu(const float (&acc)[4 * kGroups],
                                                const float (&wt)[kGroups][2],
                                                float (&part)[2][kQueries]) {
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
    const int query = j / (kHeads / 8);
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      part[rr][query] = fmaf(wt[j][0], fmaxf(acc[4 * j + 2 * rr], 0.0f), part[rr][query]);
      part[rr][query] = fmaf(wt[j][1], fmaxf(acc[4 * j + 2 * rr + 1], 0.0f), part[rr][query]);
    }
  }
}

// Lane t of each group of four ends with Σ over the four lanes of v[t] (3 shuffles instead of
// the 8 of four separate reductions). lane_in_quad = lane % 4.
__device__ __forceinline__ float QuadTransposeSum(const float v[4], int lane_in_quad) {
  const bool upper = (lane_in_quad & 2) != 0;
  const float send0 = upper ? v[0] : v[2], send1 = upper ? v[1] : v[3];
  const float w0 = (upper ? v[2] : v[0]) + ::attnd::gpu::ShflXor(send0, 2);
  const float w1 = (upper ? v[3] : v[1]) + ::attnd::gpu::ShflXor(send1, 2);
  const bool odd = (lane_in_quad & 1) != 0;
  return (odd ? w1 : w0) + ::attnd::gpu::ShflXor(odd ? w0 : w1, 1);
}

}  // namespace attnd::kernels::indexer_logits::gpu
