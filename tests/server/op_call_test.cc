// The ops layer as an engine::OpCall (no GPU): launch keys (layout and scalars, never data or
// pointers), where each tensor lives (inline, host region, device region), rebinding pointers for
// a run, work counts from read-back device data or an upper bound, ready_event / device_uuid
// checks. Device regions are host memory behind a fake opener, so the CPU kernel can run in place.
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "server/engine/cpu_backend.h"
#include "server/ops/op_handler.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/server/fake_device_opener.h"

namespace attnd::server::ops {
namespace {

using attnd::testing::HostTensor;
using kernels::DType;

constexpr float kScale = 0.0625f;

size_t Span(const HostTensor& h) {
  return static_cast<size_t>(kernels::SpanElements(h.tensor()) *
                             kernels::DTypeSize(h.tensor().dtype));
}

v1::Tensor Layout(const HostTensor& h, v1::DType dtype) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int i = 0; i < h.tensor().rank; ++i) t.add_shape(h.tensor().shape[i]);
  return t;
}

v1::Tensor Inline(const HostTensor& h, v1::DType dtype) {
  v1::Tensor t = Layout(h, dtype);
  t.set_inline_data(std::string(reinterpret_cast<const char*>(h.raw()), Span(h)));
  return t;
}

v1::Tensor InRegion(v1::Tensor t, const std::string& region, uint64_t offset) {
  t.mutable_region()->set_region(region);
  t.mutable_region()->set_offset(offset);
  return t;
}

struct Case {
  Case(int64_t t, int64_t h, int64_t s, int64_t k) {
    std::mt19937_64 rng = attnd::testing::MakeRng();
    q = HostTensor::Dense(DType::kBF16, {t, h, 576});
    kv = HostTensor::Dense(DType::kBF16, {s, 576});
    indices = HostTensor::Dense(DType::kI32, {t, k});
    attnd::testing::FillNormal(q, rng, 1.0);
    attnd::testing::FillNormal(kv, rng, 1.0);
    attnd::testing::FillUniformInt(indices, rng, -2, s + 2);  // some masked
  }
  v1::SparseMlaRequest InlineRequest() const {
    v1::SparseMlaRequest r;
    *r.mutable_q() = Inline(q, v1::DTYPE_BF16);
    *r.mutable_kv() = Inline(kv, v1::DTYPE_BF16);
    *r.mutable_indices() = Inline(indices, v1::DTYPE_I32);
    r.set_sm_scale(kScale);
    return r;
  }
  HostTensor q, kv, indices;
};

class OpCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    opener_ = std::make_shared<testing::FakeDeviceOpener>(4 << 20);
    regions::RegionRegistry::Options o;
    o.allow_client_shm = true;
    o.device_opener = opener_;
    registry_ = std::make_unique<regions::RegionRegistry>(o);
    regions::DeviceRegionSpec spec;
    spec.name = "dev";
    spec.raw_handle = std::string(64, 'd');
    spec.byte_size = 4 << 20;
    ASSERT_TRUE(registry_->RegisterDevice(spec).ok());
    auto pin = registry_->Acquire("dev");
    ASSERT_TRUE(pin.ok());
    device_ = (*pin)->device_data();
  }

  absl::StatusOr<std::unique_ptr<PreparedCall>> Prepare(const v1::SparseMlaRequest& request,
                                                        v1::SparseMlaResponse* response) {
    PrepareOptions options;
    options.registry = registry_.get();
    options.max_inline_bytes = 1 << 30;
    return table_.Find(OpId::kSparseMla)->Prepare(request, response, options);
  }

  std::string Key(const v1::SparseMlaRequest& request) {
    v1::SparseMlaResponse response;
    auto call = Prepare(request, &response);
    EXPECT_TRUE(call.ok()) << call.status();
    return call.ok() ? (*call)->LaunchKey() : "";
  }

  OpTable table_;
  std::shared_ptr<testing::FakeDeviceOpener> opener_;
  std::unique_ptr<regions::RegionRegistry> registry_;
  char* device_ = nullptr;
};

TEST_F(OpCallTest, LaunchKeyIsLayoutAndScalarsNeverData) {
  const Case a(3, 16, 64, 16), b(3, 16, 64, 16), c(3, 16, 64, 8), d(3, 16, 65, 16);
  const std::string key = Key(a.InlineRequest());
  EXPECT_EQ(Key(b.InlineRequest()), key) << "different data, same launch";
  v1::SparseMlaRequest scaled = a.InlineRequest();
  scaled.set_sm_scale(kScale * 2);
  EXPECT_NE(Key(scaled), key);
  EXPECT_NE(Key(c.InlineRequest()), key) << "K differs";
  EXPECT_NE(Key(d.InlineRequest()), key) << "S differs";
  v1::SparseMlaRequest strided = a.InlineRequest();
  *strided.mutable_lse() = v1::Tensor();
  strided.mutable_lse()->add_shape(3);
  strided.mutable_lse()->add_shape(16);
  strided.mutable_lse()->add_strides(32);
  strided.mutable_lse()->add_strides(1);
  EXPECT_NE(Key(strided), key) << "an output's strides change the launch";
  v1::SparseMlaRequest options = a.InlineRequest();
  options.set_ready_event(std::string(64, 'e'));
  options.set_device_uuid("GPU-00000000-0000-0000-0000-000000000003");
  EXPECT_EQ(Key(options), key) << "the ready event and device are not part of the launch";
  // The same request placed in a device region: same layout, same key.
  v1::SparseMlaRequest in_region = a.InlineRequest();
  std::memcpy(device_, a.kv.raw(), Span(a.kv));
  *in_region.mutable_kv() = InRegion(Layout(a.kv, v1::DTYPE_BF16), "dev", 0);
  EXPECT_EQ(Key(in_region), key);
}

