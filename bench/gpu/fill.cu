// Device-side random fills for the GPU benchmarks (a counter-based hash; no cuRAND dependency).
#include <stdint.h>

#include "bench/gpu/fill.h"
#include "kernels/common/gpu/convert.cuh"

namespace attnd::bench {
namespace {

__device__ __forceinline__ uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Sum of four uniforms, centred: roughly normal with unit variance.
__device__ __forceinline__ float RoughNormal(uint64_t seed, int64_t i) {
  float s = 0.f;
  for (int j = 0; j < 4; ++j)
    s += Hash(seed + 4 * static_cast<uint64_t>(i) + j) * (1.0f / 4294967296.0f);
  return (s - 2.0f) * 1.7320508f;
}

__global__ void FillKernel(void* out, int dtype, int64_t n, float scale, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = RoughNormal(seed, i) * scale;
    switch (dtype) {
      case 1: static_cast<float*>(out)[i] = v; break;
      case 2: static_cast<uint16_t*>(out)[i] = gpu::FloatToBf16(v); break;
      default: {
        // fp8 e4m3: a random finite non-NaN code with a magnitude around `scale`.
        uint32_t h = Hash(seed ^ (0x9e3779b97f4a7c15ull * (i + 1)));
        uint8_t code = static_cast<uint8_t>(h & 0xff);
        if ((code & 0x7f) == 0x7f) code ^= 0x01;
        static_cast<uint8_t*>(out)[i] = code;
      }
    }
  }
}

__global__ void FillIntKernel(int32_t* out, int64_t n, int32_t lo, uint32_t span, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = lo + static_cast<int32_t>(span == 0 ? 0 : Hash(seed + i) % span);
  }
}

__global__ void FillRows32Kernel(char* base, int64_t pitch, int64_t words, int64_t rows,
                                 uint32_t value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < words * rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    reinterpret_cast<uint32_t*>(base + (i / words) * pitch)[i % words] = value;
  }
}

}  // namespace

gpu::Error LaunchFillRows32(void* base, int64_t pitch, int64_t words, int64_t rows, uint32_t value,
                            gpu::Stream stream) {
  FillRows32Kernel<<<1024, 256, 0, stream>>>(static_cast<char*>(base), pitch, words, rows, value);
  return gpu::GetLastError();
}

gpu::Error LaunchFill(void* out, int dtype, int64_t n, float scale, uint64_t seed,
                      gpu::Stream stream) {
  FillKernel<<<1024, 256, 0, stream>>>(out, dtype, n, scale, seed);
  return gpu::GetLastError();
}

gpu::Error LaunchFillInt(int32_t* out, int64_t n, int32_t lo, int32_t hi, uint64_t seed,
                         gpu::Stream stream) {
  FillIntKernel<<<1024, 256, 0, stream>>>(out, n, lo, static_cast<uint32_t>(hi - lo + 1), seed);
  return gpu::GetLastError();
}

}  // namespace attnd::bench
