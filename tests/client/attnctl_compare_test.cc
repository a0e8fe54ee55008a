// attnctl's output checks (client/attnctl/compare.h): they are what makes `attnctl run` fail on a
// wrong reply, so each failure mode is exercised here.
#include "client/attnctl/compare.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "client/tensor_codec.h"
#include "gtest/gtest.h"
#include "kernels/common/bf16.h"

namespace attnd::attnctl {
namespace {

using client::HostArray;
using kernels::DType;

HostArray F32(std::initializer_list<float> values, int64_t rows) {
  const int64_t n = static_cast<int64_t>(values.size());
  HostArray a = HostArray::Dense(DType::kF32, {rows, n / rows});
  float* p = static_cast<float*>(a.data());
  for (float v : values) *p++ = v;
  return a;
}

TEST(CompareTest, EqualFloatsPass) {
  HostArray a = F32({1, 2, -std::numeric_limits<float>::infinity(), 4}, 2);
  HostArray b = F32({1, 2, -std::numeric_limits<float>::infinity(), 4}, 2);
  Check c = CompareFloat("lse", a.view(), b.view(), kF32Tolerance);
  EXPECT_TRUE(c.pass) << c.detail;
  EXPECT_EQ(c.elements, 4);
  EXPECT_EQ(c.max_abs_err, 0);
}

TEST(CompareTest, NanWhereTheReferenceIsFiniteFails) {
  HostArray got = F32({1, std::nanf(""), 3, 4}, 1);
  HostArray ref = F32({1, 2, 3, 4}, 1);
  Check c = CompareFloat("out", got.view(), ref.view(), kF32Tolerance);
  EXPECT_FALSE(c.pass);
  EXPECT_EQ(c.mismatches, 1);
  EXPECT_NE(c.detail.find("flat index 1"), std::string::npos) << c.detail;
}

TEST(CompareTest, InfinitiesMustMatchExactly) {
  const float inf = std::numeric_limits<float>::infinity();
  HostArray got = F32({1, 0, 3, 4}, 1);
  HostArray ref = F32({1, -inf, 3, 4}, 1);
  EXPECT_FALSE(CompareFloat("logits", got.view(), ref.view(), kF32Tolerance).pass);
  HostArray got2 = F32({1, inf, 3, 4}, 1);
  EXPECT_FALSE(CompareFloat("logits", got2.view(), ref.view(), kF32Tolerance).pass);
}

TEST(CompareTest, ToleranceIsPerElementAndRelativeL2) {
  HostArray ref = F32({1, 2, 3, 4}, 1);
  HostArray close = F32({1.0001f, 2, 3, 4}, 1);
  EXPECT_TRUE(CompareFloat("x", close.view(), ref.view(), kF32Tolerance).pass);
  HostArray far = F32({1.01f, 2, 3, 4}, 1);  // |d| = 0.01 > 1e-3 + 1e-3·1
  Check c = CompareFloat("x", far.view(), ref.view(), kF32Tolerance);
  EXPECT_FALSE(c.pass);
  EXPECT_NEAR(c.max_abs_err, 0.01, 1e-6);
}

TEST(CompareTest, Bf16OutputsUseTheirOwnTolerance) {
  HostArray ref = HostArray::Dense(DType::kBF16, {1, 3});
  HostArray got = HostArray::Dense(DType::kBF16, {1, 3});
  auto* r = static_cast<uint16_t*>(ref.data());
  auto* g = static_cast<uint16_t*>(got.data());
  for (int i = 0; i < 3; ++i) r[i] = kernels::FloatToBf16(1.5f + i);
  for (int i = 0; i < 3; ++i) g[i] = static_cast<uint16_t>(r[i] + 1);  // one bf16 ulp off
  EXPECT_TRUE(CompareFloat("out", got.view(), ref.view(), kBf16Tolerance).pass);
  g[1] = kernels::FloatToBf16(3.0f);  // 2.5 -> 3.0
  EXPECT_FALSE(CompareFloat("out", got.view(), ref.view(), kBf16Tolerance).pass);
}

TEST(CompareTest, LayoutMismatchFails) {
  HostArray a = HostArray::Dense(DType::kF32, {2, 3});
  HostArray b = HostArray::Dense(DType::kF32, {3, 2});
  Check c = CompareFloat("out", a.view(), b.view(), kF32Tolerance);
  EXPECT_FALSE(c.pass);
  EXPECT_EQ(c.kind, "missing");
  kernels::Tensor none;
  EXPECT_FALSE(CompareFloat("out", none, b.view(), kF32Tolerance).pass);
}

TEST(CompareTest, IndexRowsCompareAsSets) {
  HostArray ref = HostArray::Dense(DType::kI32, {2, 3});
  HostArray got = HostArray::Dense(DType::kI32, {2, 3});
  const int32_t r[] = {5, 1, 9, 2, -1, -1};
  const int32_t g[] = {9, 5, 1, -1, 2, -1};  // same sets, another order
  std::memcpy(ref.data(), r, sizeof r);
  std::memcpy(got.data(), g, sizeof g);
  EXPECT_TRUE(CompareIndexRows("indices", got.view(), ref.view()).pass);
  static_cast<int32_t*>(got.data())[4] = 3;  // row 1 picks 3 instead of a padding slot
  Check c = CompareIndexRows("indices", got.view(), ref.view());
  EXPECT_FALSE(c.pass);
  EXPECT_EQ(c.mismatches, 1);
  EXPECT_NE(c.detail.find("row: 1"), std::string::npos) << c.detail;
}

TEST(CompareTest, FloatRowsCompareAfterSorting) {
  HostArray ref = F32({3, 1, 2, 6, 5, 4}, 2);
  HostArray got = F32({1, 2, 3, 4, 5, 6}, 2);
  EXPECT_TRUE(CompareFloatRows("values", got.view(), ref.view(), kF32Tolerance).pass);
  EXPECT_FALSE(CompareFloat("values", got.view(), ref.view(), kF32Tolerance).pass);
  HostArray bad = F32({1, 2, 3, 4, 5, 7}, 2);
  EXPECT_FALSE(CompareFloatRows("values", bad.view(), ref.view(), kF32Tolerance).pass);
}

}  // namespace
}  // namespace attnd::attnctl
