// The GPU vendor layer, safe to include from .cu/.hip files (no Abseil): the vendor runtime
// (vendors/cuda.h or vendors/hip.h, chosen by ATTND_GPU_CUDA / ATTND_GPU_HIP) behind gpu::
// wrappers, and hardware facts as constexpr functions. Host code uses runtime.h on top.
#pragma once

#if defined(ATTND_GPU_CUDA)
#include "kernels/common/gpu/vendors/cuda.h"
#elif defined(ATTND_GPU_HIP)
#include "kernels/common/gpu/vendors/hip.h"
#else
#error "kernels/common/gpu/vendor.h needs ATTND_GPU_CUDA or ATTND_GPU_HIP"
#endif

namespace attnd::gpu {

// Threads per warp (wavefront) of the target being compiled: 32 on NVIDIA, 64 on CDNA (gfx9).
// Device code must use this, never a literal.
__host__ __device__ constexpr int WarpSize() {
#if defined(ATTND_GPU_HIP) && defined(__AMDGCN_WAVEFRONT_SIZE)
  return __AMDGCN_WAVEFRONT_SIZE;
#elif defined(ATTND_GPU_HIP)
  return 64;
#else
  return 32;
#endif
}

// Butterfly exchange within a warp (all lanes participate).
template <class T>
__device__ __forceinline__ T ShflXor(T v, int lane_mask) {
#if defined(ATTND_GPU_HIP)
  return __shfl_xor(v, lane_mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#endif
}

// Value of lane `src` within the warp (all lanes participate).
template <class T>
__device__ __forceinline__ T Shfl(T v, int src) {
#if defined(ATTND_GPU_HIP)
  return __shfl(v, src);
#else
  return __shfl_sync(0xffffffffu, v, src);
#endif
}

}  // namespace attnd::gpu
