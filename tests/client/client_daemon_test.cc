// The client library against a real daemon in this process (server/main/daemon.h) on a unix
// socket in a temporary directory: typed calls inline and through host regions, the host-region
// lifecycle, and Session leases and pipelining. Results are checked against the kernels' CPU Run
// on the same inputs.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/device_region.h"
#include "client/error_details.h"
#include "client/host_region.h"
#include "client/session.h"
#include "client/stream_ordered.h"
#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "server/main/daemon.h"

namespace attnd::client {
namespace {

using kernels::DType;
namespace sparse_mla = kernels::sparse_mla;

bool ShmExists(const std::string& key) {
  struct stat st;
  return stat(("/dev/shm" + key).c_str(), &st) == 0;
}

class ClientDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/attnd-client-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    server::DaemonConfig config;
    config.listen = {"unix:" + dir_ + "/attnd.sock"};
    config.metrics_listen = "";
    config.allow_client_shm = true;
    config.backend = "cpu";
    config.cpu_threads = 2;
    config.workers = 2;
    config.drain_timeout = absl::Seconds(1);  // bounds the test that stops it mid-session
    daemon_ = std::make_unique<server::Daemon>(config);
    ASSERT_TRUE(daemon_->Start().ok());
    ConnectOptions o;
    o.target = config.listen[0];
    o.connect_timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }
  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr) daemon_->Shutdown();
    daemon_.reset();
    if (!dir_.empty()) {
      unlink((dir_ + "/attnd.sock").c_str());
      rmdir(dir_.c_str());
    }
  }

  // Random sparse-MLA inputs (T=3, H=8, d_qk=576, S=64, K=16 with masked slots) in `alloc`'s
  // memory; out/lse allocated by `alloc` too.
  template <class Alloc>
  sparse_mla::Params MakeSparseMla(Alloc&& alloc, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int32_t> slot(-1, 63);
    sparse_mla::Params p;
    p.q = alloc(DType::kBF16, {3, 8, 576});
    p.kv = alloc(DType::kBF16, {64, 576});
    p.indices = alloc(DType::kI32, {3, 16});
    for (int64_t i = 0; i < 3 * 8 * 576; ++i) {
      p.q.ptr<uint16_t>()[i] = kernels::FloatToBf16(normal(rng));
    }
    for (int64_t i = 0; i < 64 * 576; ++i) {
      p.kv.ptr<uint16_t>()[i] = kernels::FloatToBf16(normal(rng));
    }
    for (int64_t i = 0; i < 3 * 16; ++i) p.indices.ptr<int32_t>()[i] = slot(rng);
    p.sm_scale = 1.0f / std::sqrt(576.0f);
    p.out = alloc(DType::kBF16, {3, 8, 512});
    p.lse = alloc(DType::kF32, {3, 8});
    std::memset(p.out.data, 0xff, 3 * 8 * 512 * 2);  // NaN: an unwritten element fails
    std::memset(p.lse.data, 0xff, 3 * 8 * 4);
    return p;
  }

  // Runs p locally into fresh buffers and expects p's outputs to equal them bit for bit (the
  // daemon runs the same CPU implementation).
  void ExpectMatchesLocal(const sparse_mla::Params& p) {
    HostArray out = HostArray::Dense(DType::kBF16, {3, 8, 512});
    HostArray lse = HostArray::Dense(DType::kF32, {3, 8});
    sparse_mla::Params local = p;
    local.out = out.view();
    local.lse = lse.view();
    ASSERT_TRUE(sparse_mla::Run(local, kernels::ExecContext()).ok());
    EXPECT_EQ(std::memcmp(out.data(), p.out.data, out.span_bytes()), 0);
    EXPECT_EQ(std::memcmp(lse.data(), p.lse.data, lse.span_bytes()), 0);
  }

  std::function<kernels::Tensor(DType, std::vector<int64_t>)> HeapAlloc() {
    return [this](DType d, std::vector<int64_t> shape) {
      heap_.push_back(HostArray::Dense(d, shape));
      return heap_.back().view();
    };
  }
  static std::function<kernels::Tensor(DType, std::vector<int64_t>)> RegionAlloc(HostRegion* r) {
    return [r](DType d, std::vector<int64_t> shape) {
      absl::StatusOr<kernels::Tensor> t = r->Allocate(d, shape);
      EXPECT_TRUE(t.ok()) << t.status();
      return t.ok() ? *t : kernels::Tensor();
    };
  }

  std::string dir_;
  std::unique_ptr<server::Daemon> daemon_;
  std::unique_ptr<Client> client_;
  std::vector<HostArray> heap_;
};

