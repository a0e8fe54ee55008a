#include "kernels/common/tensor.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/common/status_details.h"

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

// CheckStridedTensor (lse in the caller's layout, docs/CONTRACTS.md "Strided lse"): any
// non-negative strides whose elements cannot share an address; CheckTensor's rule unchanged.
TEST(Tensor, StridedTensorAcceptsAnyNonOverlappingOrder) {
  float buf[4096];
  // [T, H] = [5, 16] as a view of [H, T]: strides (1, T), (1, T + pad), row-padded, dense.
  for (const auto& strides : {std::pair<int64_t, int64_t>{1, 5}, {1, 9}, {20, 1}, {16, 1}}) {
    const Tensor t = MakeStridedTensor(buf, DType::kF32, {5, 16}, {strides.first, strides.second});
    EXPECT_TRUE(CheckStridedTensor(t, "lse", DType::kF32, {5, 16}).ok())
        << strides.first << "," << strides.second;
  }
  // FlashMLA's [B, H, s_q] seen as [B, s_q, H]; and a stride-0 dim of size 1 (never stepped).
  Tensor d = MakeStridedTensor(buf, DType::kF32, {3, 2, 8}, {16, 1, 2});
  EXPECT_TRUE(CheckStridedTensor(d, "lse", DType::kF32, {3, 2, 8}).ok());
  d = MakeStridedTensor(buf, DType::kF32, {3, 1, 8}, {8, 0, 1});
  EXPECT_TRUE(CheckStridedTensor(d, "lse", DType::kF32, {3, 1, 8}).ok());
  // The transposed view stays refused by CheckTensor.
  const Tensor t = MakeStridedTensor(buf, DType::kF32, {5, 16}, {1, 5});
  EXPECT_FALSE(CheckTensor(t, "lse", DType::kF32, {5, 16}).ok());
  EXPECT_TRUE(CheckOptionalStridedTensor(Tensor{}, "lse", DType::kF32, {5, 16}).ok());
}

TEST(Tensor, StridedTensorRejectsOverlapNegativeAndOverflow) {
  float buf[4096];
  struct Row {
    std::initializer_list<int64_t> shape, strides;
    int dim;  // the stride named in the message and the payload
  };
  const Row rows[] = {
      {{5, 16}, {1, 1}, 1},        // both unit: (0, 1) and (1, 0) collide
      {{5, 16}, {1, 4}, 1},        // head stride below T = 5
      {{5, 16}, {0, 1}, 0},        // token stride 0 with 5 tokens
      {{5, 16}, {15, 1}, 0},       // token stride below H = 16
      {{5, 16}, {-16, 1}, 0},      // negative
      {{3, 2, 8}, {16, 1, 1}, 2},  // s_q and H both unit
      {{3, 2, 8}, {8, 1, 2}, 0},   // b stride below the span 16 of (s_q, H)
  };
  for (const Row& r : rows) {
    Tensor t = MakeTensor(buf, DType::kF32, r.shape);
    int i = 0;
    for (int64_t s : r.strides) t.strides[i++] = s;
    const absl::Status s = CheckStridedTensor(t, "lse", DType::kF32, r.shape);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(BadField(s), absl::StrCat("lse.strides[", r.dim, "]")) << s;
    EXPECT_EQ(s.message().rfind("lse: stride of dim ", 0), 0u) << s;
  }
  Tensor huge = MakeStridedTensor(buf, DType::kF32, {5, 16}, {1, int64_t{1} << 61});
  EXPECT_EQ(CheckStridedTensor(huge, "lse", DType::kF32, {5, 16}).code(),
            absl::StatusCode::kInvalidArgument);
  Tensor null = MakeStridedTensor(nullptr, DType::kF32, {5, 16}, {1, 5});
  EXPECT_EQ(CheckStridedTensor(null, "lse", DType::kF32, {5, 16}).message(),
            "lse: data pointer is null");
  Tensor empty = MakeStridedTensor(nullptr, DType::kF32, {0, 16}, {1, 1});
  EXPECT_TRUE(CheckStridedTensor(empty, "lse", DType::kF32, {0, 16}).ok());
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
