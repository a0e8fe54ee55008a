// Conversions between attnd.v1.Tensor and host memory (client/tensor_codec.h).
#include "client/tensor_codec.h"

#include <cstring>
#include <numeric>

#include "gtest/gtest.h"

namespace attnd::client {
namespace {

using kernels::DType;

TEST(TensorCodecTest, DTypesRoundTrip) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kFp8E4M3, DType::kI32, DType::kU8}) {
    absl::StatusOr<DType> back = FromProtoDType(ToProtoDType(d), "t");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(ToProtoDType(DType::kInvalid), v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(FromProtoDType(v1::DTYPE_UNSPECIFIED, "q").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status bad = FromProtoDType(77, "kv").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("kv"), absl::string_view::npos) << bad;
}

TEST(TensorCodecTest, DenseInlineRoundTrip) {
  HostArray a = HostArray::Dense(DType::kI32, {3, 4});
  ASSERT_EQ(a.span_bytes(), 48u);
  std::iota(static_cast<int32_t*>(a.data()), static_cast<int32_t*>(a.data()) + 12, 7);
  v1::Tensor t;
  ASSERT_TRUE(EncodeInline(a.view(), "x", &t).ok());
  EXPECT_EQ(t.dtype(), v1::DTYPE_I32);
  ASSERT_EQ(t.shape_size(), 2);
  EXPECT_EQ(t.shape(0), 3);
  EXPECT_EQ(t.shape(1), 4);
  EXPECT_EQ(t.strides_size(), 0);  // dense: strides omitted
  EXPECT_EQ(t.inline_data().size(), 48u);
  absl::StatusOr<HostArray> back = DecodeInline(t, "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::memcmp(back->data(), a.data(), 48), 0);
}

TEST(TensorCodecTest, StridedInlineSendsTheSpanOnly) {
  // 3 rows of 4 bf16 with a row stride of 6: span = 2·6 + 4 = 16 elements, 32 bytes.
  HostArray a = HostArray::Strided(DType::kBF16, {3, 4}, {6, 1});
  ASSERT_EQ(a.span_bytes(), 32u);
  for (int i = 0; i < 16; ++i) static_cast<uint16_t*>(a.data())[i] = static_cast<uint16_t>(i);
  v1::Tensor t;
  ASSERT_TRUE(EncodeInline(a.view(), "kv", &t).ok());
  ASSERT_EQ(t.strides_size(), 2);
  EXPECT_EQ(t.strides(0), 6);
  EXPECT_EQ(t.strides(1), 1);
  EXPECT_EQ(t.inline_data().size(), 32u);
  // Into a dense destination: row by row.
  HostArray dense = HostArray::Dense(DType::kBF16, {3, 4});
  ASSERT_TRUE(CopyInlineInto(t, "kv", dense.view()).ok());
  const auto* d = static_cast<const uint16_t*>(dense.data());
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(d[r * 4 + c], r * 6 + c) << r << "," << c;
  }
}

TEST(TensorCodecTest, CopyInlineIntoChecksDTypeShapeAndSize) {
  HostArray src = HostArray::Dense(DType::kF32, {2, 3});
  v1::Tensor t;
  ASSERT_TRUE(EncodeInline(src.view(), "out", &t).ok());
  HostArray wrong_shape = HostArray::Dense(DType::kF32, {3, 2});
  absl::Status s = CopyInlineInto(t, "out", wrong_shape.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dim 0 is 2, want 3"), absl::string_view::npos) << s;
  HostArray wrong_dtype = HostArray::Dense(DType::kI32, {2, 3});
  EXPECT_EQ(CopyInlineInto(t, "out", wrong_dtype.view()).code(),
            absl::StatusCode::kInvalidArgument);
  t.mutable_inline_data()->pop_back();
  HostArray ok = HostArray::Dense(DType::kF32, {2, 3});
  s = CopyInlineInto(t, "out", ok.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("23 bytes, want 24"), absl::string_view::npos) << s;
}

TEST(TensorCodecTest, DecodeInlineRequiresInlineData) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_F32);
  t.add_shape(4);
  t.mutable_region()->set_region("r");
  EXPECT_EQ(DecodeInline(t, "lse").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorCodecTest, LayoutOfRefusesBadLayouts) {
  uint64_t span = 0;
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_F32);
  EXPECT_FALSE(LayoutOf(t, "a", &span).ok());  // rank 0
  for (int i = 0; i < 6; ++i) t.add_shape(1);
  EXPECT_FALSE(LayoutOf(t, "a", &span).ok());  // rank 6 > kMaxRank
  t.clear_shape();
  t.add_shape(2);
  t.add_shape(-1);
  EXPECT_FALSE(LayoutOf(t, "a", &span).ok());  // negative dim
  t.clear_shape();
  t.add_shape(2);
  t.add_shape(3);
  t.add_strides(3);
  EXPECT_FALSE(LayoutOf(t, "a", &span).ok());  // one stride for rank 2
  t.add_strides(1);
  absl::StatusOr<kernels::Tensor> l = LayoutOf(t, "a", &span);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(span, 24u);
  t.clear_strides();
  t.clear_shape();
  t.add_shape(int64_t{1} << 40);
  t.add_shape(int64_t{1} << 40);
  absl::Status s = LayoutOf(t, "big", &span).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overflow"), absl::string_view::npos) << s;
}

TEST(TensorCodecTest, EmptyTensorsHaveNoBytes) {
  HostArray a = HostArray::Dense(DType::kBF16, {0, 512});
  EXPECT_EQ(a.span_bytes(), 0u);
  v1::Tensor t;
  ASSERT_TRUE(EncodeInline(a.view(), "q", &t).ok());
  EXPECT_TRUE(t.has_inline_data());
  EXPECT_TRUE(t.inline_data().empty());
  absl::StatusOr<HostArray> back = DecodeInline(t, "q");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->view().shape[0], 0);
  EXPECT_EQ(back->view().shape[1], 512);
}

TEST(TensorCodecTest, EncodeRegionKeepsLayoutAndOffset) {
  HostArray a = HostArray::Strided(DType::kF32, {2, 2}, {8, 1});
  v1::Tensor t;
  EncodeRegion(a.view(), "kv-cache", 4096, &t);
  EXPECT_EQ(t.region().region(), "kv-cache");
  EXPECT_EQ(t.region().offset(), 4096u);
  ASSERT_EQ(t.strides_size(), 2);
  EXPECT_EQ(t.strides(0), 8);
  EXPECT_FALSE(t.has_inline_data());
}

TEST(TensorCodecTest, IsDenseIgnoresUnitDims) {
  kernels::Tensor t = kernels::MakeTensor(nullptr, DType::kF32, {1, 4});
  t.strides[0] = 100;  // dim 0 has one element: its stride never matters
  EXPECT_TRUE(IsDense(t));
  t.shape[0] = 2;
  EXPECT_FALSE(IsDense(t));
  EXPECT_EQ(DescribeTensor(t), "f32[2, 4 | 100, 1]");
}

}  // namespace
}  // namespace attnd::client
