// An in-process attnd on the GPU backend (skipped without a GPU): GetInfo's devices, SparseMla
// inline and through a host region against the CPU kernel, the CallStats of a GPU call (device,
// bytes moved both ways, graph capture then hit), pool exhaustion, request option errors, a
// stream-ordered call, and the GPU metric families.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/common/bf16.h"
#include "server/engine/gpu_backend_factory.h"
#include "tests/server/daemon_fixture.h"

namespace attnd::server::testing {
namespace {

std::string Scrape(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) body.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return body;
}

// out (bf16) and lse (f32) of a reply against the CPU kernel's: the GPU kernels accumulate in
// another order, so within bf16 rounding (out) and 1e-3 (lse), -inf where the CPU has -inf.
void ExpectCloseToCpu(const std::string& out, const HostTensor& want_out, const std::string& lse,
                      const HostTensor& want_lse) {
  ASSERT_EQ(out.size(), SpanBytes(want_out));
  ASSERT_EQ(lse.size(), SpanBytes(want_lse));
  const auto* got_o = reinterpret_cast<const uint16_t*>(out.data());
  const auto* want_o = want_out.data<uint16_t>();
  double err = 0, norm = 0;
  for (size_t i = 0; i < out.size() / 2; ++i) {
    const double g = kernels::Bf16ToFloat(got_o[i]), w = kernels::Bf16ToFloat(want_o[i]);
    ASSERT_TRUE(std::isfinite(g)) << "out element " << i;
    err += (g - w) * (g - w);
    norm += w * w;
  }
  EXPECT_LE(std::sqrt(err / std::max(norm, 1e-30)), 1e-2);
  const auto* got_l = reinterpret_cast<const float*>(lse.data());
  const float* want_l = want_lse.data<float>();
  for (size_t i = 0; i < lse.size() / 4; ++i) {
    if (std::isinf(want_l[i])) {
      EXPECT_EQ(got_l[i], want_l[i]) << "lse " << i;
    } else {
      EXPECT_NEAR(got_l[i], want_l[i], 1e-3) << "lse " << i;
    }
  }
}

class GpuDaemonTest : public DaemonTest {
 protected:
  void SetUp() override {
    if (engine::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU";
    DaemonTest::SetUp();
  }
  bool WithMetrics() const override { return true; }
  void Configure(DaemonConfig* config) override {
    config->backend = engine::GpuBackendName();
    config->pool_bytes = int64_t{512} << 20;
  }
};

TEST_F(GpuDaemonTest, GetInfoListsTheGpus) {
  grpc::ClientContext ctx;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub_->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok());
  EXPECT_EQ(info.backend(), engine::GpuBackendName());
  ASSERT_GE(info.devices_size(), 1);
  for (const auto& d : info.devices()) {
    EXPECT_EQ(d.uuid().rfind("GPU-", 0), 0u) << d.uuid();
    EXPECT_EQ(d.uuid().size(), 40u) << d.uuid();
    EXPECT_FALSE(d.name().empty());
    EXPECT_GT(d.memory_bytes(), 0u);
    EXPECT_FALSE(d.arch().empty());
    EXPECT_GT(d.cores(), 0);
  }
  EXPECT_EQ(info.limits().pool_bytes_per_device(), uint64_t{512} << 20);
  EXPECT_TRUE(info.limits().graphs());
  EXPECT_EQ(info.limits().streams_per_device(), 4);
}

// MPS (docs/OPERATIONS.md "MPS"): GetInfo's mps and attnd_gpu_mps agree for every device; false
// on HIP; with ATTND_EXPECT_MPS=1 or 0 (scripts/run-gpu-suite.sh sets it) the value it must be.
TEST_F(GpuDaemonTest, MpsIsReportedInGetInfoAndTheGauge) {
  grpc::ClientContext ctx;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub_->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok());
  ASSERT_GE(info.devices_size(), 1);
  const char* expect = std::getenv("ATTND_EXPECT_MPS");
  const std::string m = Scrape(daemon_->metrics_address());
  for (const auto& d : info.devices()) {
    if (info.backend() != "cuda") {
      EXPECT_FALSE(d.mps()) << d.uuid() << ": MPS is CUDA's";
    }
    if (info.backend() == "cuda" && expect != nullptr && std::string(expect) == "1") {
      EXPECT_TRUE(d.mps()) << d.uuid() << ": ATTND_EXPECT_MPS=1 but the daemon is no MPS client";
    }
    if (info.backend() == "cuda" && expect != nullptr && std::string(expect) == "0") {
      EXPECT_FALSE(d.mps()) << d.uuid() << ": ATTND_EXPECT_MPS=0 but an MPS server serves it";
    }
    const std::string series =
        "\nattnd_gpu_mps{device=\"" + d.uuid() + "\"} " + (d.mps() ? "1" : "0") + "\n";
    EXPECT_NE(m.find(series), std::string::npos) << series << m;
  }
}

