// Exhaustive OCP fp8 e4m3fn conversion tests over all 2^8 encodings, against an independent
// decoding written from the format's definition in double precision.
#include "kernels/common/fp8.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace attnd::kernels {
namespace {

// Independent decoder: value = (-1)^s · 2^(e-7) · (1 + m/8), subnormal 2^-6 · m/8, S.1111.111 NaN.
double Decode(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(Fp8E4M3, DecodeMatchesDefinition) {
  for (int c = 0; c < 256; ++c) {
    const double want = Decode(c);
    const float got = Fp8E4M3ToFloat(static_cast<fp8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << c;
    }
  }
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8E4M3, EveryEncodingRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float f = Fp8E4M3ToFloat(static_cast<fp8_t>(c));
    const fp8_t back = FloatToFp8E4M3(f);
    if (std::isnan(f)) {
      EXPECT_EQ(back & 0x7f, 0x7f) << c;
      EXPECT_EQ(back & 0x80, c & 0x80) << c;
    } else {
      EXPECT_EQ(back, c) << c;
    }
  }
}

// Every midpoint between neighbouring finite magnitudes goes to the even code; points just
// off the midpoint go to the nearer one.
TEST(Fp8E4M3, RoundsToNearestEven) {
  for (int sign = 0; sign < 2; ++sign) {
    for (int c = 0; c < 0x7e; ++c) {
      const double lo = Decode(c), hi = Decode(c + 1);
      const double mid = (lo + hi) / 2;
      const double s = sign ? -1.0 : 1.0;
      const int sbit = sign ? 0x80 : 0;
      const int even = (c % 2 == 0) ? c : c + 1;
      EXPECT_EQ(FloatToFp8E4M3(static_cast<float>(s * mid)), sbit | even) << c;
      const float below = std::nextafter(static_cast<float>(mid), 0.0f);
      const float above = std::nextafter(static_cast<float>(mid), 1e9f);
      EXPECT_EQ(FloatToFp8E4M3(static_cast<float>(s * below)), sbit | c) << c;
      EXPECT_EQ(FloatToFp8E4M3(static_cast<float>(s * above)), sbit | (c + 1)) << c;
    }
  }
}

TEST(Fp8E4M3, SaturatesAndKeepsNaN) {
  EXPECT_EQ(FloatToFp8E4M3(448.0f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(464.0f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(1e6f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(INFINITY), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(-INFINITY), 0xfe);
  EXPECT_EQ(FloatToFp8E4M3(-1e30f), 0xfe);
  EXPECT_EQ(FloatToFp8E4M3(NAN), 0x7f);
  EXPECT_EQ(FloatToFp8E4M3(-NAN), 0xff);
  EXPECT_EQ(FloatToFp8E4M3(0.0f), 0x00);
  EXPECT_EQ(FloatToFp8E4M3(-0.0f), 0x80);
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -11)), 0x00) << "a quarter of the smallest subnormal";
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -10)), 0x00) << "half the smallest subnormal: even";
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.5f, -10)), 0x01);
}

}  // namespace
}  // namespace attnd::kernels
