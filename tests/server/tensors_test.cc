// Tensor resolution: layouts, overflow-safe slices, inline and region inputs and outputs.
#include "server/ops/tensors.h"

#include <unistd.h>

#include <cstring>
#include <limits>

#include "gtest/gtest.h"
#include "tests/server/shm_test_util.h"

namespace attnd::server::ops {
namespace {

using attnd::testing::ScopedShm;
using kernels::DType;

constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();

v1::Tensor Inline(v1::DType dtype, std::vector<int64_t> shape, size_t bytes) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.set_inline_data(std::string(bytes, '\1'));
  return t;
}

v1::Tensor InRegion(v1::DType dtype, std::vector<int64_t> shape, const std::string& region,
                    uint64_t offset) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.mutable_region()->set_region(region);
  t.mutable_region()->set_offset(offset);
  return t;
}

TEST(MakeLayoutTest, DenseAndStrided) {
  kernels::Tensor t;
  uint64_t span = 0;
  const int64_t shape[] = {2, 3, 4};
  ASSERT_TRUE(MakeLayout("x", DType::kF32, shape, 3, nullptr, 0, &t, &span).ok());
  EXPECT_EQ(t.strides[0], 12);
  EXPECT_EQ(t.strides[1], 4);
  EXPECT_EQ(t.strides[2], 1);
  EXPECT_EQ(span, 2u * 3 * 4 * 4);
  const int64_t strides[] = {20, 4, 1};
  ASSERT_TRUE(MakeLayout("x", DType::kBF16, shape, 3, strides, 3, &t, &span).ok());
  EXPECT_EQ(span, (1 + 1 * 20 + 2 * 4 + 3) * 2u);
  const int64_t empty_shape[] = {5, 0, 7};
  ASSERT_TRUE(MakeLayout("x", DType::kF32, empty_shape, 3, nullptr, 0, &t, &span).ok());
  EXPECT_EQ(span, 0u);
}

TEST(MakeLayoutTest, RejectsBadLayouts) {
  kernels::Tensor t;
  uint64_t span;
  const int64_t shape[] = {2, 3, 4, 5, 6, 7};
  EXPECT_FALSE(MakeLayout("x", DType::kF32, shape, 0, nullptr, 0, &t, &span).ok());
  EXPECT_FALSE(MakeLayout("x", DType::kF32, shape, 6, nullptr, 0, &t, &span).ok());
  const int64_t negative[] = {2, -1};
  EXPECT_FALSE(MakeLayout("x", DType::kF32, negative, 2, nullptr, 0, &t, &span).ok());
  const int64_t strides[] = {4, 1};
  EXPECT_FALSE(MakeLayout("x", DType::kF32, shape, 3, strides, 2, &t, &span).ok());
  const int64_t neg_strides[] = {-4, 1};
  EXPECT_FALSE(MakeLayout("x", DType::kF32, shape, 2, neg_strides, 2, &t, &span).ok());
}

TEST(MakeLayoutTest, OverflowIsInvalidArgument) {
  kernels::Tensor t;
  uint64_t span;
  const int64_t huge[] = {int64_t{1} << 40, int64_t{1} << 40};
  absl::Status s = MakeLayout("q", DType::kF32, huge, 2, nullptr, 0, &t, &span);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("q:"), absl::string_view::npos);
  // Elements fit in int64 but bytes do not.
  const int64_t big[] = {int64_t{1} << 62};
  s = MakeLayout("q", DType::kF32, big, 1, nullptr, 0, &t, &span);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Strides that overflow the span.
  const int64_t shape[] = {3, 2};
  const int64_t strides[] = {std::numeric_limits<int64_t>::max() / 2 + 1, 1};
  s = MakeLayout("q", DType::kU8, shape, 2, strides, 2, &t, &span);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(CheckSliceTest, Bounds) {
  EXPECT_TRUE(CheckSlice("q", "r", 0, 100, 100).ok());
  EXPECT_TRUE(CheckSlice("q", "r", 100, 0, 100).ok());
  EXPECT_FALSE(CheckSlice("q", "r", 1, 100, 100).ok());
  EXPECT_FALSE(CheckSlice("q", "r", 101, 0, 100).ok());
  EXPECT_FALSE(CheckSlice("q", "r", kMax64, 2, kMax64).ok());
  EXPECT_FALSE(CheckSlice("q", "r", 2, kMax64, kMax64).ok());
}

class CallTensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(shm_.ok());
    RegionRegistry::Options o;
    o.allow_client_shm = true;
    registry_ = std::make_unique<regions::RegionRegistry>(o);
    ASSERT_TRUE(registry_->RegisterHost({"r", shm_.key(), 4096, 8192, "", "", std::nullopt}).ok());
  }
  using RegionRegistry = regions::RegionRegistry;
  // Where byte `offset` of region "r" is mapped in the registry (the daemon's own mapping).
  void* shm_data_in_daemon(uint64_t offset) {
    absl::StatusOr<regions::RegionPin> pin = registry_->Acquire("r");
    return pin.ok() ? (*pin)->data() + offset : nullptr;
  }
  ScopedShm shm_{4 * 4096};
  std::unique_ptr<regions::RegionRegistry> registry_;
};

TEST_F(CallTensorsTest, InlineInputReadInPlace) {
  CallTensors tensors(registry_.get(), 1 << 20);
  v1::Tensor t = Inline(v1::DTYPE_F32, {2, 3}, 24);
  kernels::Tensor view;
  ASSERT_TRUE(tensors.Input("q", &t, &view).ok());
  EXPECT_EQ(view.rank, 2);
  EXPECT_EQ(view.dtype, DType::kF32);
  EXPECT_EQ(tensors.copied_in(), 24u);
  EXPECT_EQ(static_cast<const void*>(view.data), static_cast<const void*>(t.inline_data().data()));
}

TEST_F(CallTensorsTest, InlineInputSizeMustMatch) {
  CallTensors tensors(registry_.get(), 1 << 20);
  kernels::Tensor view;
  v1::Tensor t = Inline(v1::DTYPE_F32, {2, 3}, 23);
  absl::Status s = tensors.Input("q", &t, &view);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("q: inline_data is 23 bytes, want 24"), absl::string_view::npos) << s;
  t = Inline(v1::DTYPE_F32, {2, 3}, 25);
  EXPECT_FALSE(tensors.Input("q", &t, &view).ok());
}