TEST_F(OpCallTest, DeviceRegionsInPlaceWithCountReadback) {
  const Case c(3, 16, 64, 16);
  const uint64_t kv_at = 0, idx_at = 128 << 10, out_at = 256 << 10;
  std::memcpy(device_ + kv_at, c.kv.raw(), Span(c.kv));
  std::memcpy(device_ + idx_at, c.indices.raw(), Span(c.indices));
  std::memset(device_ + out_at, 0x7f, 3 * 16 * 512 * 2);  // poison
  v1::SparseMlaRequest request = c.InlineRequest();
  *request.mutable_kv() = InRegion(Layout(c.kv, v1::DTYPE_BF16), "dev", kv_at);
  *request.mutable_indices() = InRegion(Layout(c.indices, v1::DTYPE_I32), "dev", idx_at);
  request.mutable_out()->mutable_region()->set_region("dev");
  request.mutable_out()->mutable_region()->set_offset(out_at);
  v1::SparseMlaResponse response;
  auto prepared = Prepare(request, &response);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  PreparedCall& call = **prepared;

  const auto& uses = call.tensors();
  ASSERT_EQ(uses.size(), 5u);  // q, kv, indices, out, lse (absent indptr/topk_length skipped)
  EXPECT_EQ(uses[0].name, "q");
  EXPECT_EQ(uses[0].residence, engine::Residence::kInline);
  EXPECT_EQ(uses[0].span_bytes, Span(c.q));
  EXPECT_EQ(uses[1].name, "kv");
  EXPECT_EQ(uses[1].residence, engine::Residence::kDeviceRegion);
  EXPECT_EQ(uses[1].device, device_ + kv_at);
  EXPECT_EQ(uses[1].device_ordinal, testing::FakeDeviceOpener::kOrdinal);
  EXPECT_EQ(uses[1].device_uuid, testing::FakeDeviceOpener::kUuid);
  EXPECT_EQ(uses[1].readback, nullptr) << "Count does not read kv";
  EXPECT_EQ(uses[2].name, "indices");
  ASSERT_NE(uses[2].readback, nullptr) << "Count reads the selection: read back (small)";
  EXPECT_EQ(uses[3].name, "out");
  EXPECT_EQ(uses[3].role, kernels::Role::kOutput);
  EXPECT_EQ(uses[3].residence, engine::Residence::kDeviceRegion);
  EXPECT_FALSE(uses[3].zero_fill);
  EXPECT_EQ(uses[4].name, "lse");
  EXPECT_EQ(uses[4].residence, engine::Residence::kInline);
  EXPECT_TRUE(uses[4].zero_fill);
  EXPECT_EQ(call.call_tensors().copied_in(), Span(c.q));  // the region tensors copy nothing

  // What a GPU backend does after the launch: read the index data back.
  std::memcpy(uses[2].readback, uses[2].device, uses[2].span_bytes);
  std::string impl;
  kernels::ExecContext ctx;
  ctx.pool = attnd::testing::TestPool();
  ASSERT_TRUE(call.Run(ctx, call.HostData(), &impl).ok());
  EXPECT_EQ(impl, "cpu");

  // The same kernel on host copies gives the same bytes, written in place in the device region.
  HostTensor out = HostTensor::Dense(DType::kBF16, {3, 16, 512});
  HostTensor lse = HostTensor::Dense(DType::kF32, {3, 16});
  kernels::sparse_mla::Params p;
  p.q = c.q.tensor();
  p.kv = c.kv.tensor();
  p.indices = c.indices.tensor();
  p.sm_scale = kScale;
  p.out = out.tensor();
  p.lse = lse.tensor();
  ASSERT_TRUE(kernels::sparse_mla::Run(p, ctx).ok());
  EXPECT_EQ(std::memcmp(device_ + out_at, out.raw(), Span(out)), 0);
  ASSERT_EQ(response.lse().inline_data().size(), Span(lse));
  EXPECT_EQ(std::memcmp(response.lse().inline_data().data(), lse.raw(), Span(lse)), 0);
  EXPECT_FALSE(response.out().has_inline_data());

  const kernels::WorkCount want = kernels::sparse_mla::Count(p);
  const kernels::WorkCount got = call.Count();
  EXPECT_EQ(got.flops, want.flops);
  EXPECT_EQ(got.bytes, want.bytes);
  EXPECT_STREQ(call.count_basis(), "exact");
}

