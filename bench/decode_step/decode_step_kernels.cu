// The C++ decode-step frontend's small kernels (decode_step_kernels.h).
#include <cuda_bf16.h>

#include "bench/decode_step/decode_step_kernels.h"

namespace attnd::bench::decode_step {
namespace {

constexpr int kThreads = 256;

__device__ uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Roughly N(0, 1): the sum of four uniforms, centred and scaled.
__device__ float Normalish(uint64_t h) {
  float s = 0;
  for (int i = 0; i < 4; ++i) s += static_cast<float>((h >> (16 * i)) & 0xffff) * (1.0f / 65536);
  return (s - 2.0f) * 1.7320508f;
}

__device__ uint16_t Bf16Bits(float v) { return __bfloat16_as_ushort(__float2bfloat16(v)); }

__device__ float Bf16Value(uint16_t b) { return __bfloat162float(__ushort_as_bfloat16(b)); }

// An e4m3 code with exponent field <= 9 (|v| <= 7.5): never 0x7f / 0xff (NaN).
__device__ uint8_t Fp8Code(uint64_t h) {
  return static_cast<uint8_t>((h & 0x80) | ((h >> 8) % 0x50));
}

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

__global__ void FillBf16Kernel(uint16_t* p, int64_t n, float scale, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = Bf16Bits(Normalish(Mix(seed ^ Mix(i))) * scale);
}

__global__ void FillF32Kernel(float* p, int64_t n, float scale, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = Normalish(Mix(seed ^ Mix(i))) * scale;
}

__global__ void FillFp8Kernel(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = Fp8Code(Mix(seed ^ Mix(i)));
}

__global__ void FillValueKernel(uint16_t* p, int64_t n, uint16_t bits) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = bits;
}

__global__ void FillI32Kernel(int32_t* p, int64_t n, int32_t v) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = v;
}

// One thread per 4-byte word of a 656-byte row (164 words).
__global__ void FillKvKernel(uint8_t* kv, int64_t rows, uint64_t seed) {
  const int64_t words = rows * 164;
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < words;
       w += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = w / 164;
    const int k = static_cast<int>(w % 164);
    const uint64_t h = Mix(seed ^ Mix(w));
    uint32_t v;
    if (k < 128) {  // codes
      v = Fp8Code(h) | (Fp8Code(h >> 16) << 8) | (Fp8Code(h >> 32) << 16) |
          (static_cast<uint32_t>(Fp8Code(h >> 48)) << 24);
    } else if (k < 132) {  // scales 2^-9 .. 2^-5
      v = __float_as_uint(exp2f(-5.0f - static_cast<float>(h % 5)));
    } else {  // rope: two bf16
      v = Bf16Bits(Normalish(h)) | (static_cast<uint32_t>(Bf16Bits(Normalish(Mix(h)))) << 16);
    }
    reinterpret_cast<uint32_t*>(kv + row * 656)[k] = v;
  }
}

__global__ void FillIndexCacheKernel(uint8_t* cache, int64_t blocks, int64_t bs, int64_t dim,
                                     uint64_t seed) {
  const int64_t per_block = bs * (dim + 4);
  const int64_t n = blocks * per_block;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t in_block = i % per_block;
    const uint64_t h = Mix(seed ^ Mix(i));
    if (in_block < bs * dim) {
      cache[i] = Fp8Code(h);
    } else if ((in_block - bs * dim) % 4 == 0) {
      const float s = 0.5f + 1.5f * static_cast<float>(h & 0xffffff) / 16777216.0f;
      *reinterpret_cast<float*>(cache + i) = s;
    }
  }
}

__global__ void ProduceKernel(uint16_t* q, const uint16_t* q_base, const uint16_t* acc,
                              int64_t rows, int64_t d_qk, uint8_t* index_q,
                              const uint8_t* index_q_base, int64_t index_bytes) {
  const int64_t n = rows * d_qk;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n + index_bytes;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (i < n) {
      const int64_t r = i / d_qk, c = i % d_qk;
      float v = Bf16Value(q_base[i]);
      if (c < 512) v += Bf16Value(acc[r * 512 + c]) * (1.0f / 64);
      q[i] = Bf16Bits(v);
    } else {
      index_q[i - n] = index_q_base[i - n];
    }
  }
}

__global__ void ConsumeKernel(uint16_t* acc, const uint16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float a = Bf16Value(acc[i]);
    acc[i] = Bf16Bits(a + 0.5f * (Bf16Value(out[i]) - a));
  }
}

}  // namespace

void FillBf16(uint16_t* p, int64_t n, float scale, uint64_t seed, cudaStream_t stream) {
  FillBf16Kernel<<<Blocks(n), kThreads, 0, stream>>>(p, n, scale, seed);
}
void FillF32(float* p, int64_t n, float scale, uint64_t seed, cudaStream_t stream) {
  FillF32Kernel<<<Blocks(n), kThreads, 0, stream>>>(p, n, scale, seed);
}
void FillFp8(uint8_t* p, int64_t n, uint64_t seed, cudaStream_t stream) {
  FillFp8Kernel<<<Blocks(n), kThreads, 0, stream>>>(p, n, seed);
}
void FillValue(uint16_t* p, int64_t n, uint16_t bits, cudaStream_t stream) {
  FillValueKernel<<<Blocks(n), kThreads, 0, stream>>>(p, n, bits);
}
void FillI32(int32_t* p, int64_t n, int32_t v, cudaStream_t stream) {
  FillI32Kernel<<<Blocks(n), kThreads, 0, stream>>>(p, n, v);
}
void FillKvFp8(uint8_t* kv, int64_t rows, uint64_t seed, cudaStream_t stream) {
  FillKvKernel<<<Blocks(rows * 164), kThreads, 0, stream>>>(kv, rows, seed);
}
void FillIndexCache(uint8_t* cache, int64_t blocks, int64_t block_size, int64_t dim, uint64_t seed,
                    cudaStream_t stream) {
  FillIndexCacheKernel<<<Blocks(blocks * block_size * (dim + 4)), kThreads, 0, stream>>>(
      cache, blocks, block_size, dim, seed);
}
void Produce(uint16_t* q, const uint16_t* q_base, const uint16_t* acc, int64_t rows, int64_t d_qk,
             uint8_t* index_q, const uint8_t* index_q_base, int64_t index_bytes,
             cudaStream_t stream) {
  ProduceKernel<<<Blocks(rows * d_qk + index_bytes), kThreads, 0, stream>>>(
      q, q_base, acc, rows, d_qk, index_q, index_q_base, index_bytes);
}
void Consume(uint16_t* acc, const uint16_t* out, int64_t n, cudaStream_t stream) {
  ConsumeKernel<<<Blocks(n), kThreads, 0, stream>>>(acc, out, n);
}

}  // namespace attnd::bench::decode_step
