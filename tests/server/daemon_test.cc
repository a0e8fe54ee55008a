// An in-process attnd (Daemon) driven by the generated gRPC stubs: GetInfo, health, SparseMla and
// DsaAttention inline and through host regions (checked bit for bit against the kernels run
// locally), status codes, metrics.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <vector>

#include "tests/server/daemon_fixture.h"

namespace attnd::server::testing {
namespace {

TEST_F(DaemonTest, GetInfo) {
  grpc::ClientContext ctx;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub_->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok());
  EXPECT_EQ(info.backend(), "cpu");
  EXPECT_FALSE(info.version().empty());
  ASSERT_EQ(info.devices_size(), 1);
  EXPECT_EQ(info.devices(0).cores(), 2);
  EXPECT_FALSE(info.devices(0).mps()) << "the CPU backend has no MPS";
  bool has_sparse_mla = false;
  for (const auto& op : info.ops()) has_sparse_mla |= op.name() == "sparse_mla";
  EXPECT_TRUE(has_sparse_mla);
  EXPECT_TRUE(info.limits().allow_client_shm());
  EXPECT_EQ(info.limits().device_handle_bytes(), 64u);
}

TEST_F(DaemonTest, HealthIsServing) {
  grpc::GenericStub generic(channel_);
  grpc::ClientContext ctx;
  grpc::Slice empty("");  // HealthCheckRequest{service: ""} serialises to no bytes
  grpc::ByteBuffer request(&empty, 1), response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) { done.set_value(s); });
  ASSERT_TRUE(done.get_future().get().ok());
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // status: SERVING
}