TEST_F(GpuDaemonTest, SparseMlaInlineRunsOnTheGpuAndReplaysItsGraph) {
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    v1::SparseMlaResponse reply;
    const grpc::Status s = stub_->SparseMla(&ctx, InlineRequest(), &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ExpectCloseToCpu(reply.out().inline_data(), want_out_, reply.lse().inline_data(), want_lse_);
    const v1::CallStats& st = reply.stats();
    EXPECT_NE(st.impl(), "cpu") << "a GPU implementation ran";
    EXPECT_EQ(st.device_uuid().rfind("GPU-", 0), 0u);
    EXPECT_EQ(st.copied_bytes_in(), SpanBytes(q_) + SpanBytes(kv_) + SpanBytes(indices_));
    EXPECT_EQ(st.copied_bytes_host_to_device(), st.copied_bytes_in());
    EXPECT_EQ(st.copied_bytes_device_to_host(), SpanBytes(want_out_) + SpanBytes(want_lse_));
    EXPECT_EQ(st.count_readback_bytes(), 0u) << "inline indices are counted on the host";
    EXPECT_EQ(st.work_count(), "exact");
    EXPECT_GT(st.compute_seconds(), 0);
    EXPECT_EQ(st.graph(), i == 0 ? "capture" : "hit") << "call " << i;
  }
  const std::string m = Scrape(daemon_->metrics_address());
  EXPECT_NE(m.find("attnd_graph_cache_total{result=\"hit\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("attnd_graph_cache_total{result=\"capture\"} 1"), std::string::npos);
  EXPECT_NE(m.find("attnd_copied_bytes_total{direction=\"host_to_device\"}"), std::string::npos);
  EXPECT_NE(m.find("attnd_pool_reserved_bytes{device=\"GPU-"), std::string::npos);
  EXPECT_NE(m.find("attnd_build_info{backend=\"" + std::string(engine::GpuBackendName())),
            std::string::npos);
}

// IndexerLogits: unset runs HIGH (cuda_mma at this shape) and FAST the fp8 wgmma kernel on a
// compute capability 9.0 device; each reply names the precision that ran, and FAST's logits are
// within its relative L2 bound (ceil(D/32)·2^-13, docs/ACCURACY.md) of the CPU's exact ones.
TEST_F(GpuDaemonTest, IndexerLogitsFastRunsTheTensorCoreKernel) {
  grpc::ClientContext info_ctx;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub_->GetInfo(&info_ctx, v1::GetInfoRequest(), &info).ok());
  const bool hopper = info.backend() == "cuda" && info.devices(0).arch() == "9.0";
  const IndexerCase c;
  const HostTensor want = c.Local(kernels::Precision::kHigh);
  for (const v1::Precision precision : {v1::PRECISION_UNSPECIFIED, v1::PRECISION_FAST}) {
    SCOPED_TRACE(v1::Precision_Name(precision));
    grpc::ClientContext ctx;
    v1::IndexerLogitsResponse reply;
    const grpc::Status s = stub_->IndexerLogits(&ctx, c.Request(precision), &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    const bool fast = precision == v1::PRECISION_FAST;
    EXPECT_EQ(reply.stats().precision(), fast ? v1::PRECISION_FAST : v1::PRECISION_HIGH);
    EXPECT_NE(reply.stats().impl(), "cpu");
    if (hopper) {
      EXPECT_EQ(reply.stats().impl() == "cuda_wgmma", fast) << reply.stats().impl();
    } else {
      EXPECT_NE(reply.stats().impl(), "cuda_wgmma");
    }
    ASSERT_EQ(reply.logits().inline_data().size(), SpanBytes(want));
    const auto* got = reinterpret_cast<const float*>(reply.logits().inline_data().data());
    double err = 0, norm = 0;
    for (int64_t i = 0; i < IndexerCase::kM * IndexerCase::kN; ++i) {
      const double w = want.data<float>()[i];
      if (std::isinf(w)) {
        EXPECT_EQ(got[i], w) << "element " << i;
        continue;
      }
      ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
      err += (got[i] - w) * (got[i] - w);
      norm += w * w;
    }
    const double bound = fast ? ((IndexerCase::kDim + 31) / 32) * std::ldexp(1.0, -13) : 1e-5;
    EXPECT_LE(std::sqrt(err / norm), bound);
  }
}

TEST_F(GpuDaemonTest, HostRegionsAreDmaCopies) {
  ScopedShm shm(8 << 20);
  ASSERT_TRUE(shm.ok());
  {
    grpc::ClientContext ctx;
    v1::RegisterHostRegionRequest reg;
    reg.set_name("tensors");
    reg.set_key(shm.key());
    reg.set_byte_size(shm.size());
    v1::RegisterRegionResponse r;
    ASSERT_TRUE(stub_->RegisterHostRegion(&ctx, reg, &r).ok());
  }
  v1::SparseMlaRequest req = InlineRequest();
  *req.mutable_kv() = RegionTensor(kv_, v1::DTYPE_BF16, shm, "tensors", 0);
  const uint64_t out_at = 4 << 20;
  req.mutable_out()->mutable_region()->set_region("tensors");
  req.mutable_out()->mutable_region()->set_offset(out_at);
  grpc::ClientContext ctx;
  v1::SparseMlaResponse reply;
  const grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ExpectCloseToCpu(std::string(shm.data() + out_at, SpanBytes(want_out_)), want_out_,
                   reply.lse().inline_data(), want_lse_);
  const v1::CallStats& st = reply.stats();
  EXPECT_EQ(st.copied_bytes_in(), SpanBytes(q_) + SpanBytes(indices_));
  // q, indices (inline) and kv (host region) in; out's prior bytes too (kept where untouched).
  EXPECT_EQ(st.copied_bytes_host_to_device(),
            SpanBytes(q_) + SpanBytes(indices_) + SpanBytes(kv_) + SpanBytes(want_out_));
  EXPECT_EQ(st.copied_bytes_device_to_host(), SpanBytes(want_out_) + SpanBytes(want_lse_));
}

TEST_F(GpuDaemonTest, RequestOptionErrors) {
  v1::SparseMlaRequest req = InlineRequest();
  req.set_ready_event("short");
  grpc::ClientContext c1;
  v1::SparseMlaResponse reply;
  EXPECT_EQ(stub_->SparseMla(&c1, req, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  req.clear_ready_event();
  req.set_device_uuid("GPU-00000000-0000-0000-0000-000000000000");
  grpc::ClientContext c2;
  EXPECT_EQ(stub_->SparseMla(&c2, req, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::RegisterDeviceRegionRequest dev;
  dev.set_name("garbage");
  dev.set_raw_handle(std::string(64, '\x01'));
  dev.set_byte_size(4096);
  grpc::ClientContext c3;
  v1::RegisterRegionResponse r;
  EXPECT_EQ(stub_->RegisterDeviceRegion(&c3, dev, &r).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A stream-ordered call on the GPU daemon (docs/SERVICE.md "Stream-ordered calls and prepared
// calls"): signal words in a host region; the reply says enqueued, the GPU writes nothing until
// ready reaches the value, then out matches the CPU kernel and done holds the value.
TEST_F(GpuDaemonTest, StreamOrderedCallWaitsForReadyThenStoresDone) {
  ScopedShm shm(8 << 20);
  ASSERT_TRUE(shm.ok());
  {
    grpc::ClientContext ctx;
    v1::RegisterHostRegionRequest reg;
    reg.set_name("so");
    reg.set_key(shm.key());
    reg.set_byte_size(shm.size());
    v1::RegisterRegionResponse r;
    ASSERT_TRUE(stub_->RegisterHostRegion(&ctx, reg, &r).ok());
  }
  const uint64_t out_at = 4 << 20, lse_at = 6 << 20, ready_at = 7 << 20, done_at = ready_at + 8;
  std::memset(shm.data() + out_at, 0xff, SpanBytes(want_out_));  // NaN poison
  std::memset(shm.data() + lse_at, 0xff, SpanBytes(want_lse_));
  auto word = [&](uint64_t at) -> std::atomic<uint64_t>& {
    return *reinterpret_cast<std::atomic<uint64_t>*>(shm.data() + at);
  };
  word(ready_at).store(0);
  word(done_at).store(0);
  v1::SparseMlaRequest req = InlineRequest();
  *req.mutable_kv() = RegionTensor(kv_, v1::DTYPE_BF16, shm, "so", 0);
  req.mutable_out()->mutable_region()->set_region("so");
  req.mutable_out()->mutable_region()->set_offset(out_at);
  req.mutable_lse()->mutable_region()->set_region("so");
  req.mutable_lse()->mutable_region()->set_offset(lse_at);
  for (auto [sig, at, value] :
       {std::tuple<v1::Signal*, uint64_t, uint64_t>{req.mutable_ready(), ready_at, 3},
        std::tuple<v1::Signal*, uint64_t, uint64_t>{req.mutable_done(), done_at, 5}}) {
    sig->mutable_slice()->set_region("so");
    sig->mutable_slice()->set_offset(at);
    sig->set_value(value);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::SparseMlaResponse reply;
  const grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(reply.stats().enqueued());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto* out_bytes = reinterpret_cast<const uint8_t*>(shm.data() + out_at);
  EXPECT_EQ(out_bytes[0], 0xff);  // not run before ready
  EXPECT_EQ(word(done_at).load(), 0u);
  word(ready_at).store(3, std::memory_order_release);
  uint64_t done = 0;
  for (int i = 0; i < 10000 && (done = word(done_at).load(std::memory_order_acquire)) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(done, 5u);
  ExpectCloseToCpu(std::string(shm.data() + out_at, SpanBytes(want_out_)), want_out_,
                   std::string(shm.data() + lse_at, SpanBytes(want_lse_)), want_lse_);
}

// One daemon serves every visible GPU: calls addressed by device UUID run on that device, from
// one thread per device at once, each device capturing its own graph. With one GPU this covers
// the addressing path; on a 2-GPU host it runs both devices concurrently.
TEST_F(GpuDaemonTest, EachDeviceRunsTheCallsAddressedToItConcurrently) {
  grpc::ClientContext info_ctx;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub_->GetInfo(&info_ctx, v1::GetInfoRequest(), &info).ok());
  ASSERT_EQ(info.devices_size(), engine::VisibleGpuCount());
  constexpr int kCallsPerDevice = 4;
  struct Result {
    std::vector<grpc::Status> status;
    std::vector<v1::SparseMlaResponse> reply;
  };
  std::vector<Result> results(info.devices_size());
  std::vector<std::thread> threads;
  for (int d = 0; d < info.devices_size(); ++d) {
    threads.emplace_back([&, d] {
      v1::SparseMlaRequest req = InlineRequest();
      req.set_device_uuid(info.devices(d).uuid());
      for (int i = 0; i < kCallsPerDevice; ++i) {
        grpc::ClientContext ctx;
        v1::SparseMlaResponse reply;
        results[d].status.push_back(stub_->SparseMla(&ctx, req, &reply));
        results[d].reply.push_back(std::move(reply));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int d = 0; d < info.devices_size(); ++d) {
    SCOPED_TRACE("device " + info.devices(d).uuid());
    for (int i = 0; i < kCallsPerDevice; ++i) {
      ASSERT_TRUE(results[d].status[i].ok()) << results[d].status[i].error_message();
      const v1::SparseMlaResponse& reply = results[d].reply[i];
      EXPECT_EQ(reply.stats().device_uuid(), info.devices(d).uuid()) << "call " << i;
      EXPECT_NE(reply.stats().impl(), "cpu");
      ExpectCloseToCpu(reply.out().inline_data(), want_out_, reply.lse().inline_data(), want_lse_);
    }
    int captures = 0;
    for (const auto& reply : results[d].reply) captures += reply.stats().graph() == "capture";
    EXPECT_EQ(captures, 1) << "each device captures its own graph once";
  }
  std::printf("served %d device(s) concurrently\n", info.devices_size());
}

class TinyPoolTest : public GpuDaemonTest {
 protected:
  void Configure(DaemonConfig* config) override {
    GpuDaemonTest::Configure(config);
    config->pool_bytes = 16 << 20;  // the fixture's call fits (with its split-K workspace)
  }
};

TEST_F(TinyPoolTest, ExhaustionIsResourceExhaustedAndTheDaemonKeepsServing) {
  // A kv of 22 MB cannot be staged into a 16 MiB pool.
  v1::SparseMlaRequest big = InlineRequest();
  HostTensor kv = HostTensor::Dense(DType::kBF16, {20000, kDqk});
  std::mt19937_64 rng = attnd::testing::MakeRng();
  attnd::testing::FillNormal(kv, rng, 1.0);
  *big.mutable_kv() = InlineTensor(kv, v1::DTYPE_BF16);
  grpc::ClientContext c1;
  v1::SparseMlaResponse reply;
  const grpc::Status s = stub_->SparseMla(&c1, big, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("memory pool exhausted"), std::string::npos);
  grpc::ClientContext c2;
  const grpc::Status ok = stub_->SparseMla(&c2, InlineRequest(), &reply);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  ExpectCloseToCpu(reply.out().inline_data(), want_out_, reply.lse().inline_data(), want_lse_);
}

}  // namespace
}  // namespace attnd::server::testing
