// Errors carry google.rpc.Status details (docs/SERVICE.md "Status codes"): a bad tensor is a
// BadRequest naming the field, an unknown region a ResourceInfo with the name as sent, a full
// queue and a drain a RetryInfo; the C++ client reads them back (client/error_details.h). Device
// loss turns health NOT_SERVING (docs/SERVICE.md "Standard services"), shown with a fake backend.
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/error_details.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "kernels/common/status_details.h"
#include "kernels/common/tensor.h"
#include "kernels/dsa/dsa.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/engine/scheduler.h"
#include "server/grpc/health.h"
#include "server/grpc/status.h"
#include "server/metrics/metrics.h"
#include "tests/server/daemon_fixture.h"

namespace attnd::server::testing {
namespace {

using grpc_front::ToGrpcStatus;

google::rpc::Status Details(const grpc::Status& s) {
  google::rpc::Status out;
  EXPECT_FALSE(s.error_details().empty()) << s.error_message();
  EXPECT_TRUE(out.ParseFromString(s.error_details()));
  EXPECT_EQ(out.code(), static_cast<int>(s.error_code()));
  EXPECT_EQ(out.message(), s.error_message());
  return out;
}

template <class M>
std::vector<M> Unpacked(const google::rpc::Status& s) {
  std::vector<M> out;
  for (const auto& any : s.details()) {
    M m;
    if (any.Is<M>() && any.UnpackTo(&m)) out.push_back(m);
  }
  return out;
}

// ---- the conversion, from the statuses the layers produce ----

TEST(StatusDetailsTest, CheckTensorNamesTheFieldAndKeepsItsMessage) {
  char buf[64] = {};
  const kernels::Tensor q = kernels::MakeTensor(buf, kernels::DType::kBF16, {1, 2, 575});
  absl::Status s = kernels::CheckTensor(q, "q", kernels::DType::kBF16, {1, 2, 576});
  EXPECT_EQ(s.message(), "q: dim 2 is 575, want 576");
  EXPECT_EQ(kernels::BadField(s).value_or(""), "q.shape[2]");
  s = kernels::CheckTensor(q, "q", kernels::DType::kF32, {1, 2, 575});
  EXPECT_EQ(kernels::BadField(s).value_or(""), "q.dtype");
  s = kernels::CheckTensor(q, "q", kernels::DType::kBF16, {1, 575});
  EXPECT_EQ(kernels::BadField(s).value_or(""), "q.shape");
  s = kernels::CheckTensor(kernels::Tensor(), "lse", kernels::DType::kF32, {1});
  EXPECT_EQ(kernels::BadField(s).value_or(""), "lse");
  EXPECT_TRUE(kernels::CheckTensor(q, "q", kernels::DType::kBF16, {1, 2, 575}).ok());

  const grpc::Status g =
      ToGrpcStatus(kernels::CheckTensor(q, "q", kernels::DType::kBF16, {kernels::kAnyDim, 2, 576}));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(g.error_message(), "q: dim 2 is 575, want 576");  // the message as before
  const auto bad = Unpacked<google::rpc::BadRequest>(Details(g));
  ASSERT_EQ(bad.size(), 1u);
  ASSERT_EQ(bad[0].field_violations_size(), 1);
  EXPECT_EQ(bad[0].field_violations(0).field(), "q.shape[2]");
  EXPECT_EQ(bad[0].field_violations(0).description(), "q: dim 2 is 575, want 576");
  EXPECT_TRUE(Unpacked<google::rpc::RetryInfo>(Details(g)).empty());
  // The type URL any standard parser looks for.
  EXPECT_EQ(Details(g).details(0).type_url(), "type.googleapis.com/google.rpc.BadRequest");
}

TEST(StatusDetailsTest, PrefixKeepsThePayload) {
  absl::Status s = kernels::InvalidField("kv.shape[1]", "kv: dim 1 is 3, want 576");
  s = kernels::WithPrefix(s, "step: ");
  EXPECT_EQ(s.message(), "step: kv: dim 1 is 3, want 576");
  EXPECT_EQ(kernels::BadField(s).value_or(""), "kv.shape[1]");
  kernels::RenameBadField(&s, "k", "index_k");  // another tensor's name: unchanged
  EXPECT_EQ(kernels::BadField(s).value_or(""), "kv.shape[1]");
  kernels::RenameBadField(&s, "kv", "cache");
  EXPECT_EQ(kernels::BadField(s).value_or(""), "cache.shape[1]");
}

TEST(StatusDetailsTest, CompositeOpNamesTheFieldAsItsCallerDoes) {
  // dsa_attention validates its indexer step with the step's names (q); the field, like the
  // message, is the caller's (index_q).
  alignas(64) static char buf[1 << 16] = {};
  using kernels::DType;
  using kernels::MakeTensor;
  kernels::dsa::Params p;
  p.index_q = MakeTensor(buf, DType::kFp8E4M3, {1, 1, 100});  // head dim 100: not a multiple
  p.index_k = MakeTensor(buf, DType::kFp8E4M3, {4, 100});
  p.index_k_scale = MakeTensor(buf, DType::kF32, {4});
  p.index_weights = MakeTensor(buf, DType::kF32, {1, 1});
  p.ks = MakeTensor(buf, DType::kI32, {1});
  p.ke = MakeTensor(buf, DType::kI32, {1});
  p.topk = 2;
  p.q = MakeTensor(buf, DType::kBF16, {1, 16, 576});
  p.kv = MakeTensor(buf, DType::kBF16, {4, 576});
  p.sm_scale = 0.1f;
  p.out = MakeTensor(buf, DType::kBF16, {1, 16, 512});
  const absl::Status s = kernels::dsa::Validate(p);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message().substr(0, 17), "index_q: dim 2 (h") << s;
  EXPECT_EQ(kernels::BadField(s).value_or(""), "index_q.shape[2]") << s;
}

TEST(StatusDetailsTest, QueueFullCarriesRetryInfo) {
  // The scheduler's own RESOURCE_EXHAUSTED: a worker held on a gate, a queue of one.
  class Gated : public engine::Backend {
   public:
    kernels::Backend kind() const override { return kernels::Backend::kCpu; }
    absl::Status Run(absl::string_view, const engine::StepFn& step, engine::StepResult* result,
                     const engine::StopToken*) override {
      return step(kernels::ExecContext(), &result->impl);
    }
    std::vector<engine::DeviceDescription> Devices() const override { return {}; }
  } backend;
  engine::Scheduler::Options o;
  o.queue_capacity = 1;
  o.workers = 1;
  engine::Scheduler sched(o, &backend);
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  auto job = [&open](std::promise<engine::JobOutcome>* done) {
    auto j = std::make_unique<engine::Job>();
    j->op = "test";
    j->steps.push_back(engine::StepFn([open](const kernels::ExecContext&, std::string*) {
      open.wait();
      return absl::OkStatus();
    }));
    j->done = [done](engine::JobOutcome r) { done->set_value(std::move(r)); };
    return j;
  };
  std::promise<engine::JobOutcome> a, b, c;
  ASSERT_TRUE(sched.Submit(job(&a)).ok());
  while (sched.running() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(sched.Submit(job(&b)).ok());
  const absl::Status full = sched.Submit(job(&c));
  gate.set_value();
  a.get_future().get();
  b.get_future().get();
  ASSERT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;

  const grpc::Status g = ToGrpcStatus(full);
  EXPECT_EQ(g.error_message(), std::string(full.message()));
  const auto retry = Unpacked<google::rpc::RetryInfo>(Details(g));
  ASSERT_EQ(retry.size(), 1u);
  EXPECT_EQ(retry[0].retry_delay().seconds(), 0);
  EXPECT_EQ(retry[0].retry_delay().nanos(), 100'000'000);  // kRetryDelayResourceExhausted
  const client::ErrorDetails d = client::ErrorDetailsOf(g);
  EXPECT_EQ(d.retry_delay, absl::Milliseconds(100));
  EXPECT_TRUE(d.field_violations.empty());
}

TEST(StatusDetailsTest, UnavailableRetriesLaterAndPlainErrorsHaveNoTrailer) {
  const grpc::Status g = ToGrpcStatus(absl::UnavailableError("attnd is shutting down"));
  EXPECT_EQ(client::ErrorDetailsOf(g).retry_delay, absl::Seconds(1));
  absl::Status custom = absl::ResourceExhaustedError("x");
  kernels::SetRetryDelay(&custom, absl::Milliseconds(2500));
  EXPECT_EQ(client::ErrorDetailsOf(ToGrpcStatus(custom)).retry_delay, absl::Milliseconds(2500));
  // No cause known: no trailer (and nothing to retry).
  EXPECT_TRUE(ToGrpcStatus(absl::InternalError("boom")).error_details().empty());
  EXPECT_TRUE(ToGrpcStatus(absl::InvalidArgumentError("no field")).error_details().empty());
  EXPECT_TRUE(client::ErrorDetailsOf(ToGrpcStatus(absl::InternalError("boom"))).empty());
}

TEST(StatusDetailsTest, LongTextsAreCutAndLongNamesLeftOut) {
  // A caller's long region name must not push the trailers past the client's metadata limit.
  const std::string long_name(3000, 'x');
  absl::Status s = absl::NotFoundError(absl::StrCat("region '", long_name, "' is not registered"));
  kernels::SetResource(&s, kernels::kRegionResource, long_name);
  grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_message(), std::string(s.message()));  // the message itself is unchanged
  EXPECT_TRUE(g.error_details().empty());                  // no ResourceInfo, nothing else
  const std::string name(500, 'y');                        // fits: sent whole, the description cut
  s = absl::NotFoundError(absl::StrCat("region '", name, "' is not registered"));
  kernels::SetResource(&s, kernels::kRegionResource, name);
  const auto info = Unpacked<google::rpc::ResourceInfo>(Details(ToGrpcStatus(s)));
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].resource_name(), name);
  EXPECT_LE(info[0].description().size(), 512u);
  EXPECT_EQ(info[0].description().substr(info[0].description().size() - 3), "...");
  // A cut never splits a UTF-8 sequence.
  std::string text = "q: x";                     // 4 bytes: the cut at 509 falls inside a sequence
  while (text.size() < 600) text += "\xc3\xa9";  // é
  const auto bad =
      Unpacked<google::rpc::BadRequest>(Details(ToGrpcStatus(kernels::InvalidField("q", text))));
  ASSERT_EQ(bad.size(), 1u);
  const std::string d = bad[0].field_violations(0).description();
  ASSERT_GE(d.size(), 4u);
  EXPECT_NE(static_cast<unsigned char>(d[d.size() - 4]) & 0xC0, 0xC0u);  // not a lead byte
}

