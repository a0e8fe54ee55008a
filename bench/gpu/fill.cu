// Device-side random fills for the GPU benchmarks (a counter-based hash; no cuRAND dependency).
#include <stdint.h>

#include "bench/gpu/fill.h"
#include "kernels/common/gpu/convert.cuh"
#include "kernels/sparse_mla/params.h"

namespace attnd::bench {
namespace {

namespace sparse_mla = kernels::sparse_mla;

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

constexpr int64_t kFp8TailWords = (sparse_mla::kFp8RowBytes - sparse_mla::kFp8ScaleOffset) / 4;
constexpr int64_t kFp8ScaleWords = (sparse_mla::kFp8RopeOffset - sparse_mla::kFp8ScaleOffset) / 4;
static_assert(sparse_mla::kFp8RowBytes % 4 == 0 && sparse_mla::kFp8ScaleOffset % 4 == 0,
              "32-bit words");

__global__ void Fp8MlaRowTailsKernel(char* kv, int64_t rows, bool f32_scales) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < rows * kFp8TailWords; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = i % kFp8TailWords;
    uint32_t* tail = reinterpret_cast<uint32_t*>(
        kv + (i / kFp8TailWords) * sparse_mla::kFp8RowBytes + sparse_mla::kFp8ScaleOffset);
    tail[w] = w < kFp8ScaleWords && !f32_scales ? 0x3c000000u : 0x3c3c3c3cu;
  }
}

}  // namespace

gpu::Error LaunchFp8MlaRowTails(void* kv, int64_t rows, bool f32_scales, gpu::Stream stream) {
  Fp8MlaRowTailsKernel<<<1024, 256, 0, stream>>>(static_cast<char*>(kv), rows, f32_scales);
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