TEST_F(CallTensorsTest, BadDtypeAndMissingData) {
  CallTensors tensors(registry_.get(), 1 << 20);
  kernels::Tensor view;
  v1::Tensor t = Inline(static_cast<v1::DType>(42), {2}, 8);
  EXPECT_EQ(tensors.Input("q", &t, &view).code(), absl::StatusCode::kInvalidArgument);
  v1::Tensor none;
  none.set_dtype(v1::DTYPE_F32);
  none.add_shape(4);
  EXPECT_EQ(tensors.Input("q", &none, &view).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(tensors.Input("absent", nullptr, &view).ok());
  EXPECT_FALSE(view.present());
}

TEST_F(CallTensorsTest, RegionInputIsZeroCopy) {
  std::memcpy(shm_.data() + 4096 + 64, "abcd", 4);
  CallTensors tensors(registry_.get(), 1 << 20);
  v1::Tensor t = InRegion(v1::DTYPE_F32, {4}, "r", 64);
  kernels::Tensor view;
  ASSERT_TRUE(tensors.Input("kv", &t, &view).ok());
  EXPECT_EQ(view.data, shm_data_in_daemon(64));
  EXPECT_EQ(std::memcmp(view.data, "abcd", 4), 0);
  EXPECT_EQ(tensors.copied_in(), 0u);
  EXPECT_EQ(registry_->List()[0].in_flight, 1);  // pinned while the call holds it
}

TEST_F(CallTensorsTest, RegionSliceErrors) {
  CallTensors tensors(registry_.get(), 1 << 20);
  kernels::Tensor view;
  v1::Tensor t = InRegion(v1::DTYPE_F32, {4}, "nope", 0);
  EXPECT_EQ(tensors.Input("q", &t, &view).code(), absl::StatusCode::kNotFound);
  t = InRegion(v1::DTYPE_F32, {2048}, "r", 4);  // 8192 bytes from offset 4: 4 past the end
  EXPECT_EQ(tensors.Input("q", &t, &view).code(), absl::StatusCode::kInvalidArgument);
  t = InRegion(v1::DTYPE_F32, {2048}, "r", 0);  // exactly the region
  EXPECT_TRUE(tensors.Input("q", &t, &view).ok());
  t = InRegion(v1::DTYPE_F32, {1}, "r", kMax64 - 1);  // offset + 4 wraps 2^64
  EXPECT_EQ(tensors.Input("q", &t, &view).code(), absl::StatusCode::kInvalidArgument);
  t = InRegion(v1::DTYPE_F32, {1}, "r", 8192);  // offset == size
  EXPECT_EQ(tensors.Input("q", &t, &view).code(), absl::StatusCode::kInvalidArgument);
  t = InRegion(v1::DTYPE_F32, {1}, "r", 2);  // misaligned f32
  EXPECT_EQ(tensors.Input("q", &t, &view).code(), absl::StatusCode::kInvalidArgument);
  // Strides that reach past the end although the dense size would fit.
  t = InRegion(v1::DTYPE_F32, {2, 4}, "r", 0);
  t.add_strides(2048);
  t.add_strides(1);
  EXPECT_EQ(tensors.Input("q", &t, &view).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CallTensorsTest, InlineOutputWithDerivedShape) {
  CallTensors tensors(registry_.get(), 1 << 20);
  v1::Tensor reply;
  kernels::Tensor view;
  OutputSpec spec{true, DType::kBF16, {3, 4, 5}};
  ASSERT_TRUE(tensors.Output("out", nullptr, spec, &reply, &view).ok());
  EXPECT_EQ(view.rank, 3);
  EXPECT_EQ(view.dtype, DType::kBF16);
  EXPECT_EQ(reply.dtype(), v1::DTYPE_BF16);
  ASSERT_EQ(reply.shape_size(), 3);
  EXPECT_EQ(reply.inline_data().size(), 3u * 4 * 5 * 2);
  EXPECT_EQ(static_cast<const void*>(view.data),
            static_cast<const void*>(reply.inline_data().data()));
  EXPECT_EQ(tensors.copied_out(), 120u);
}

TEST_F(CallTensorsTest, OutputShapeAndStridesFromThePlacement) {
  CallTensors tensors(registry_.get(), 1 << 20);
  v1::Tensor placement;
  placement.add_shape(2);
  placement.add_shape(3);
  placement.add_strides(8);  // padded rows (ld = 8)
  placement.add_strides(1);
  v1::Tensor reply;
  kernels::Tensor view;
  ASSERT_TRUE(
      tensors.Output("logits", &placement, {true, DType::kF32, {9, 9}}, &reply, &view).ok());
  EXPECT_EQ(view.shape[0], 2);
  EXPECT_EQ(view.strides[0], 8);
  EXPECT_EQ(reply.inline_data().size(), (8 + 3) * 4u);
  EXPECT_EQ(reply.strides_size(), 2);
}

TEST_F(CallTensorsTest, OutputErrors) {
  CallTensors tensors(registry_.get(), 1000);
  v1::Tensor reply;
  kernels::Tensor view;
  // Over the inline limit.
  EXPECT_EQ(tensors.Output("out", nullptr, {true, DType::kF32, {1000}}, &reply, &view).code(),
            absl::StatusCode::kInvalidArgument);
  // A placement with inline data.
  v1::Tensor placement = Inline(v1::DTYPE_F32, {2}, 8);
  EXPECT_EQ(tensors.Output("out", &placement, {true, DType::kF32, {2}}, &reply, &view).code(),
            absl::StatusCode::kInvalidArgument);
  // A huge derived shape is refused, never allocated.
  EXPECT_FALSE(
      tensors
          .Output("out", nullptr, {true, DType::kF32, {int64_t{1} << 40, 1 << 20}}, &reply, &view)
          .ok());
  // An optional output left out stays absent.
  ASSERT_TRUE(tensors.Output("values", nullptr, {false, DType::kF32, {4}}, &reply, &view).ok());
  EXPECT_FALSE(view.present());
}

TEST_F(CallTensorsTest, RegionOutputIsWrittenInPlace) {
  CallTensors tensors(registry_.get(), 1 << 20);
  v1::Tensor placement = InRegion(v1::DTYPE_UNSPECIFIED, {}, "r", 128);
  v1::Tensor reply;
  kernels::Tensor view;
  ASSERT_TRUE(tensors.Output("out", &placement, {true, DType::kF32, {4}}, &reply, &view).ok());
  static_cast<float*>(view.data)[0] = 1.5f;
  float got;
  std::memcpy(&got, shm_.data() + 4096 + 128, 4);
  EXPECT_EQ(got, 1.5f);
  EXPECT_TRUE(reply.has_region());
  EXPECT_EQ(reply.region().offset(), 128u);
  EXPECT_EQ(reply.inline_data().size(), 0u);
  EXPECT_EQ(tensors.copied_out(), 0u);
}

TEST_F(CallTensorsTest, IndexTensorInAHostRegionIsSnapshotted) {
  // i32 [2, 3] with a row stride of 8 at offset 256 of region "r".
  int32_t* client = reinterpret_cast<int32_t*>(shm_.data() + 4096 + 256);
  for (int i = 0; i < 16; ++i) client[i] = 100 + i;
  CallTensors tensors(registry_.get(), 1 << 20);
  v1::Tensor t = InRegion(v1::DTYPE_I32, {2, 3}, "r", 256);
  t.add_strides(8);
  t.add_strides(1);
  kernels::Tensor view;
  ASSERT_TRUE(tensors.Input("indptr", &t, &view).ok());
  // A private dense copy: the client changing its memory afterwards changes nothing.
  const char* mapped = static_cast<const char*>(shm_data_in_daemon(0));
  const char* data = static_cast<const char*>(view.data);
  EXPECT_TRUE(data + 24 <= mapped || data >= mapped + 8192) << "the view points into the region";
  EXPECT_EQ(view.strides[0], 3);
  EXPECT_EQ(view.strides[1], 1);
  for (int i = 0; i < 16; ++i) client[i] = -1;
  const int32_t want[] = {100, 101, 102, 108, 109, 110};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(view.ptr<const int32_t>()[i], want[i]) << i;
  EXPECT_EQ(tensors.snapshot_bytes(), 24u);
  EXPECT_EQ(tensors.copied_in(), 0u);  // not request bytes
  ASSERT_EQ(tensors.uses().size(), 1u);
  EXPECT_EQ(tensors.uses()[0].residence, engine::Residence::kInline);
  EXPECT_EQ(tensors.uses()[0].host, view.data);
  EXPECT_EQ(tensors.uses()[0].span_bytes, 24u);
  // Other dtypes stay zero-copy.
  v1::Tensor f = InRegion(v1::DTYPE_F32, {4}, "r", 512);
  ASSERT_TRUE(tensors.Input("kv", &f, &view).ok());
  EXPECT_EQ(view.data, shm_data_in_daemon(512));
}

TEST_F(CallTensorsTest, HostMemoryIsReservedBeforeItIsAllocated) {
  engine::CallMemoryBudget budget({/*total_bytes=*/1 << 20, /*per_client_bytes=*/4096});
  {
    engine::CallMemory memory(&budget, "uid:7");
    CallTensors tensors(registry_.get(), 1 << 20, &memory);
    v1::Tensor reply;
    kernels::Tensor view;
    ASSERT_TRUE(tensors.Output("out", nullptr, {true, DType::kF32, {1024}}, &reply, &view).ok());
    EXPECT_EQ(budget.used_by("uid:7"), 4096u);
    v1::Tensor reply2;
    absl::Status s = tensors.Output("lse", nullptr, {true, DType::kF32, {1}}, &reply2, &view);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_NE(s.message().find("--call-memory-bytes-per-client"), absl::string_view::npos) << s;
    EXPECT_TRUE(reply2.inline_data().empty());  // refused before anything was allocated
    // A snapshot needs budget too.
    v1::Tensor t = InRegion(v1::DTYPE_I32, {4}, "r", 0);
    EXPECT_EQ(tensors.Input("indices", &t, &view).code(), absl::StatusCode::kResourceExhausted);
    // Another client has its own share.
    engine::CallMemory other(&budget, "uid:8");
    EXPECT_TRUE(other.Reserve(4096, "x").ok());
    EXPECT_EQ(budget.used(), 8192u);
  }
  EXPECT_EQ(budget.used(), 0u);  // returned when the calls' memory went
}

TEST_F(CallTensorsTest, InlineOutputsOfOneCallFitOneReply) {
  CallTensors tensors(registry_.get(), 1000);
  v1::Tensor a, b;
  kernels::Tensor view;
  ASSERT_TRUE(tensors.Output("out", nullptr, {true, DType::kF32, {150}}, &a, &view).ok());
  absl::Status s = tensors.Output("lse", nullptr, {true, DType::kF32, {150}}, &b, &view);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(b.inline_data().empty());
}

TEST_F(CallTensorsTest, TruncatedRegionFailsTheCall) {
  v1::Tensor f = InRegion(v1::DTYPE_F32, {4}, "r", 0);
  v1::Tensor idx = InRegion(v1::DTYPE_I32, {4}, "r", 64);
  CallTensors before(registry_.get(), 1 << 20);
  kernels::Tensor kv;
  ASSERT_TRUE(before.Input("kv", &f, &kv).ok());
  EXPECT_TRUE(before.CheckRegions().ok());
  // The client shrinks its object under the registered region (bytes [4096, 12288)).
  ASSERT_EQ(truncate(("/dev/shm" + shm_.key()).c_str(), 4096), 0);
  // A snapshot meets the lost pages: a clean error, and the process lives on.
  CallTensors tensors(registry_.get(), 1 << 20);
  kernels::Tensor view;
  absl::Status s = tensors.Input("indices", &idx, &view);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("truncated"), absl::string_view::npos) << s;
  // A call that already held the region fails after the op, and new ones fail at once.
  EXPECT_EQ(before.CheckRegions().code(), absl::StatusCode::kFailedPrecondition);
  CallTensors after(registry_.get(), 1 << 20);
  EXPECT_EQ(after.Input("kv", &f, &view).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace attnd::server::ops
