// Exhaustive bf16 conversion tests over all 2^16 encodings.
#include "kernels/common/bf16.h"

#include <cmath>
#include <cstring>

#include "gtest/gtest.h"

namespace attnd::kernels {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Bf16, EveryEncodingRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = Bf16ToFloat(static_cast<bf16_t>(b));
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    EXPECT_EQ(bits, b << 16) << "decode is exact " << b;
    const bf16_t back = FloatToBf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(back))) << b;
      EXPECT_EQ(back & 0x8000, b & 0x8000) << "NaN keeps its sign " << b;
    } else {
      EXPECT_EQ(back, b) << b;
    }
  }
}

// Between each pair of neighbouring encodings: just below the midpoint rounds down, just above
// rounds up, and the exact midpoint goes to the even encoding.
TEST(Bf16, RoundsToNearestEven) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint32_t exp = (b >> 7) & 0xff;
    if (exp == 0xff) continue;             // inf/NaN
    if ((b & 0x7fff) == 0x7f7f) continue;  // largest finite: next is inf (checked below)
    const uint32_t lo = b << 16;
    const uint32_t mid = lo | 0x8000u;
    const uint32_t next = b + 1;
    EXPECT_EQ(FloatToBf16(FromBits(mid - 1)), b) << b;
    EXPECT_EQ(FloatToBf16(FromBits(mid + 1)), next) << b;
    EXPECT_EQ(FloatToBf16(FromBits(mid)), (b & 1) ? next : b) << b;
    EXPECT_EQ(FloatToBf16(FromBits(lo | 0x1234u)), b) << b;
  }
}

TEST(Bf16, SpecialValues) {
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(FloatToBf16(-INFINITY), 0xff80);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7fffffu)), 0x7f80) << "FLT_MAX rounds to inf";
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(0x7f800001u))))) << "sNaN stays NaN";
  EXPECT_EQ(FloatToBf16(FromBits(0x00000001u)), 0x0000) << "tiny denormal rounds to zero";
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
}

}  // namespace
}  // namespace attnd::kernels
