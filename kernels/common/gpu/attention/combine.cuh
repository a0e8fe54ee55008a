// The split-K combine of one output row, written once (portable CUDA/HIP): the merge that
// mla_decode's combine (kernels/mla_decode/gpu/combine.cu) and sparse MLA's
// (kernels/sparse_mla/gpu/combine.cu) run for each (query row, head) row; the kernels differ
// only in which rows a block takes and where the output goes (docs/KERNELS.md "Split-K and the
// combine").
//
// Split s left O_s (already divided by its own sum) and lse_s in log2 units (-inf: it saw
// nothing; its O_s was never written and is not read). With M = max_s lse_s and
// w_s = exp2(lse_s - M): out = sum_s w_s·O_s / sum_s w_s, lse = (M + log2 sum_s w_s)·ln 2; every
// split empty gives sum 0 (out 0, lse -inf, written by the caller). Built for latency (decode at
// small batch runs few rows over many splits): thread s loads lse_s, so every split's LSE is one
// load in flight at once; the weights go through shared memory, and the partial rows are read
// kLoadBatch splits at a time with no load waiting on another.
//   __shared__ float weight_s[kMaxSplits], red_s[2][kThreads / 32];
//   __shared__ uint32_t live_s[4];
//   float acc[4], sum, max_lse;  // this thread's 4 columns of the row, Σ w_s, M
//   SplitCombineRow<kThreads, kDimV, kLoadBatch, kMaxSplits>(partial_lse, partial_o, at0,
//       split_rows, splits, weight_s, red_s, live_s, acc, &sum, &max_lse);
// Split s of the row is partial row at0 + s·split_rows (its O at that row · kDimV); thread i
// owns columns 4i..4i+3. The caller runs __syncthreads() before the next row reuses the arrays.
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/attention.cuh"
#include "kernels/common/gpu/vendor.h"

namespace attnd::kernels {

// The value of every 32-lane group reduced over the block of kThreads threads (max or sum),
// through red_s[kThreads / 32].
template <int kThreads, bool kMax>
__device__ __forceinline__ float SplitCombineBlockReduce(float v, float* red_s) {
  constexpr int kGroups = kThreads / 32;  // 32-lane groups (a warp, or half a HIP wave64)
  v = kMax ? GroupMax<32>(v) : GroupSum<32>(v);
  if (threadIdx.x % 32 == 0) red_s[threadIdx.x / 32] = v;
  __syncthreads();
  v = red_s[0];
#pragma unroll
  for (int g = 1; g < kGroups; ++g) v = kMax ? fmaxf(v, red_s[g]) : v + red_s[g];
  return v;
}

template <int kThreads, int kDimV, int kLoadBatch, int kMaxSplits>
__device__ __forceinline__ void SplitCombineRow(const float* partial_lse, const float* partial_o,
                                                int64_t at0, int64_t split_rows, int32_t splits,
                                                float* weight_s, float (*red_s)[kThreads / 32],
                                                uint32_t* live_s, float (&acc)[4], float* sum_out,
                                                float* max_out) {
  static_assert(kDimV == 4 * kThreads, "one float4 of the row per thread");
  static_assert(kMaxSplits <= kThreads, "one split's LSE per thread");
  static_assert(kMaxSplits <= 128 && kLoadBatch <= 32, "live bits in two 64-bit words");
  const int tid = threadIdx.x;
  const int col = tid * 4;
  if (tid < 4) live_s[tid] = 0;  // published by the reductions' barriers
  // Thread s holds lse_s; the row max M (-inf when every split is empty).
  const float lse = tid < splits ? partial_lse[at0 + tid * split_rows] : -INFINITY;
  const float max_lse = SplitCombineBlockReduce<kThreads, true>(lse, red_s[0]);
  const float w = max_lse == -INFINITY || lse == -INFINITY ? 0.0f : exp2f(lse - max_lse);
  if (tid < splits) {
    weight_s[tid] = w;
    if (w != 0.0f) atomicOr(&live_s[tid / 32], 1u << (tid % 32));
  }
  // Its barrier publishes weight_s and live_s.
  const float sum = SplitCombineBlockReduce<kThreads, false>(w, red_s[1]);
  // Σ w_s·O_s over the splits with w_s != 0 (empty ones are never read). Which splits to read
  // comes from registers (the live bits, shifted down kLoadBatch per step), so that no load
  // waits on a shared-memory read and all kLoadBatch are issued before the first use.
  uint64_t live_lo = live_s[0] | static_cast<uint64_t>(live_s[1]) << 32;
  uint64_t live_hi = live_s[2] | static_cast<uint64_t>(live_s[3]) << 32;
  acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
  const float* o_row = partial_o + at0 * kDimV + col;
  for (int s0 = 0; s0 < splits; s0 += kLoadBatch) {
    const uint32_t bits = static_cast<uint32_t>(live_lo) & ((1u << kLoadBatch) - 1);
    live_lo = live_lo >> kLoadBatch | live_hi << (64 - kLoadBatch);
    live_hi >>= kLoadBatch;
    float4 o[kLoadBatch];
#pragma unroll
    for (int i = 0; i < kLoadBatch; ++i) {
      o[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if ((bits >> i) & 1u) {
        o[i] = *reinterpret_cast<const float4*>(o_row + (s0 + i) * split_rows * kDimV);
      }
    }
#pragma unroll
    for (int i = 0; i < kLoadBatch; ++i) {
      const float ws = (bits >> i) & 1u ? weight_s[s0 + i] : 0.0f;
      acc[0] = fmaf(ws, o[i].x, acc[0]);
      acc[1] = fmaf(ws, o[i].y, acc[1]);
      acc[2] = fmaf(ws, o[i].z, acc[2]);
      acc[3] = fmaf(ws, o[i].w, acc[3]);
    }
  }
  *sum_out = sum;
  *max_out = max_lse;
}

}  // namespace attnd::kernels
