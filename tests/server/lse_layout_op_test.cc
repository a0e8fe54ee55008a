// lse in the caller's layout through the ops layer (docs/CONTRACTS.md "Strided lse"): a
// SparseMlaRequest whose lse is a [T, H] view of the caller's [H, T + pad] buffer in a host
// region (vLLM's merge layout) is written there in place, the gaps untouched; the same view
// returned inline comes back as its whole span with the request's strides; overlapping strides
// are INVALID_ARGUMENT naming lse. CPU kernels; lse compared with a direct kernel call on a dense
// lse (same implementation, so the same bits).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/common/status_details.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "server/ops/op_handler.h"
#include "server/regions/registry.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/server/daemon_fixture.h"
#include "tests/server/shm_test_util.h"

namespace attnd::server::ops {
namespace {

using attnd::testing::HostTensor;
using kernels::DType;

constexpr int64_t kT = 5, kH = 16, kS = 200, kK = 40, kPad = 3;
constexpr int64_t kRow = kT + kPad;              // the caller's [H, kRow] buffer
constexpr int64_t kSpan = (kH - 1) * kRow + kT;  // elements of the [T, H] view's span
constexpr uint64_t kLseOffset = 256;             // bytes into the region
constexpr uint32_t kPoison = 0x7fc0beef;         // a NaN the op must leave alone
constexpr int64_t kRegionBytes = 64 << 10;

using attnd::server::testing::InlineTensor;

// The lse placement: shape [T, H], strides (1, kRow).
v1::Tensor LseView(int64_t stride_t, int64_t stride_h) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_F32);
  t.add_shape(kT);
  t.add_shape(kH);
  t.add_strides(stride_t);
  t.add_strides(stride_h);
  return t;
}

class LseLayoutOpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng = attnd::testing::MakeRng();
    q_ = HostTensor::Dense(DType::kBF16, {kT, kH, 576});
    kv_ = HostTensor::Dense(DType::kBF16, {kS, 576});
    indices_ = HostTensor::Dense(DType::kI32, {kT, kK});
    attnd::testing::FillNormal(q_, rng, 1.0);
    attnd::testing::FillNormal(kv_, rng, 1.0);
    attnd::testing::FillUniformInt(indices_, rng, -2, kS + 2);                   // some masked
    for (int64_t i = 0; i < kK; ++i) indices_.data<int32_t>()[2 * kK + i] = -1;  // token 2: none

    // The expected lse: the CPU kernel on a dense [T, H] lse.
    HostTensor out = HostTensor::Dense(DType::kBF16, {kT, kH, 512});
    expected_ = HostTensor::Dense(DType::kF32, {kT, kH});
    kernels::sparse_mla::Params p;
    p.q = q_.tensor();
    p.kv = kv_.tensor();
    p.indices = indices_.tensor();
    p.sm_scale = kScale;
    p.out = out.tensor();
    p.lse = expected_.tensor();
    kernels::ExecContext ctx;
    ctx.pool = attnd::testing::TestPool();
    ASSERT_TRUE(kernels::sparse_mla::Run(p, ctx).ok());

    regions::RegionRegistry::Options o;
    o.allow_client_shm = true;
    registry_ = std::make_unique<regions::RegionRegistry>(o);
    shm_ = std::make_unique<attnd::testing::ScopedShm>(kRegionBytes);
    ASSERT_TRUE(shm_->ok());
    regions::HostRegionSpec spec;
    spec.name = "host";
    spec.key = shm_->key();
    spec.offset = 0;
    spec.byte_size = kRegionBytes;
    ASSERT_TRUE(registry_->RegisterHost(spec).ok());
  }

  v1::SparseMlaRequest Request() const {
    v1::SparseMlaRequest r;
    *r.mutable_q() = InlineTensor(q_, v1::DTYPE_BF16);
    *r.mutable_kv() = InlineTensor(kv_, v1::DTYPE_BF16);
    *r.mutable_indices() = InlineTensor(indices_, v1::DTYPE_I32);
    r.set_sm_scale(kScale);
    return r;
  }

  absl::Status PrepareAndRun(const v1::SparseMlaRequest& request, v1::SparseMlaResponse* response) {
    PrepareOptions options;
    options.registry = registry_.get();
    options.max_inline_bytes = 1 << 30;
    auto call = table_.Find(OpId::kSparseMla)->Prepare(request, response, options);
    if (!call.ok()) return call.status();
    kernels::ExecContext ctx;
    ctx.pool = attnd::testing::TestPool();
    std::string impl;
    absl::Status s = (*call)->Run(ctx, (*call)->HostData(), &impl);
    if (s.ok()) (*call)->call_tensors().FinishOutputs();  // as CallRunner::Finish does
    return s;
  }

  float Expected(int64_t t, int64_t h) const { return expected_.data<float>()[t * kH + h]; }

  static constexpr float kScale = 0.0625f;
  HostTensor q_, kv_, indices_, expected_;
  OpTable table_;
  std::unique_ptr<regions::RegionRegistry> registry_;
  std::unique_ptr<attnd::testing::ScopedShm> shm_;
};

