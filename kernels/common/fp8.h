// OCP fp8 e4m3fn <-> float conversions. Encoding rounds to nearest even and saturates finite
// overflow and ±inf to ±448 (PTX cvt.rn.satfinite semantics); NaN encodes as S.1111.111.
//   uint8_t c = FloatToFp8E4M3(x);  float y = Fp8E4M3ToFloat(c);
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace attnd::kernels {

using fp8_t = uint8_t;  // raw e4m3fn bits

inline constexpr float kFp8E4M3Max = 448.0f;

namespace internal {
struct Fp8DecodeTable {
  float value[256];
  constexpr Fp8DecodeTable() : value() {
    for (int c = 0; c < 256; ++c) {
      const int exponent = (c >> 3) & 0xf;
      const int mantissa = c & 0x7;
      float v = 0.0f;
      if (exponent == 0xf && mantissa == 0x7) {
        v = __builtin_nanf("");
      } else if (exponent == 0) {
        v = static_cast<float>(mantissa) / 512.0f;  // subnormal: m * 2^-9
      } else {
        float scale = 1.0f;
        for (int e = exponent; e > 7; --e) scale *= 2.0f;
        for (int e = exponent; e < 7; ++e) scale *= 0.5f;
        v = (1.0f + static_cast<float>(mantissa) / 8.0f) * scale;
      }
      value[c] = (c & 0x80) ? -v : v;
    }
  }
};
inline constexpr Fp8DecodeTable kFp8DecodeTable{};
}  // namespace internal

inline float Fp8E4M3ToFloat(fp8_t c) { return internal::kFp8DecodeTable.value[c]; }

inline fp8_t FloatToFp8E4M3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;   // NaN
  if (a >= 0x43e00000u) return sign | 0x7e;  // >= 448 (inf included): saturate
  if (a >= 0x3c800000u) {                    // >= 2^-6: normal range of e4m3
    const uint32_t rounded = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;  // keep 3 mantissa bits
    return sign | static_cast<uint8_t>(rounded - ((127u - 7u) << 3));
  }
  // Subnormal range: multiples of 2^-9, round to nearest even (8 becomes the smallest normal).
  float magnitude;
  std::memcpy(&magnitude, &a, sizeof magnitude);
  return sign | static_cast<uint8_t>(std::nearbyint(magnitude * 512.0f));
}

}  // namespace attnd::kernels