TEST_F(OpCallTest, LargeDeviceSelectionsCountAnUpperBound) {
  const int64_t t = 128, k = 2100;  // 1,075,200 bytes of indices: past kMaxCountReadbackBytes
  static_assert(t * k * 4 > kMaxCountReadbackBytes, "the case must exceed the readback limit");
  const Case c(t, 8, 64, k);
  v1::SparseMlaRequest request = c.InlineRequest();
  *request.mutable_indices() = InRegion(Layout(c.indices, v1::DTYPE_I32), "dev", 0);
  v1::SparseMlaResponse response;
  auto prepared = Prepare(request, &response);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  PreparedCall& call = **prepared;
  for (const engine::TensorUse& use : call.tensors()) EXPECT_EQ(use.readback, nullptr);
  EXPECT_STREQ(call.count_basis(), "upper_bound");
  // Every slot counted: 2·H·(d_qk + 512)·T·K.
  EXPECT_EQ(call.Count().flops, 2.0 * 8 * (576 + 512) * static_cast<double>(t * k));
}

TEST_F(OpCallTest, BindingRedirectsARunAndIsUndone) {
  const Case c(2, 8, 32, 8);
  const v1::SparseMlaRequest request = c.InlineRequest();  // outlives the call (its contract)
  v1::SparseMlaResponse response;
  auto prepared = Prepare(request, &response);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  PreparedCall& call = **prepared;
  kernels::ExecContext ctx;
  std::string impl;
  int64_t workspace = -1;
  ASSERT_TRUE(call.Select(ctx, call.HostData(), &impl, &workspace).ok());
  EXPECT_EQ(impl, "cpu");
  EXPECT_EQ(workspace, 0);
  std::vector<void*> data = call.HostData();
  ASSERT_EQ(call.tensors()[3].name, "out");
  std::vector<uint16_t> elsewhere(2 * 8 * 512, 0);
  data[3] = elsewhere.data();
  ASSERT_TRUE(call.Run(ctx, data, &impl).ok());
  bool written = false;
  for (uint16_t v : elsewhere) written |= v != 0;
  EXPECT_TRUE(written) << "the run wrote where it was bound";
  const std::string& reply = response.out().inline_data();
  EXPECT_EQ(reply, std::string(reply.size(), '\0')) << "not into the reply";
  EXPECT_EQ(call.HostData()[3], static_cast<void*>(const_cast<char*>(reply.data())))
      << "binding undone";
  EXPECT_FALSE(call.Run(ctx, {nullptr}, &impl).ok()) << "pointer count mismatch";
}

TEST_F(OpCallTest, ReadyEventAndDeviceUuid) {
  const Case c(2, 8, 32, 8);
  kernels::ThreadPool pool(1);
  engine::CpuBackend cpu(&pool);
  v1::SparseMlaRequest request = c.InlineRequest();
  request.set_ready_event(std::string(10, 'e'));
  v1::SparseMlaResponse response;
  auto bad = Prepare(request, &response);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("ready_event"), std::string::npos);

  request.set_ready_event(std::string(64, 'e'));
  auto with_event = Prepare(request, &response);
  ASSERT_TRUE(with_event.ok()) << with_event.status();
  EXPECT_EQ((*with_event)->ready_event().size(), 64u);
  engine::StepResult r;
  EXPECT_EQ(cpu.RunCall(**with_event, &r).code(), absl::StatusCode::kUnimplemented);

  request.clear_ready_event();
  request.set_device_uuid("GPU-00000000-0000-0000-0000-000000000003");
  auto on_gpu = Prepare(request, &response);
  ASSERT_TRUE(on_gpu.ok());
  EXPECT_EQ(cpu.RunCall(**on_gpu, &r).code(), absl::StatusCode::kInvalidArgument);

  request.set_device_uuid("cpu-0");
  auto on_cpu = Prepare(request, &response);
  ASSERT_TRUE(on_cpu.ok());
  engine::StepResult ok;
  ASSERT_TRUE(cpu.RunCall(**on_cpu, &ok).ok());
  EXPECT_EQ(ok.device, "cpu-0");
  EXPECT_EQ(ok.impl, "cpu");
  EXPECT_EQ(ok.copied_h2d + ok.copied_d2h + ok.count_readback, 0u);
}

TEST_F(OpCallTest, DeviceRegionsNeedADeviceBackend) {
  const Case c(2, 8, 32, 8);
  std::memcpy(device_, c.kv.raw(), Span(c.kv));
  v1::SparseMlaRequest request = c.InlineRequest();
  *request.mutable_kv() = InRegion(Layout(c.kv, v1::DTYPE_BF16), "dev", 0);
  v1::SparseMlaResponse response;
  auto prepared = Prepare(request, &response);
  ASSERT_TRUE(prepared.ok());
  kernels::ThreadPool pool(1);
  engine::CpuBackend cpu(&pool);
  engine::StepResult r;
  EXPECT_EQ(cpu.RunCall(**prepared, &r).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace attnd::server::ops