TEST_F(DaemonTest, SparseMlaInlineMatchesTheKernel) {
  grpc::ClientContext ctx;
  v1::SparseMlaResponse reply;
  const grpc::Status s = stub_->SparseMla(&ctx, InlineRequest(), &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(reply.out().inline_data().size(), SpanBytes(want_out_));
  EXPECT_EQ(std::memcmp(reply.out().inline_data().data(), want_out_.raw(), SpanBytes(want_out_)),
            0);
  for (size_t i = 0; i < SpanBytes(want_out_); i += 2) {
    if (std::memcmp(reply.out().inline_data().data() + i, want_out_.raw() + i, 2) != 0) {
      ADD_FAILURE() << "first difference at element " << i / 2;
      break;
    }
  }
  ASSERT_EQ(reply.lse().inline_data().size(), SpanBytes(want_lse_));
  EXPECT_EQ(std::memcmp(reply.lse().inline_data().data(), want_lse_.raw(), SpanBytes(want_lse_)),
            0);
  EXPECT_EQ(reply.out().dtype(), v1::DTYPE_BF16);
  ASSERT_EQ(reply.out().shape_size(), 3);
  EXPECT_EQ(reply.out().shape(2), 512);
  const v1::CallStats& st = reply.stats();
  EXPECT_EQ(st.impl(), "cpu");
  EXPECT_GT(st.compute_seconds(), 0);
  EXPECT_GE(st.total_seconds(), st.compute_seconds());
  // The phases (docs/LATENCY.md): prepare (inline inputs staged) and run (the step's wall,
  // around its compute) are measured; with queue they fit in total.
  EXPECT_GT(st.prepare_seconds(), 0);
  EXPECT_GE(st.run_seconds(), st.compute_seconds());
  EXPECT_LE(st.prepare_seconds() + st.queue_seconds() + st.run_seconds(), st.total_seconds());
  EXPECT_GT(st.flops(), 0);
  EXPECT_GT(st.logical_bytes(), 0);
  EXPECT_EQ(st.copied_bytes_in(), SpanBytes(q_) + SpanBytes(kv_) + SpanBytes(indices_));
  EXPECT_EQ(st.copied_bytes_out(), SpanBytes(want_out_) + SpanBytes(want_lse_));
}

// The precision field: unset runs FAST (what the fixture's local run used), HIGH runs the kernel's
// HIGH numerics (bit for bit the local HIGH run, which differs from FAST), CallStats names what
// ran (index_precision, DsaAttention's, stays UNSPECIFIED), GetInfo lists both for the attention
// and indexer ops only, and a value outside the enum is refused.
TEST_F(DaemonTest, PrecisionFieldSelectsAndReportsTheNumerics) {
  {
    grpc::ClientContext ctx;
    v1::SparseMlaResponse reply;
    ASSERT_TRUE(stub_->SparseMla(&ctx, InlineRequest(), &reply).ok());
    EXPECT_EQ(reply.stats().precision(), v1::PRECISION_FAST);
    EXPECT_EQ(reply.stats().index_precision(), v1::PRECISION_UNSPECIFIED);
  }
  HostTensor high_out = HostTensor::Dense(DType::kBF16, {kT, kH, 512});
  HostTensor high_lse = HostTensor::Dense(DType::kF32, {kT, kH});
  kernels::sparse_mla::Params p;
  p.q = q_.tensor();
  p.kv = kv_.tensor();
  p.indices = indices_.tensor();
  p.sm_scale = kScale;
  p.precision = kernels::Precision::kHigh;
  p.out = high_out.tensor();
  p.lse = high_lse.tensor();
  kernels::ExecContext local;
  local.pool = attnd::testing::TestPool();
  ASSERT_TRUE(kernels::sparse_mla::Run(p, local).ok());
  EXPECT_NE(std::memcmp(high_out.raw(), want_out_.raw(), SpanBytes(want_out_)), 0)
      << "HIGH and FAST gave the same bits: the case does not tell them apart";
  for (const v1::Precision precision : {v1::PRECISION_FAST, v1::PRECISION_HIGH}) {
    v1::SparseMlaRequest req = InlineRequest();
    req.set_precision(precision);
    grpc::ClientContext ctx;
    v1::SparseMlaResponse reply;
    const grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(reply.stats().precision(), precision);
    const HostTensor& want = precision == v1::PRECISION_HIGH ? high_out : want_out_;
    ASSERT_EQ(reply.out().inline_data().size(), SpanBytes(want));
    EXPECT_EQ(std::memcmp(reply.out().inline_data().data(), want.raw(), SpanBytes(want)), 0)
        << v1::Precision_Name(precision);
  }
  {
    v1::SparseMlaRequest req = InlineRequest();
    req.set_precision(static_cast<v1::Precision>(7));
    grpc::ClientContext ctx;
    v1::SparseMlaResponse reply;
    const grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("precision"), std::string::npos) << s.error_message();
  }
  grpc::ClientContext ctx;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub_->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok());
  for (const auto& op : info.ops()) {
    const bool option = op.name() == "sparse_mla" || op.name() == "mla_decode" ||
                        op.name() == "mla_prefill" || op.name() == "dsa_attention" ||
                        op.name() == "indexer_logits" || op.name() == "indexer_logits_paged";
    ASSERT_EQ(op.precisions_size(), option ? 2 : 0) << op.name();
    if (option) {
      EXPECT_EQ(op.precisions(0), v1::PRECISION_FAST) << op.name();
      EXPECT_EQ(op.precisions(1), v1::PRECISION_HIGH) << op.name();
    }
  }
}

// batch_invariant: the request's field reaches the op's params (CallStats echoes the params'
// value, and the out is bit for bit a local run with the option), and GetInfo lists the option
// for sparse_mla, mla_decode and dsa_attention only.
TEST_F(DaemonTest, BatchInvariantFieldReachesTheParams) {
  HostTensor inv_out = HostTensor::Dense(DType::kBF16, {kT, kH, 512});
  HostTensor inv_lse = HostTensor::Dense(DType::kF32, {kT, kH});
  kernels::sparse_mla::Params p;
  p.q = q_.tensor();
  p.kv = kv_.tensor();
  p.indices = indices_.tensor();
  p.sm_scale = kScale;
  p.batch_invariant = true;
  p.out = inv_out.tensor();
  p.lse = inv_lse.tensor();
  kernels::ExecContext local;
  local.pool = attnd::testing::TestPool();
  ASSERT_TRUE(kernels::sparse_mla::Run(p, local).ok());
  for (const bool invariant : {false, true}) {
    v1::SparseMlaRequest req = InlineRequest();
    req.set_batch_invariant(invariant);
    grpc::ClientContext ctx;
    v1::SparseMlaResponse reply;
    const grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(reply.stats().batch_invariant(), invariant);
    if (invariant) {
      ASSERT_EQ(reply.out().inline_data().size(), SpanBytes(inv_out));
      EXPECT_EQ(std::memcmp(reply.out().inline_data().data(), inv_out.raw(), SpanBytes(inv_out)),
                0);
    }
  }
  grpc::ClientContext ctx;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub_->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok());
  for (const auto& op : info.ops()) {
    const bool option =
        op.name() == "sparse_mla" || op.name() == "mla_decode" || op.name() == "dsa_attention";
    EXPECT_EQ(op.batch_invariant(), option) << op.name();
  }
}

