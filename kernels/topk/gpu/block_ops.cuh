// Warp and block building blocks of the SIMT top-k, portable CUDA/HIP (warp size from
// ::attnd::gpu::WarpSize(): 32 on NVIDIA, 64 on CDNA): ballots, lane masks, sums, a block-wide
// exclusive sum and a warp-aggregated shared-memory histogram increment. Blocks are
// one-dimensional.
//   const uint32_t before = BlockExclusiveSum<kThreads>(mine, scratch, &total);
#pragma once

#include <stdint.h>

#include "kernels/common/gpu/vendor.h"

namespace attnd::kernels::topk::gpu {

// One bit per lane of a warp.
#if defined(ATTND_GPU_HIP)
using LaneMask = unsigned long long;
#else
using LaneMask = unsigned int;
#endif
static_assert(sizeof(LaneMask) * 8 >= ::attnd::gpu::WarpSize(), "a lane mask must hold every lane");

__device__ __forceinline__ int LaneId() {
  return static_cast<int>(threadIdx.x) % ::attnd::gpu::WarpSize();
}
__device__ __forceinline__ int WarpId() {
  return static_cast<int>(threadIdx.x) / ::attnd::gpu::WarpSize();
}

// The lanes whose predicate is true. Every lane of the warp must call it.
__device__ __forceinline__ LaneMask Ballot(bool pred) {
#if defined(ATTND_GPU_HIP)
  return __ballot(pred);
#else
  return __ballot_sync(0xffffffffu, pred);
#endif
}

__device__ __forceinline__ uint32_t PopCount(LaneMask m) {
#if defined(ATTND_GPU_HIP)
  return static_cast<uint32_t>(__popcll(m));
#else
  return static_cast<uint32_t>(__popc(m));
#endif
}

// The lowest set lane of a non-empty mask.
__device__ __forceinline__ int LowestLane(LaneMask m) {
#if defined(ATTND_GPU_HIP)
  return __ffsll(static_cast<long long>(m)) - 1;
#else
  return __ffs(static_cast<int>(m)) - 1;
#endif
}

// Lanes strictly below `lane` (lane < WarpSize(), so the shift is defined).
__device__ __forceinline__ LaneMask LanesBelow(int lane) {
  return (LaneMask{1} << lane) - LaneMask{1};
}

// Inclusive prefix sum over the lanes of a warp. Every lane must call it.
__device__ __forceinline__ uint32_t WarpInclusiveSum(uint32_t v) {
  const int lane = LaneId();
#pragma unroll
  for (int offset = 1; offset < ::attnd::gpu::WarpSize(); offset <<= 1) {
    const uint32_t lower = ::attnd::gpu::Shfl(v, lane >= offset ? lane - offset : lane);
    if (lane >= offset) v += lower;
  }
  return v;
}

// Exclusive prefix sum of `v` over the threads of the block in thread order; *total receives the
// block's sum. `scratch` is shared memory of kThreads / WarpSize() words. Every thread must call
// it; it synchronises the block (also before touching scratch, so back-to-back calls are safe).
template <int kThreads>
__device__ __forceinline__ uint32_t BlockExclusiveSum(uint32_t v, uint32_t* scratch,
                                                      uint32_t* total) {
  constexpr int kWarps = kThreads / ::attnd::gpu::WarpSize();
  static_assert(kThreads % ::attnd::gpu::WarpSize() == 0 && kWarps <= ::attnd::gpu::WarpSize(),
                "one warp scans the warp totals");
  const int lane = LaneId();
  const int warp = WarpId();
  const uint32_t inclusive = WarpInclusiveSum(v);
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == ::attnd::gpu::WarpSize() - 1) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const uint32_t warp_total = lane < kWarps ? scratch[lane] : 0u;
    const uint32_t warp_inclusive = WarpInclusiveSum(warp_total);
    if (lane < kWarps) scratch[lane] = warp_inclusive;
  }
  __syncthreads();
  *total = scratch[kWarps - 1];
  const uint32_t warp_offset = warp > 0 ? scratch[warp - 1] : 0u;
  return warp_offset + inclusive - v;
}

// Adds one to hist[bin] for every lane with bin >= 0. On CUDA the lanes of a warp that share a
// bin add together (one shared atomic per distinct bin: hot bins do not serialise). Every lane of
// the warp must call it.
__device__ __forceinline__ void HistogramAdd(uint32_t* hist, int bin) {
#if defined(ATTND_GPU_CUDA)
  if (!__any_sync(0xffffffffu, bin >= 0)) return;  // filtered passes: most warps count nothing
  const unsigned peers = __match_any_sync(0xffffffffu, bin);
  if (bin >= 0 && LaneId() == __ffs(static_cast<int>(peers)) - 1) {
    atomicAdd(&hist[bin], static_cast<uint32_t>(__popc(peers)));
  }
#else
  if (bin >= 0) atomicAdd(&hist[bin], 1u);
#endif
}

}  // namespace attnd::kernels::topk::gpu
