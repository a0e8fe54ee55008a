// The vector fp8 decode of the CPU indexer kernels against the scalar table of kernels/common.
#include "kernels/indexer_logits/cpu_tile.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/fp8.h"

namespace attnd::kernels::indexer_logits {
namespace {

// All 256 codes (normals, subnormals, ±0, both NaNs), bit for bit.
TEST(DecodeFp8, EveryCodeMatchesScalarDecode) {
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
  std::vector<float> got(256);
  DecodeFp8(codes.data(), 256, got.data());
  for (int c = 0; c < 256; ++c) {
    const float want = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[c])) << "code " << c;
      continue;
    }
    uint32_t got_bits, want_bits;
    std::memcpy(&got_bits, &got[c], 4);
    std::memcpy(&want_bits, &want, 4);
    EXPECT_EQ(got_bits, want_bits) << "code " << c << ": got " << got[c] << " want " << want;
  }
}

// Lengths off the 8-wide step decode every element and write nothing past n.
TEST(DecodeFp8, TailsWriteExactlyN) {
  for (int64_t n : {0, 1, 7, 9, 13, 16}) {
    std::vector<uint8_t> codes(static_cast<size_t>(n) + 8);
    for (int64_t i = 0; i < n + 8; ++i) codes[i] = static_cast<uint8_t>(0x30 + 3 * i);
    std::vector<float> got(static_cast<size_t>(n) + 8, -7.0f);
    DecodeFp8(codes.data(), n, got.data());
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], Fp8E4M3ToFloat(codes[i])) << n << " " << i;
    for (int64_t i = n; i < n + 8; ++i) EXPECT_EQ(got[i], -7.0f) << "wrote past n=" << n;
  }
}

}  // namespace
}  // namespace attnd::kernels::indexer_logits