// ---- end to end through an in-process daemon and the C++ client ----

TEST_F(DaemonTest, BadTensorIsBadRequestNamingTheField) {
  v1::SparseMlaRequest req = InlineRequest();
  const HostTensor q575 = HostTensor::Dense(DType::kBF16, {kT, kH, 575});
  *req.mutable_q() = InlineTensor(q575, v1::DTYPE_BF16);
  grpc::ClientContext ctx;
  v1::SparseMlaResponse reply;
  const grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  const auto bad = Unpacked<google::rpc::BadRequest>(Details(s));
  ASSERT_EQ(bad.size(), 1u);
  ASSERT_EQ(bad[0].field_violations_size(), 1);
  EXPECT_EQ(bad[0].field_violations(0).field(), "q.shape[2]");
  EXPECT_EQ(bad[0].field_violations(0).description(), s.error_message());
  EXPECT_NE(s.error_message().find("q: dim 2 is 575"), std::string::npos) << s.error_message();

  // The C++ client: the details ride on the absl::Status it returns.
  const absl::Status as_absl = client::FromGrpcStatus(s, "SparseMla");
  const client::ErrorDetails d = client::ErrorDetailsOf(as_absl);
  ASSERT_EQ(d.field_violations.size(), 1u);
  EXPECT_EQ(d.field_violations[0].field, "q.shape[2]");
  EXPECT_FALSE(d.retry_delay.has_value());
}

