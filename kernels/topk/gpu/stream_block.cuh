// Warp, block and cluster building blocks of the streaming top-k (stream.cu, CUDA): a block-wide
// exclusive scan of a few 32-bit words with double-buffered shared scratch (one barrier per
// scan), and the thread-block-cluster barrier and DSMEM address mapping (sm_90; a one-CTA cluster
// elsewhere). Blocks are one-dimensional.
//   uint32_t excl[1], total[1];  BlockExclusiveScan<256, 1>(v, excl, total, slots.Next());
#pragma once

#include <stdint.h>

#include "kernels/common/gpu/cluster.cuh"
#include "kernels/common/gpu/vendor.h"

namespace attnd::kernels::topk::gpu {

inline constexpr int kLanes = ::attnd::gpu::WarpSize();
inline constexpr unsigned kFullMask = 0xffffffffu;
static_assert(kLanes == 32, "the streaming top-k is CUDA-only: 32-lane warps");

__device__ __forceinline__ int LaneOf() { return static_cast<int>(threadIdx.x) % kLanes; }
__device__ __forceinline__ int WarpOf() { return static_cast<int>(threadIdx.x) / kLanes; }

// Inclusive prefix sum over the first kUsed lanes of the warp (log2(kUsed) steps; lanes past
// kUsed get partial sums). Every lane must call it.
template <int kUsed = kLanes>
__device__ __forceinline__ uint32_t WarpInclusiveSum(uint32_t v) {
  static_assert(kUsed >= 1 && kUsed <= kLanes, "at most a warp");
  const int lane = LaneOf();
#pragma unroll
  for (int offset = 1; offset < kUsed; offset <<= 1) {
    const uint32_t lower = __shfl_up_sync(kFullMask, v, offset);
    if (lane >= offset) v += lower;
  }
  return v;
}

// Scratch words one scan needs per warp and word; ScanSlots hands out two alternating halves so a
// scan's readers never race the next scan's writers (each scan has one barrier between them).
template <int kThreads, int kWords>
struct ScanShape {
  static constexpr int kWarps = kThreads / kLanes;
  static constexpr int kSlotWords = kWarps * kWords;
};

struct ScanSlots {
  uint32_t* base;  // 2 * slot_words words of shared memory
  int slot_words;
  int phase;
  __device__ uint32_t* Next() {
    phase ^= 1;
    return base + phase * slot_words;
  }
};

// Exclusive prefix sums of kWords words over the block's threads in thread order, and their
// totals. 32-bit adds: callers pack several counts per word only where no field can carry.
// Every thread must call it (one __syncthreads inside); `slot` holds kWarps * kWords words and
// must not be the slot of the previous scan.
template <int kThreads, int kWords>
__device__ __forceinline__ void BlockExclusiveScan(const uint32_t (&v)[kWords],
                                                   uint32_t (&excl)[kWords],
                                                   uint32_t (&total)[kWords], uint32_t* slot) {
  constexpr int kWarps = ScanShape<kThreads, kWords>::kWarps;
  static_assert(kThreads % kLanes == 0, "whole warps");
  const int lane = LaneOf();
  const int warp = WarpOf();
  uint32_t incl[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) incl[i] = WarpInclusiveSum(v[i]);
  if (lane == kLanes - 1) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) slot[warp * kWords + i] = incl[i];
  }
  __syncthreads();
  // Every warp scans the warp totals itself (lane w holds warp w's): no second barrier.
  static_assert(kWarps <= kLanes, "one warp scans the warp totals");
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    const uint32_t mine = lane < kWarps ? slot[lane * kWords + i] : 0u;
    const uint32_t upto = WarpInclusiveSum<kWarps>(mine);
    const uint32_t before = __shfl_sync(kFullMask, upto - mine, warp);
    total[i] = __shfl_sync(kFullMask, upto, kWarps - 1);
    excl[i] = before + incl[i] - v[i];
  }
}

// The chunk scan of AppendChunk: kFields (<= 4) counts per thread, each <= 4, in thread order,
// packed one per byte (a warp's byte sums stay <= 128: no carry). Gives each field's exclusive
// prefix over the block (fields in order: field f's prefix includes every thread's fields < f) and
// the block's total. One barrier; `slot` holds kWarps words, not the previous scan's.
template <int kThreads, int kFields>
__device__ __forceinline__ void BlockFieldScan(uint32_t packed, uint32_t (&start)[kFields],
                                               uint32_t* total, uint32_t* slot) {
  constexpr int kWarps = kThreads / kLanes;
  static_assert(kFields >= 1 && kFields <= 4 && kWarps <= kLanes, "byte fields, one warp scans");
  const int lane = LaneOf();
  const int warp = WarpOf();
  const uint32_t incl = WarpInclusiveSum(packed);
  if (lane == kLanes - 1) slot[warp] = incl;
  __syncthreads();
  // Warp totals: fields 0 and 2 in the 16-bit halves of `even`, 1 and 3 in `odd` (sums <= 2^16).
  const uint32_t mine = lane < kWarps ? slot[lane] : 0u;
  const uint32_t even = mine & 0x00ff00ffu, odd = (mine >> 8) & 0x00ff00ffu;
  const uint32_t even_upto = WarpInclusiveSum<kWarps>(even);
  const uint32_t odd_upto = WarpInclusiveSum<kWarps>(odd);
  const uint32_t even_before = __shfl_sync(kFullMask, even_upto - even, warp);
  const uint32_t odd_before = __shfl_sync(kFullMask, odd_upto - odd, warp);
  const uint32_t even_total = __shfl_sync(kFullMask, even_upto, kWarps - 1);
  const uint32_t odd_total = __shfl_sync(kFullMask, odd_upto, kWarps - 1);
  const uint32_t in_warp = incl - packed;
  uint32_t base = 0;
#pragma unroll
  for (int f = 0; f < kFields; ++f) {
    const int half = 16 * (f / 2);
    const uint32_t before = (((f % 2) ? odd_before : even_before) >> half) & 0xffffu;
    const uint32_t field_total = (((f % 2) ? odd_total : even_total) >> half) & 0xffffu;
    start[f] = base + before + ((in_warp >> (8 * f)) & 0xffu);
    base += field_total;
  }
  *total = base;
}

// Thread-block clusters: kernels/common/gpu/cluster.cuh.
using ::attnd::gpu::ClusterSync;
using ::attnd::gpu::MapToRank;

}  // namespace attnd::kernels::topk::gpu
