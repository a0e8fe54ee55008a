#include "kernels/common/tensor.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace attnd::kernels {
namespace {

TEST(Tensor, DenseStridesAndSpan) {
  int32_t buf[24];
  Tensor t = MakeTensor(buf, DType::kI32, {2, 3, 4});
  EXPECT_EQ(t.strides[0], 12);
  EXPECT_EQ(t.strides[1], 4);
  EXPECT_EQ(t.strides[2], 1);
  EXPECT_EQ(SpanElements(t), 24);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(CheckTensor(t, "x", DType::kI32, {2, kAnyDim, 4}).ok());
}

TEST(Tensor, MessagesNameTensorDimAndValues) {
  uint16_t buf[575];
  Tensor q = MakeTensor(buf, DType::kBF16, {1, 575});
  absl::Status s = CheckTensor(q, "q", DType::kBF16, {1, 576});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "q: dim 1 is 575, want 576");
  s = CheckTensor(q, "q", DType::kF32, {1, 575});
  EXPECT_EQ(s.message(), "q: dtype is bf16, want f32");
  s = CheckTensor(q, "q", DType::kBF16, {1, 1, 575});
  EXPECT_EQ(s.message(), "q: rank is 2, want 3");
  EXPECT_EQ(CheckTensor(Tensor{}, "lse", DType::kF32, {1}).message(), "lse: missing");
  EXPECT_TRUE(CheckOptionalTensor(Tensor{}, "lse", DType::kF32, {1}).ok());
}

TEST(Tensor, RejectsBadStrides) {
  float buf[64];
  Tensor t = MakeStridedTensor(buf, DType::kF32, {4, 8}, {8, 2});
  EXPECT_EQ(CheckTensor(t, "k", DType::kF32, {4, 8}).message(),
            "k: stride of dim 1 is 2, want 1 (last dim contiguous)");
  t = MakeStridedTensor(buf, DType::kF32, {4, 8}, {7, 1});
  EXPECT_EQ(CheckTensor(t, "k", DType::kF32, {4, 8}).message(),
            "k: stride of dim 0 is 7, want >= 8");
  t = MakeStridedTensor(buf, DType::kF32, {4, 8}, {-8, 1});
  EXPECT_FALSE(CheckTensor(t, "k", DType::kF32, {4, 8}).ok());
  t = MakeStridedTensor(buf, DType::kF32, {2, 8}, {16, 1});  // padded rows are fine
  EXPECT_TRUE(CheckTensor(t, "k", DType::kF32, {2, 8}).ok());
  EXPECT_EQ(SpanElements(t), 24);
}

TEST(Tensor, RejectsOverflowAndNull) {
  float buf[1];
  Tensor t = MakeStridedTensor(buf, DType::kF32, {int64_t{1} << 40, 2}, {int64_t{1} << 40, 1});
  EXPECT_EQ(CheckTensor(t, "kv", DType::kF32, {kAnyDim, 2}).code(),
            absl::StatusCode::kInvalidArgument);
  Tensor n = MakeTensor(nullptr, DType::kF32, {3});
  EXPECT_EQ(CheckTensor(n, "x", DType::kF32, {3}).message(), "x: data pointer is null");
  Tensor empty = MakeTensor(nullptr, DType::kF32, {0, 3});
  EXPECT_TRUE(CheckTensor(empty, "x", DType::kF32, {0, 3}).ok());
  Tensor neg = MakeTensor(buf, DType::kF32, {1});
  neg.shape[0] = -2;
  EXPECT_EQ(CheckTensor(neg, "x", DType::kF32, {kAnyDim}).message(), "x: dim 0 is -2, want >= 0");
}

TEST(Tensor, OverflowHelpers) {
  int64_t out;
  EXPECT_TRUE(MulOverflow(std::numeric_limits<int64_t>::max(), 2, &out));
  EXPECT_FALSE(MulOverflow(int64_t{1} << 31, int64_t{1} << 31, &out));
  EXPECT_EQ(out, int64_t{1} << 62);
  EXPECT_TRUE(AddOverflow(std::numeric_limits<int64_t>::max(), 1, &out));
}

}  // namespace
}  // namespace attnd::kernels