TEST_F(ClientDaemonTest, InfoAndHealth) {
  absl::StatusOr<v1::GetInfoResponse> info = client_->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->backend(), "cpu");
  EXPECT_TRUE(info->limits().allow_client_shm());
  absl::StatusOr<HealthStatus> h = client_->Health();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, HealthStatus::kServing);
}

TEST_F(ClientDaemonTest, SparseMlaInlineFillsTheCallersBuffers) {
  sparse_mla::Params p = MakeSparseMla(HeapAlloc(), 1);
  absl::StatusOr<CallResult> r = client_->SparseMla(p);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectMatchesLocal(p);
  EXPECT_GT(r->stats.copied_bytes_in(), 0u);
  EXPECT_EQ(r->stats.copied_bytes_out(), 3u * 8 * 512 * 2 + 3 * 8 * 4);
  EXPECT_GT(r->round_trip_seconds, 0);
  EXPECT_GE(r->round_trip_seconds, r->stats.compute_seconds());
  EXPECT_TRUE(r->returned.empty());
}

TEST_F(ClientDaemonTest, SparseMlaThroughARegionCopiesNothing) {
  HostRegionOptions o;
  o.bytes = 1 << 20;
  absl::StatusOr<std::unique_ptr<HostRegion>> region = HostRegion::Create(client_.get(), o);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_FALSE(ShmExists((*region)->key()));  // unlinked once the daemon mapped it
  sparse_mla::Params p = MakeSparseMla(RegionAlloc(region->get()), 2);
  absl::StatusOr<CallResult> r = client_->SparseMla(p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats.copied_bytes_in(), 0u);
  EXPECT_EQ(r->stats.copied_bytes_out(), 0u);
  ExpectMatchesLocal(p);

  absl::StatusOr<v1::ListRegionsResponse> list = client_->ListRegions();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->regions_size(), 1);
  EXPECT_EQ(list->regions(0).name(), (*region)->name());
  EXPECT_EQ(list->regions(0).byte_size(), 1u << 20);
  ASSERT_TRUE((*region)->Close().ok());
  list = client_->ListRegions();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->regions_size(), 0);
  EXPECT_EQ(client_->regions().size(), 0u);
}

TEST_F(ClientDaemonTest, RegionKeyStaysUntilCloseWhenAsked) {
  HostRegionOptions o;
  o.bytes = 4096;
  o.unlink_after_register = false;
  absl::StatusOr<std::unique_ptr<HostRegion>> region = HostRegion::Create(client_.get(), o);
  ASSERT_TRUE(region.ok()) << region.status();
  const std::string key = (*region)->key();
  EXPECT_TRUE(ShmExists(key));
  EXPECT_EQ((*region)->Allocate(DType::kF32, {2048}).status().code(),
            absl::StatusCode::kResourceExhausted);
  region->reset();  // destructor: unregister, unmap, unlink
  EXPECT_FALSE(ShmExists(key));
  absl::StatusOr<v1::ListRegionsResponse> list = client_->ListRegions();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->regions_size(), 0);
}

TEST_F(ClientDaemonTest, ServerErrorsKeepTheirCodeAndMessage) {
  sparse_mla::Params p = MakeSparseMla(HeapAlloc(), 3);
  p.q.shape[2] = 575;
  p.q.strides[1] = 575;
  p.q.strides[0] = 8 * 575;
  absl::StatusOr<CallResult> r = client_->SparseMla(p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("q: dim 2 is 575"), absl::string_view::npos) << r.status();
}