// A Session call's error carries the same google.rpc.Status as a unary call's trailer.
TEST_F(DaemonTest, SessionErrorsCarryTheSameDetails) {
  grpc::ClientContext ctx;
  auto stream = stub_->Session(&ctx);
  v1::SessionRequest open;
  open.set_request_id(1);
  open.mutable_open()->set_client_name("details");
  ASSERT_TRUE(stream->Write(open));
  v1::SessionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_EQ(resp.code(), 0) << resp.message();
  v1::SessionRequest call;
  call.set_request_id(2);
  *call.mutable_sparse_mla() = InlineRequest();
  const HostTensor q575 = HostTensor::Dense(DType::kBF16, {kT, kH, 575});
  *call.mutable_sparse_mla()->mutable_q() = InlineTensor(q575, v1::DTYPE_BF16);
  ASSERT_TRUE(stream->Write(call));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_EQ(resp.request_id(), 2u);
  ASSERT_EQ(resp.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT)) << resp.message();
  const client::ErrorDetails d = client::ParseErrorDetails(resp.status_details());
  ASSERT_EQ(d.field_violations.size(), 1u);
  EXPECT_EQ(d.field_violations[0].field, "q.shape[2]");
  // A successful call carries none.
  call.set_request_id(3);
  *call.mutable_sparse_mla() = InlineRequest();
  ASSERT_TRUE(stream->Write(call));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.code(), 0) << resp.message();
  EXPECT_TRUE(resp.status_details().empty());
  stream->WritesDone();
  while (stream->Read(&resp)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(DaemonTest, UnknownRegionIsResourceInfoWithTheNameAsSent) {
  {  // UnregisterRegion of a name this caller never registered.
    v1::UnregisterRegionRequest unreg;
    unreg.set_name("no-such-region");
    grpc::ClientContext ctx;
    v1::UnregisterRegionResponse ur;
    const grpc::Status s = stub_->UnregisterRegion(&ctx, unreg, &ur);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    const auto info = Unpacked<google::rpc::ResourceInfo>(Details(s));
    ASSERT_EQ(info.size(), 1u);
    EXPECT_EQ(info[0].resource_type(), "attnd.v1.Region");
    EXPECT_EQ(info[0].resource_name(), "no-such-region");
    EXPECT_TRUE(info[0].owner().empty());
    const client::ErrorDetails d = client::ErrorDetailsOf(s);
    EXPECT_EQ(d.resource_type, "attnd.v1.Region");
    EXPECT_EQ(d.resource_name, "no-such-region");
    EXPECT_FALSE(d.retry_delay.has_value());
  }
  {  // An op whose tensor names an unknown region: the same, through the tensor resolution.
    v1::SparseMlaRequest req = InlineRequest();
    req.mutable_kv()->clear_inline_data();
    req.mutable_kv()->mutable_region()->set_region("missing-kv");
    grpc::ClientContext ctx;
    v1::SparseMlaResponse reply;
    const grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    const auto info = Unpacked<google::rpc::ResourceInfo>(Details(s));
    ASSERT_EQ(info.size(), 1u);
    EXPECT_EQ(info[0].resource_type(), "attnd.v1.Region");
    EXPECT_EQ(info[0].resource_name(), "missing-kv");
  }
}

// ---- device loss -> health ----

class LosableBackend : public engine::Backend {
 public:
  kernels::Backend kind() const override { return kernels::Backend::kCpu; }
  absl::Status Run(absl::string_view, const engine::StepFn&, engine::StepResult*,
                   const engine::StopToken*) override {
    return absl::OkStatus();
  }
  std::vector<engine::DeviceDescription> Devices() const override {
    engine::DeviceDescription a, b;
    a.uuid = "GPU-fake-a";
    b.uuid = "GPU-fake-b";
    return {a, b};
  }
  void Lose(const std::string& device, absl::string_view why) { ReportDeviceLost(device, why); }
};

std::string Scrape(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

TEST(DeviceLossTest, HealthTurnsNotServingAndTheMetricSaysWhich) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  ASSERT_NE(health, nullptr);
  health->SetServingStatus(true);
  health->SetServingStatus(v1::Attention::service_full_name(), true);

  prometheus::Registry registry;
  metrics::Metrics m(&registry, "test", "fake", {"sparse_mla"});
  LosableBackend backend;
  grpc_front::WatchDeviceLoss(&backend, health, &m);

  client::Client c(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  auto status = [&c](const std::string& service) {
    absl::StatusOr<client::HealthStatus> h = c.Health(service, absl::Seconds(10));
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : client::HealthStatus::kUnknown;
  };
  EXPECT_EQ(status(""), client::HealthStatus::kServing);
  EXPECT_EQ(status("attnd.v1.Attention"), client::HealthStatus::kServing);
  EXPECT_NE(Scrape(registry).find("attnd_device_up{device=\"GPU-fake-b\"} 1"), std::string::npos);

  backend.Lose("GPU-fake-b", "CUDA error 999 (unspecified launch failure)");
  backend.Lose("GPU-fake-b", "again");  // reported once
  EXPECT_EQ(status(""), client::HealthStatus::kNotServing);
  EXPECT_EQ(status("attnd.v1.Attention"), client::HealthStatus::kNotServing);
  EXPECT_EQ(backend.LostDevices(), std::vector<std::string>{"GPU-fake-b"});
  const std::string text = Scrape(registry);
  EXPECT_NE(text.find("attnd_device_up{device=\"GPU-fake-b\"} 0"), std::string::npos) << text;
  EXPECT_NE(text.find("attnd_device_up{device=\"GPU-fake-a\"} 1"), std::string::npos) << text;

  backend.SetDeviceLostCallback(nullptr);  // the server goes first
  server->Shutdown();
}

TEST(DeviceLossTest, ALossBeforeWatchingCountsAtOnce) {
  prometheus::Registry registry;
  metrics::Metrics m(&registry, "test", "fake", {});
  LosableBackend backend;
  backend.Lose("GPU-fake-a", "lost early");
  grpc_front::WatchDeviceLoss(&backend, nullptr, &m);
  EXPECT_NE(Scrape(registry).find("attnd_device_up{device=\"GPU-fake-a\"} 0"), std::string::npos);
  backend.SetDeviceLostCallback(nullptr);
}

TEST(MetricsNamesTest, FlopsPerSecondAndPoolsSplitByKind) {
  prometheus::Registry registry;
  metrics::Metrics m(&registry, "test", "cpu", {"sparse_mla"});
  m.SetPoolBytes("GPU-a", "reserved", 1000);
  m.SetPoolBytes("GPU-a", "used", 300);
  m.SetPoolBytes("GPU-a", "free", 700);
  m.SetPoolBytes("pinned-staging", "reserved", 64);
  metrics::CallRecord r;
  r.op = "sparse_mla";
  r.ran = true;
  r.compute_seconds = 0.5;
  r.flops = 1e9;
  m.RecordCall(r);
  const std::string text = Scrape(registry);
  EXPECT_NE(text.find("attnd_achieved_flops_per_second_bucket{op=\"sparse_mla\""),
            std::string::npos);
  EXPECT_EQ(text.find("attnd_achieved_flops{"), std::string::npos);
  EXPECT_EQ(text.find("attnd_achieved_flops_bucket"), std::string::npos);
  EXPECT_EQ(text.find("attnd_pool_bytes"), std::string::npos);
  EXPECT_NE(text.find("attnd_pool_reserved_bytes{device=\"GPU-a\"} 1000"), std::string::npos);
  EXPECT_NE(text.find("attnd_pool_used_bytes{device=\"GPU-a\"} 300"), std::string::npos);
  EXPECT_NE(text.find("attnd_pool_free_bytes{device=\"GPU-a\"} 700"), std::string::npos);
  EXPECT_NE(text.find("attnd_pool_reserved_bytes{device=\"pinned-staging\"} 64"),
            std::string::npos);
}

}  // namespace
}  // namespace attnd::server::testing