void ExpectSameFloat(float got, float want, const std::string& what) {
  uint32_t a, b;
  std::memcpy(&a, &got, 4);
  std::memcpy(&b, &want, 4);
  EXPECT_EQ(a, b) << what << ": got " << got << ", want " << want;
}

TEST_F(LseLayoutOpTest, HostRegionHeadMajorViewWrittenInPlace) {
  float* lse = reinterpret_cast<float*>(shm_->data() + kLseOffset);
  const int64_t poisoned = kH * kRow + 16;  // the span, its trailing pad and a little more
  for (int64_t i = 0; i < poisoned; ++i) std::memcpy(lse + i, &kPoison, 4);

  v1::SparseMlaRequest request = Request();
  v1::Tensor placement = LseView(1, kRow);
  placement.mutable_region()->set_region("host");
  placement.mutable_region()->set_offset(kLseOffset);
  *request.mutable_lse() = placement;
  v1::SparseMlaResponse response;
  const absl::Status s = PrepareAndRun(request, &response);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(response.lse().strides_size(), 2);
  EXPECT_TRUE(response.lse().inline_data().empty());

  std::vector<bool> addressed(static_cast<size_t>(poisoned), false);
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t h = 0; h < kH; ++h) {
      addressed[h * kRow + t] = true;  // the caller's lse[h, t]
      ExpectSameFloat(lse[h * kRow + t], Expected(t, h),
                      "lse[" + std::to_string(h) + ", " + std::to_string(t) + "]");
    }
  }
  EXPECT_TRUE(std::isinf(lse[0 * kRow + 2]) && lse[0 * kRow + 2] < 0) << "token 2 has no slot";
  for (int64_t i = 0; i < poisoned; ++i) {
    if (addressed[i]) continue;
    uint32_t bits;
    std::memcpy(&bits, lse + i, 4);
    EXPECT_EQ(bits, kPoison) << "element " << i << " between the caller's rows was written";
  }
}

TEST_F(LseLayoutOpTest, InlineHeadMajorViewComesBackInTheRequestsLayout) {
  v1::SparseMlaRequest request = Request();
  *request.mutable_lse() = LseView(1, kRow);
  v1::SparseMlaResponse response;
  const absl::Status s = PrepareAndRun(request, &response);
  ASSERT_TRUE(s.ok()) << s;
  const v1::Tensor& lse = response.lse();
  ASSERT_EQ(lse.shape_size(), 2);
  EXPECT_EQ(lse.shape(0), kT);
  EXPECT_EQ(lse.shape(1), kH);
  ASSERT_EQ(lse.strides_size(), 2);
  EXPECT_EQ(lse.strides(0), 1);
  EXPECT_EQ(lse.strides(1), kRow);
  ASSERT_EQ(lse.inline_data().size(), static_cast<size_t>(kSpan * 4));
  std::vector<float> got(static_cast<size_t>(kSpan));
  std::memcpy(got.data(), lse.inline_data().data(), lse.inline_data().size());
  std::vector<bool> addressed(static_cast<size_t>(kSpan), false);
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t h = 0; h < kH; ++h) {
      addressed[h * kRow + t] = true;
      ExpectSameFloat(got[h * kRow + t], Expected(t, h), "inline lse");
    }
  }
  for (int64_t i = 0; i < kSpan; ++i) {
    if (addressed[i]) continue;
    EXPECT_EQ(got[i], 0.0f) << "gap element " << i << " is not zero";
  }
}

TEST_F(LseLayoutOpTest, OverlappingStridesAreInvalidArgumentNamingLse) {
  // (1, T − 1): lse[T − 1, h] and lse[0, h + 1] share an address; (0, 1): the tokens alias;
  // (1, 1): both unit.
  for (const auto& [stride_t, stride_h] :
       {std::pair<int64_t, int64_t>{1, kT - 1}, {0, 1}, {1, 1}}) {
    v1::SparseMlaRequest request = Request();
    *request.mutable_lse() = LseView(stride_t, stride_h);
    v1::SparseMlaResponse response;
    const absl::Status s = PrepareAndRun(request, &response);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << stride_t << "," << stride_h;
    EXPECT_TRUE(absl::StartsWith(s.message(), "lse: stride of dim ")) << s;
    const auto field = kernels::BadField(s);
    EXPECT_TRUE(field.has_value() && absl::StartsWith(*field, "lse.strides[")) << s;
  }
}

}  // namespace
}  // namespace attnd::server::ops