// IndexerLogits' precision: unset runs HIGH (DESIGN.md §2's exact contract), FAST is opt-in and
// reported; on the CPU both are the exact f32 sums, bit for bit the local run; a value outside
// the enum is refused naming the field.
TEST_F(DaemonTest, IndexerLogitsPrecisionDefaultsToHighAndFastIsReported) {
  const IndexerCase c;
  const HostTensor want = c.Local(kernels::Precision::kHigh);
  for (const v1::Precision precision :
       {v1::PRECISION_UNSPECIFIED, v1::PRECISION_HIGH, v1::PRECISION_FAST}) {
    SCOPED_TRACE(v1::Precision_Name(precision));
    grpc::ClientContext ctx;
    v1::IndexerLogitsResponse reply;
    const grpc::Status s = stub_->IndexerLogits(&ctx, c.Request(precision), &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(reply.stats().precision(),
              precision == v1::PRECISION_FAST ? v1::PRECISION_FAST : v1::PRECISION_HIGH);
    EXPECT_EQ(reply.stats().impl(), "cpu");
    ASSERT_EQ(reply.logits().inline_data().size(), SpanBytes(want));
    EXPECT_EQ(std::memcmp(reply.logits().inline_data().data(), want.raw(), SpanBytes(want)), 0);
  }
  grpc::ClientContext ctx;
  v1::IndexerLogitsResponse reply;
  const grpc::Status s =
      stub_->IndexerLogits(&ctx, c.Request(static_cast<v1::Precision>(7)), &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("precision:", 0), 0u) << s.error_message();
}

TEST_F(DaemonTest, SparseMlaThroughRegionsCopiesNothing) {
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
  v1::SparseMlaRequest req;
  uint64_t off = 0;
  *req.mutable_q() = RegionTensor(q_, v1::DTYPE_BF16, shm, "tensors", off);
  off += 1 << 20;
  *req.mutable_kv() = RegionTensor(kv_, v1::DTYPE_BF16, shm, "tensors", off);
  off += 1 << 20;
  *req.mutable_indices() = RegionTensor(indices_, v1::DTYPE_I32, shm, "tensors", off);
  off += 1 << 20;
  const uint64_t out_off = off, lse_off = off + (1 << 20);
  req.mutable_out()->mutable_region()->set_region("tensors");
  req.mutable_out()->mutable_region()->set_offset(out_off);
  req.mutable_lse()->mutable_region()->set_region("tensors");
  req.mutable_lse()->mutable_region()->set_offset(lse_off);
  req.set_sm_scale(kScale);
  grpc::ClientContext ctx;
  v1::SparseMlaResponse reply;
  const grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(std::memcmp(shm.data() + out_off, want_out_.raw(), SpanBytes(want_out_)), 0);
  EXPECT_EQ(std::memcmp(shm.data() + lse_off, want_lse_.raw(), SpanBytes(want_lse_)), 0);
  EXPECT_EQ(reply.stats().copied_bytes_in(), 0u);
  EXPECT_EQ(reply.stats().copied_bytes_out(), 0u);
  EXPECT_TRUE(reply.out().has_region());
  EXPECT_TRUE(reply.out().inline_data().empty());
}

TEST_F(DaemonTest, StatusCodes) {
  v1::SparseMlaRequest req = InlineRequest();
  req.mutable_kv()->mutable_region()->set_region("unknown");
  grpc::ClientContext c1;
  v1::SparseMlaResponse reply;
  const grpc::Status unknown = stub_->SparseMla(&c1, req, &reply);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND) << unknown.error_message();

  req = InlineRequest();
  req.mutable_q()->set_shape(2, 575);  // and the inline size no longer matches
  grpc::ClientContext c2;
  const grpc::Status bad = stub_->SparseMla(&c2, req, &reply);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad.error_message().find("q:"), std::string::npos) << bad.error_message();

  req = InlineRequest();
  req.set_sm_scale(0);
  grpc::ClientContext c3;
  EXPECT_EQ(stub_->SparseMla(&c3, req, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  grpc::ClientContext c4;
  v1::RegisterDeviceRegionRequest dev;
  dev.set_name("d");
  dev.set_raw_handle(std::string(64, 'x'));
  dev.set_byte_size(4096);
  v1::RegisterRegionResponse r;
  EXPECT_EQ(stub_->RegisterDeviceRegion(&c4, dev, &r).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  grpc::ClientContext c5;
  v1::UnregisterRegionRequest unreg;
  unreg.set_name("never-registered");
  v1::UnregisterRegionResponse ur;
  EXPECT_EQ(stub_->UnregisterRegion(&c5, unreg, &ur).error_code(), grpc::StatusCode::NOT_FOUND);

  grpc::ClientContext c6;
  c6.set_deadline(std::chrono::system_clock::now() - std::chrono::seconds(1));
  EXPECT_EQ(stub_->SparseMla(&c6, InlineRequest(), &reply).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST_F(DaemonTest, DsaAttentionInlineMatchesTheKernel) {
  constexpr int64_t kT = 6, kHi = 8, kDi = 64, kN = 200, kTopk = 32, kH = 16;
  std::mt19937_64 rng = attnd::testing::MakeRng();
  HostTensor q_index = HostTensor::Dense(DType::kFp8E4M3, {kT, kHi, kDi});
  HostTensor k_index = HostTensor::Dense(DType::kFp8E4M3, {kN, kDi});
  HostTensor k_scale = HostTensor::Dense(DType::kF32, {kN});
  HostTensor weights = HostTensor::Dense(DType::kF32, {kT, kHi});
  HostTensor ks = HostTensor::Dense(DType::kI32, {kT});
  HostTensor ke = HostTensor::Dense(DType::kI32, {kT});
  HostTensor q = HostTensor::Dense(DType::kBF16, {kT, kH, kDqk});
  HostTensor kv = HostTensor::Dense(DType::kBF16, {kN, kDqk});
  for (HostTensor* t : {&q_index, &k_index, &q, &kv}) attnd::testing::FillNormal(*t, rng, 1.0);
  attnd::testing::FillUniform(k_scale, rng, 0.5, 1.5);
  attnd::testing::FillUniform(weights, rng, -1.0, 1.0);
  for (int64_t t = 0; t < kT; ++t) {  // causal prefill of the last kT tokens
    ks.data<int32_t>()[t] = 0;
    ke.data<int32_t>()[t] = static_cast<int32_t>(kN - kT + t + 1);
  }
  HostTensor want_out = HostTensor::Dense(DType::kBF16, {kT, kH, 512});
  HostTensor want_lse = HostTensor::Dense(DType::kF32, {kT, kH});
  HostTensor want_idx = HostTensor::Dense(DType::kI32, {kT, kTopk});
  kernels::dsa::Params p;
  p.index_q = q_index.tensor();
  p.index_k = k_index.tensor();
  p.index_k_scale = k_scale.tensor();
  p.index_weights = weights.tensor();
  p.ks = ks.tensor();
  p.ke = ke.tensor();
  p.topk = kTopk;
  p.q = q.tensor();
  p.kv = kv.tensor();
  p.sm_scale = kScale;
  p.out = want_out.tensor();
  p.lse = want_lse.tensor();
  p.indices = want_idx.tensor();
  kernels::ExecContext ctx;
  ctx.pool = attnd::testing::TestPool();
  ASSERT_TRUE(kernels::dsa::Run(p, ctx).ok());

  v1::DsaAttentionRequest req;
  *req.mutable_index_q() = InlineTensor(q_index, v1::DTYPE_FP8_E4M3);
  *req.mutable_index_k() = InlineTensor(k_index, v1::DTYPE_FP8_E4M3);
  *req.mutable_index_k_scale() = InlineTensor(k_scale, v1::DTYPE_F32);
  *req.mutable_index_weights() = InlineTensor(weights, v1::DTYPE_F32);
  *req.mutable_ks() = InlineTensor(ks, v1::DTYPE_I32);
  *req.mutable_ke() = InlineTensor(ke, v1::DTYPE_I32);
  req.set_topk(kTopk);
  *req.mutable_q() = InlineTensor(q, v1::DTYPE_BF16);
  *req.mutable_kv() = InlineTensor(kv, v1::DTYPE_BF16);
  req.set_sm_scale(kScale);
  req.mutable_indices();  // ask for the chosen indices too
  grpc::ClientContext cctx;
  v1::DsaAttentionResponse reply;
  const grpc::Status s = stub_->DsaAttention(&cctx, req, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(reply.out().inline_data().size(), SpanBytes(want_out));
  EXPECT_EQ(std::memcmp(reply.out().inline_data().data(), want_out.raw(), SpanBytes(want_out)), 0);
  EXPECT_EQ(std::memcmp(reply.lse().inline_data().data(), want_lse.raw(), SpanBytes(want_lse)), 0);
  ASSERT_EQ(reply.indices().inline_data().size(), SpanBytes(want_idx));
  EXPECT_EQ(std::memcmp(reply.indices().inline_data().data(), want_idx.raw(), SpanBytes(want_idx)),
            0);
  EXPECT_FALSE(reply.has_logits());
  EXPECT_GT(reply.stats().flops(), 0);
  EXPECT_EQ(reply.stats().precision(), v1::PRECISION_FAST);
  EXPECT_EQ(reply.stats().index_precision(), v1::PRECISION_HIGH);  // unset: the exact indexer
}

// GET http://<address>/metrics over a plain socket; empty on failure.
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
      while ((n = read(fd, buf, sizeof(buf))) > 0) body.append(buf, n);
    }
  }
  close(fd);
  return body;
}

class DaemonMetricsTest : public DaemonTest {
 protected:
  bool WithMetrics() const override { return true; }
};

TEST_F(DaemonMetricsTest, CountersMoveWithCalls) {
  ASSERT_FALSE(daemon_->metrics_address().empty());
  std::string before = Scrape(daemon_->metrics_address());
  EXPECT_NE(before.find("attnd_requests_total{code=\"OK\",op=\"sparse_mla\"} 0"),
            std::string::npos);
  EXPECT_NE(before.find("attnd_build_info{backend=\"cpu\""), std::string::npos);
  grpc::ClientContext ctx;
  v1::SparseMlaResponse reply;
  ASSERT_TRUE(stub_->SparseMla(&ctx, InlineRequest(), &reply).ok());
  grpc::ClientContext bad_ctx;
  v1::SparseMlaRequest bad = InlineRequest();
  bad.set_sm_scale(-1);
  EXPECT_FALSE(stub_->SparseMla(&bad_ctx, bad, &reply).ok());
  const std::string after = Scrape(daemon_->metrics_address());
  EXPECT_NE(after.find("attnd_requests_total{code=\"OK\",op=\"sparse_mla\"} 1"), std::string::npos)
      << after;
  EXPECT_NE(after.find("attnd_requests_total{code=\"INVALID_ARGUMENT\",op=\"sparse_mla\"} 1"),
            std::string::npos);
  EXPECT_NE(after.find("attnd_compute_duration_seconds_count{impl=\"cpu\",op=\"sparse_mla\"} 1"),
            std::string::npos);
  EXPECT_NE(after.find("attnd_copied_bytes_total{direction=\"in\"}"), std::string::npos);
  EXPECT_NE(after.find("attnd_inflight_requests 0"), std::string::npos);
}

// MPS (docs/OPERATIONS.md "MPS") is CUDA's: on the CPU backend GetInfo's device says mps=false
// and attnd_gpu_mps has that device's series at 0 from the first scrape.
TEST_F(DaemonMetricsTest, MpsIsOffOnTheCpuBackend) {
  grpc::ClientContext ctx;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub_->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok());
  ASSERT_EQ(info.devices_size(), 1);
  EXPECT_FALSE(info.devices(0).mps());
  const std::string text = Scrape(daemon_->metrics_address());
  EXPECT_NE(text.find("# TYPE attnd_gpu_mps gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("\nattnd_gpu_mps{device=\"" + info.devices(0).uuid() + "\"} 0\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("attnd_gpu_mps{device=\"" + info.devices(0).uuid() + "\"} 1"),
            std::string::npos);
}

// The value of an unlabelled gauge in a /metrics text; NaN when it is not there.
double GaugeValue(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(text.c_str() + at + key.size(), nullptr);
}

// One worker and calls that take a while: the gauges of the scheduler's queue must show calls
// waiting and the worker busy while they run, then nothing once all are answered.
class DaemonQueueMetricsTest : public DaemonMetricsTest {
 protected:
  void Configure(DaemonConfig* config) override {
    config->workers = 1;
    config->queue_capacity = 7;
  }
};

TEST_F(DaemonQueueMetricsTest, QueueDepthAndBusyWorkersMoveWithLoad) {
  const std::string address = daemon_->metrics_address();
  ASSERT_FALSE(address.empty());
  std::string idle = Scrape(address);
  EXPECT_EQ(GaugeValue(idle, "attnd_queue_depth"), 0) << idle;
  EXPECT_EQ(GaugeValue(idle, "attnd_workers_busy"), 0) << idle;
  EXPECT_EQ(GaugeValue(idle, "attnd_queue_capacity"), 7) << idle;
  EXPECT_EQ(GaugeValue(idle, "attnd_workers"), 1) << idle;

  // A sparse MLA call of ~2.3 GFLOP (tens to hundreds of ms on the CPU backend); its reply (2 MiB)
  // stays under the channel's default 4 MiB receive limit.
  constexpr int64_t kBigT = 64, kBigH = 32, kBigS = 2048, kBigK = 512;
  std::mt19937_64 rng = attnd::testing::MakeRng();
  HostTensor q = HostTensor::Dense(DType::kBF16, {kBigT, kBigH, kDqk});
  HostTensor kv = HostTensor::Dense(DType::kBF16, {kBigS, kDqk});
  HostTensor indices = HostTensor::Dense(DType::kI32, {kBigT, kBigK});
  attnd::testing::FillNormal(q, rng, 1.0);
  attnd::testing::FillNormal(kv, rng, 1.0);
  attnd::testing::FillUniformInt(indices, rng, 0, kBigS - 1);
  v1::SparseMlaRequest req;
  *req.mutable_q() = InlineTensor(q, v1::DTYPE_BF16);
  *req.mutable_kv() = InlineTensor(kv, v1::DTYPE_BF16);
  *req.mutable_indices() = InlineTensor(indices, v1::DTYPE_I32);
  req.set_sm_scale(kScale);

  constexpr int kCalls = 4;
  std::atomic<int> ok{0}, done{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < kCalls; ++i) {
    callers.emplace_back([&] {
      grpc::ClientContext ctx;
      v1::SparseMlaResponse reply;
      if (stub_->SparseMla(&ctx, req, &reply).ok()) ok.fetch_add(1);
      done.fetch_add(1);
    });
  }
  double max_depth = 0, max_busy = 0;
  while (done.load() < kCalls) {
    const std::string text = Scrape(address);
    max_depth = std::max(max_depth, GaugeValue(text, "attnd_queue_depth"));
    max_busy = std::max(max_busy, GaugeValue(text, "attnd_workers_busy"));
    EXPECT_LE(GaugeValue(text, "attnd_workers_busy"), 1) << text;
    EXPECT_LE(GaugeValue(text, "attnd_queue_depth"), kCalls - 1) << text;
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(ok.load(), kCalls);
  EXPECT_GE(max_depth, 1) << "no call was ever seen waiting";
  EXPECT_EQ(max_busy, 1) << "the worker was never seen busy";
  // A reply is sent before its worker counts itself idle: allow the last one a moment.
  std::string after;
  for (int i = 0; i < 500; ++i) {
    after = Scrape(address);
    if (GaugeValue(after, "attnd_workers_busy") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(GaugeValue(after, "attnd_queue_depth"), 0) << after;
  EXPECT_EQ(GaugeValue(after, "attnd_workers_busy"), 0) << after;
}

}  // namespace
}  // namespace attnd::server::testing