TEST_F(ClientDaemonTest, SessionPipelinesCallsAndEndsItsLease) {
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(client_.get());
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_FALSE((*session)->lease_id().empty());
  HostRegionOptions o;
  o.bytes = 4 << 20;
  o.lease_id = (*session)->lease_id();
  absl::StatusOr<std::unique_ptr<HostRegion>> region = HostRegion::Create(client_.get(), o);
  ASSERT_TRUE(region.ok()) << region.status();

  // Eight calls in flight at once, half inline, half in the region; waited for in reverse.
  constexpr int kCalls = 8;
  std::vector<sparse_mla::Params> params;
  for (int i = 0; i < kCalls; ++i) {
    params.push_back(i % 2 ? MakeSparseMla(RegionAlloc(region->get()), 10 + i)
                           : MakeSparseMla(HeapAlloc(), 10 + i));
  }
  std::vector<Session::Pending> pending;
  for (const sparse_mla::Params& p : params) {
    absl::StatusOr<Session::Pending> started = (*session)->Start(p);
    ASSERT_TRUE(started.ok()) << started.status();
    pending.push_back(*std::move(started));
  }
  for (int i = kCalls - 1; i >= 0; --i) {
    absl::StatusOr<CallResult> r = pending[i].Wait();
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    EXPECT_EQ(r->stats.copied_bytes_in() == 0, i % 2 == 1) << i;
    ExpectMatchesLocal(params[i]);
  }
  // A refused call answers with its code and leaves the stream usable.
  sparse_mla::Params bad = params[0];
  bad.sm_scale = -1.0f;
  absl::StatusOr<CallResult> refused = (*session)->Call(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  // Its google.rpc causes ride on the status, as a unary call's do.
  sparse_mla::Params bad_q = params[0];
  bad_q.q.shape[2] = 575;
  bad_q.q.strides[1] = 575;
  bad_q.q.strides[0] = 8 * 575;
  refused = (*session)->Call(bad_q);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  const ErrorDetails details = ErrorDetailsOf(refused.status());
  ASSERT_EQ(details.field_violations.size(), 1u) << refused.status();
  EXPECT_EQ(details.field_violations[0].field, "q.shape[2]");
  EXPECT_TRUE((*session)->Call(params[0]).ok());

  absl::StatusOr<v1::ListRegionsResponse> list = client_->ListRegions();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->regions_size(), 1);
  EXPECT_EQ(list->regions(0).lease_id(), (*session)->lease_id());
  EXPECT_TRUE((*session)->Close().ok());
  // The lease ended: its region is gone (removal is asynchronous once unused; poll briefly).
  for (int i = 0; i < 200; ++i) {
    list = client_->ListRegions();
    ASSERT_TRUE(list.ok());
    if (list->regions_size() == 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(list->regions_size(), 0);
  EXPECT_TRUE((*region)->Close().ok());  // NOT_FOUND of a leased region is not an error
}

TEST_F(ClientDaemonTest, SessionCallsFailCleanlyAfterTheDaemonStops) {
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(client_.get());
  ASSERT_TRUE(session.ok()) << session.status();
  daemon_->Shutdown();
  sparse_mla::Params p = MakeSparseMla(HeapAlloc(), 5);
  absl::StatusOr<CallResult> r = (*session)->Call(p);
  EXPECT_FALSE(r.ok());
  session->reset();  // must not hang
}

// DeviceRegion's own checks (nothing is sent) and a daemon without a GPU backend refusing the
// registration: no region is left behind, in the daemon or in the client's table.
TEST_F(ClientDaemonTest, DeviceRegionRefusalsLeaveNothingBehind) {
  alignas(64) static char fake[4096];
  DeviceRegionOptions o;
  o.raw_handle = std::string(64, '\x01');
  o.device_uuid = "GPU-00000000-0000-0000-0000-000000000000";
  o.allocation = fake;
  o.bytes = sizeof fake;
  DeviceRegionOptions bad = o;
  bad.raw_handle = std::string(63, '\x01');
  EXPECT_EQ(DeviceRegion::Register(client_.get(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = o;
  bad.allocation = nullptr;
  EXPECT_EQ(DeviceRegion::Register(client_.get(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = o;
  bad.bytes = 0;
  EXPECT_EQ(DeviceRegion::Register(client_.get(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = o;
  bad.offset = UINT64_MAX - 8;
  EXPECT_EQ(DeviceRegion::Register(client_.get(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceRegion::Register(nullptr, o).status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<std::unique_ptr<DeviceRegion>> r = DeviceRegion::Register(client_.get(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().code(), absl::StatusCode::kOk);
  EXPECT_NE(r.status().message().find("RegisterDeviceRegion"), absl::string_view::npos)
      << r.status();
  EXPECT_EQ(client_->regions().size(), 0u);
  absl::StatusOr<v1::ListRegionsResponse> list = client_->ListRegions();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->regions_size(), 0);
}

// wait_spin (client/polled_unary.h, SessionOptions::wait_spin): the same replies, statuses and
// deadlines as the blocking waits, both while polling (a spin longer than the call) and after
// falling back to a blocking wait (a spin far shorter than the call).
TEST_F(ClientDaemonTest, PollingCallersGetTheSameRepliesStatusesAndDeadlines) {
  for (const absl::Duration spin : {absl::Milliseconds(50), absl::Nanoseconds(1)}) {
    SCOPED_TRACE(absl::FormatDuration(spin));
    ConnectOptions o;
    o.target = "unix:" + dir_ + "/attnd.sock";
    o.wait_spin = spin;
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    Client* client = c->get();
    EXPECT_EQ(client->wait_spin(), spin);
    absl::StatusOr<v1::GetInfoResponse> info = client->GetInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->backend(), "cpu");

    sparse_mla::Params p = MakeSparseMla(HeapAlloc(), 21);
    absl::StatusOr<CallResult> r = client->SparseMla(p);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->round_trip_seconds, 0);
    ExpectMatchesLocal(p);

    sparse_mla::Params bad = MakeSparseMla(HeapAlloc(), 22);
    bad.q.shape[2] = 575;
    bad.q.strides[1] = 575;
    bad.q.strides[0] = 8 * 575;
    r = client->SparseMla(bad);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("q: dim 2 is 575"), absl::string_view::npos) << r.status();
    ASSERT_EQ(ErrorDetailsOf(r.status()).field_violations.size(), 1u) << r.status();

    // A deadline far shorter than the call (a long context on the CPU backend, ~0.1-1 s):
    // DEADLINE_EXCEEDED, not a hang and not a reply.
    {
      std::mt19937_64 rng(23);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      constexpr int64_t kT = 64, kH = 64, kS = 8192, kK = 2048;
      sparse_mla::Params slow;
      auto alloc = HeapAlloc();
      slow.q = alloc(DType::kBF16, {kT, kH, 576});
      slow.kv = alloc(DType::kBF16, {kS, 576});
      slow.indices = alloc(DType::kI32, {kT, kK});
      for (int64_t i = 0; i < kT * kH * 576; ++i) {
        slow.q.ptr<uint16_t>()[i] = kernels::FloatToBf16(normal(rng));
      }
      for (int64_t i = 0; i < kS * 576; ++i) {
        slow.kv.ptr<uint16_t>()[i] = kernels::FloatToBf16(normal(rng));
      }
      for (int64_t i = 0; i < kT * kK; ++i) {
        slow.indices.ptr<int32_t>()[i] = static_cast<int32_t>((i * 7919) % kS);
      }
      slow.sm_scale = 1.0f / std::sqrt(576.0f);
      slow.out = alloc(DType::kBF16, {kT, kH, 512});
      slow.lse = alloc(DType::kF32, {kT, kH});
      CallOptions late;
      late.timeout = absl::Milliseconds(2);
      r = client->SparseMla(slow, late);
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
    }

    // A prepared call run blocking (RunPrepared polls too), and a Session that polls.
    SessionOptions so;
    so.wait_spin = spin;
    absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(client, so);
    ASSERT_TRUE(session.ok()) << session.status();
    HostRegionOptions ro;
    ro.bytes = 4 << 20;
    ro.lease_id = (*session)->lease_id();
    absl::StatusOr<std::unique_ptr<HostRegion>> region = HostRegion::Create(client, ro);
    ASSERT_TRUE(region.ok()) << region.status();
    sparse_mla::Params in_region = MakeSparseMla(RegionAlloc(region->get()), 24);
    absl::StatusOr<uint64_t> id = PrepareCall(client, in_region, (*session)->lease_id());
    ASSERT_TRUE(id.ok()) << id.status();
    absl::StatusOr<v1::CallStats> ran = RunPrepared(client, *id, std::nullopt, std::nullopt);
    ASSERT_TRUE(ran.ok()) << ran.status();
    EXPECT_EQ(ran->copied_bytes_in(), 0u);
    ExpectMatchesLocal(in_region);
    EXPECT_EQ(RunPrepared(client, *id + 1000, std::nullopt, std::nullopt).status().code(),
              absl::StatusCode::kNotFound);

    sparse_mla::Params q = MakeSparseMla(RegionAlloc(region->get()), 25);
    r = (*session)->Call(q);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectMatchesLocal(q);
    r = (*session)->Call(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_TRUE((*session)->Close().ok());
    // After the stream ended a call fails at once, polling or not.
    r = (*session)->Call(q);
    EXPECT_FALSE(r.ok());
    EXPECT_TRUE((*region)->Close().ok());
  }
}

}  // namespace
}  // namespace attnd::client
