// Device-side element conversions shared by every GPU kernel, bit-identical to the host ones in
// kernels/common/bf16.h and fp8.h: bf16 <-> f32 (round-to-nearest-even, NaN kept), fp8 e4m3fn ->
// f32 (exact), f32 -> fp8 (RNE, saturating). Portable CUDA/HIP (integer and float ops only).
//   float x = gpu::Bf16ToFloat(row[i]);  out[i] = gpu::FloatToBf16(acc);
#pragma once

#include <stdint.h>

#include "kernels/common/gpu/vendor.h"

namespace attnd::gpu {

__host__ __device__ __forceinline__ float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
#endif
}

__host__ __device__ __forceinline__ uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
#endif
}

__host__ __device__ __forceinline__ float Bf16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

__host__ __device__ __forceinline__ uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// e4m3fn: S.EEEE.MMM, bias 7, subnormals at E = 0, S.1111.111 NaN, no infinities.
__host__ __device__ __forceinline__ float Fp8E4M3ToFloat(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80) << 24;
  const uint32_t exponent = (c >> 3) & 0xf;
  const uint32_t mantissa = c & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return BitsToFloat(sign | 0x7fc00000u);
  if (exponent == 0) {
    // m · 2^-9, exact in f32.
    return BitsToFloat(sign | FloatToBits(static_cast<float>(mantissa) * 0.001953125f));
  }
  return BitsToFloat(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

}  // namespace attnd::gpu
