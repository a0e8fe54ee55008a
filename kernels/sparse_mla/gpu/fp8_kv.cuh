// FP8 KV cache rows (params.h kFp8Row*) on the GPU, for the sparse MLA kernels that gather them
// into their bf16 shared-memory tiles: 16 e4m3 codes (one 16-byte load) times their column
// tile's f32 scale become 16 bf16 values (two 16-byte chunks). Portable CUDA/HIP; sm_89+ decodes
// with the hardware e4m3x2 -> f16x2 conversion, elsewhere with ::attnd::gpu::Fp8E4M3ToFloat; both
// exact.
//   uint4 lo, hi;  DequantFp8x16(codes, scale, &lo, &hi);
// Numerics: e4m3 × scale is formed in f32 and rounded to bf16 (nearest even) once. That is exact
// when the scale is a power of two (the quantisers of FlashMLA and vLLM write such scales);
// otherwise each K/V value carries one bf16 rounding (relative 2^-8). NaN codes are not valid
// input (no quantiser emits them).
#pragma once

#include <stdint.h>

#include "kernels/common/gpu/convert.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/sparse_mla/params.h"

namespace attnd::kernels::sparse_mla::gpu {

// 16-byte chunks of an FP8 row: 32 of codes, then the scales, then 8 of bf16 rope.
inline constexpr int kFp8CodeChunks = static_cast<int>(kDimV / 16);
inline constexpr int kFp8ScaleChunk = static_cast<int>(kFp8ScaleOffset / 16);
inline constexpr int kFp8RopeChunk0 = static_cast<int>(kFp8RopeOffset / 16);
inline constexpr int kFp8RopeChunks = static_cast<int>((kFp8DimQk - kDimV) * 2 / 16);
inline constexpr int kFp8CodeChunksPerScale = static_cast<int>(kFp8ScaleCols / 16);
static_assert(kFp8ScaleOffset % 16 == 0 && kFp8RopeOffset % 16 == 0, "16-byte row sections");

// The four e4m3 codes of `codes` (byte i = code i) as exact f32 values.
__device__ __forceinline__ void DecodeE4m3x4(uint32_t codes, float (&v)[4]) {
#if defined(ATTND_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // Every e4m3fn value (subnormals included) is an f16 normal or zero: both steps are exact.
  asm("{\n"
      " .reg .b16 c01, c23, x0, x1, x2, x3;\n"
      " .reg .b32 h01, h23;\n"
      " mov.b32 {c01, c23}, %4;\n"
      " cvt.rn.f16x2.e4m3x2 h01, c01;\n"
      " cvt.rn.f16x2.e4m3x2 h23, c23;\n"
      " mov.b32 {x0, x1}, h01;\n"
      " mov.b32 {x2, x3}, h23;\n"
      " cvt.f32.f16 %0, x0;\n"
      " cvt.f32.f16 %1, x1;\n"
      " cvt.f32.f16 %2, x2;\n"
      " cvt.f32.f16 %3, x3;\n"
      "}\n"
      : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
      : "r"(codes));
#else
#pragma unroll
  for (int i = 0; i < 4; ++i)
    v[i] = ::attnd::gpu::Fp8E4M3ToFloat(static_cast<uint8_t>(codes >> (8 * i)));
#endif
}

// Two floats as bf16x2 (round to nearest even): `lo` in bits 0..15.
__device__ __forceinline__ uint32_t PackBf16Pair(float lo, float hi) {
#if defined(ATTND_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint32_t>(::attnd::gpu::FloatToBf16(lo)) |
         (static_cast<uint32_t>(::attnd::gpu::FloatToBf16(hi)) << 16);
#endif
}

// Four codes × scale as two bf16x2 words.
__device__ __forceinline__ void DequantFp8x4(uint32_t codes, float scale, uint32_t* w01,
                                             uint32_t* w23) {
  float v[4];
  DecodeE4m3x4(codes, v);
  *w01 = PackBf16Pair(v[0] * scale, v[1] * scale);
  *w23 = PackBf16Pair(v[2] * scale, v[3] * scale);
}

// One 16-byte chunk of codes × scale: columns 0..7 to *lo, 8..15 to *hi (bf16).
__device__ __forceinline__ void DequantFp8x16(const uint4& codes, float scale, uint4* lo,
                                              uint4* hi) {
  DequantFp8x4(codes.x, scale, &lo->x, &lo->y);
  DequantFp8x4(codes.y, scale, &lo->z, &lo->w);
  DequantFp8x4(codes.z, scale, &hi->x, &hi->y);
  DequantFp8x4(codes.w, scale, &hi->z, &hi->w);
}

// Scale j of an FP8 row's scale chunk (j in 0..3).
__device__ __forceinline__ float Fp8Scale(const uint4& scales, int j) {
  const uint32_t w = j == 0 ? scales.x : j == 1 ? scales.y : j == 2 ? scales.z : scales.w;
  return ::attnd::gpu::BitsToFloat(w);
}

}  // namespace attnd::kernels::sparse_mla::gpu
