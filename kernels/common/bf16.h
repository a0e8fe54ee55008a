// bfloat16 <-> float conversions (round-to-nearest-even; NaN stays a quiet NaN with its sign).
//   uint16_t b = FloatToBf16(x);  float y = Bf16ToFloat(b);
#pragma once

#include <cstdint>
#include <cstring>

namespace attnd::kernels {

using bf16_t = uint16_t;  // raw bits; arithmetic always happens in f32

inline float Bf16ToFloat(bf16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline bf16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force quiet
    return static_cast<bf16_t>((u >> 16) | 0x0040u);
  }
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // ties to even; overflow rounds to inf
  return static_cast<bf16_t>((u + rounding) >> 16);
}

}  // namespace attnd::kernels
