// Stream-ordered calls and prepared calls against an in-process CPU attnd (docs/SERVICE.md
// "Stream-ordered calls and prepared calls"): ordering on the ready word with NaN-poisoned
// outputs, the watchdog's failure bit and asynchronous failure, one Session's stall not stalling
// another's, prepared calls (run many times, ownership, release with the lease and with the
// region) and hostile signal slices.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/ops/stream_ordered.h"
#include "tests/server/daemon_fixture.h"
#include "tests/server/fake_device_opener.h"

namespace attnd::server::testing {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kQ = 0, kKv = 128 << 10, kIdx = 512 << 10, kOut = 576 << 10, kLse = 704 << 10;
constexpr uint64_t kReady = 1 << 20, kDone = kReady + 8;
constexpr uint64_t kFail = ops::kSignalFailureBit;

class StreamOrderedTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    ASSERT_TRUE(shm_.ok());
    Register(stub_.get(), "r");
  }

  void Register(v1::Attention::Stub* stub, const std::string& name) {
    grpc::ClientContext ctx;
    v1::RegisterHostRegionRequest reg;
    reg.set_name(name);
    reg.set_key(shm_.key());
    reg.set_byte_size(shm_.size());
    v1::RegisterRegionResponse r;
    grpc::Status s = stub->RegisterHostRegion(&ctx, reg, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // A SparseMla request with every tensor in region "r"; outputs poisoned with NaN.
  v1::SparseMlaRequest RegionRequest() {
    v1::SparseMlaRequest req;
    *req.mutable_q() = RegionTensor(q_, v1::DTYPE_BF16, shm_, "r", kQ);
    *req.mutable_kv() = RegionTensor(kv_, v1::DTYPE_BF16, shm_, "r", kKv);
    *req.mutable_indices() = RegionTensor(indices_, v1::DTYPE_I32, shm_, "r", kIdx);
    req.set_sm_scale(kScale);
    Poison();
    for (auto [field, off] : {std::pair<v1::Tensor*, uint64_t>{req.mutable_out(), kOut},
                              std::pair<v1::Tensor*, uint64_t>{req.mutable_lse(), kLse}}) {
      field->mutable_region()->set_region("r");
      field->mutable_region()->set_offset(off);
    }
    return req;
  }

  void Poison() {
    std::memset(shm_.data() + kOut, 0xff, SpanBytes(want_out_));  // bf16/f32 NaN
    std::memset(shm_.data() + kLse, 0xff, SpanBytes(want_lse_));
  }
  bool OutputsPoisoned() const {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(shm_.data() + kOut);
    for (size_t i = 0; i < SpanBytes(want_out_); ++i) {
      if (p[i] != 0xff) return false;
    }
    return true;
  }
  bool OutputsMatch() const {
    return std::memcmp(shm_.data() + kOut, want_out_.raw(), SpanBytes(want_out_)) == 0 &&
           std::memcmp(shm_.data() + kLse, want_lse_.raw(), SpanBytes(want_lse_)) == 0;
  }

  // A unary stream-ordered call (ready = 1 at kReady, done = 2 at kDone) whose ready word is
  // not reached yet: accepted, pending.
  void EnqueueUnreadyCall() {
    v1::SparseMlaRequest req = RegionRequest();
    Word(kReady).store(0);
    Word(kDone).store(0);
    SetSignal(req.mutable_ready(), "r", kReady, 1);
    SetSignal(req.mutable_done(), "r", kDone, 2);
    grpc::ClientContext ctx;
    v1::SparseMlaResponse reply;
    grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  std::atomic<uint64_t>& Word(uint64_t offset) {
    return *reinterpret_cast<std::atomic<uint64_t>*>(shm_.data() + offset);
  }
  // Waits up to `ms` for the word at `offset` to become nonzero; its value.
  uint64_t AwaitWord(uint64_t offset, int ms) {
    for (int i = 0; i < ms; ++i) {
      const uint64_t v = Word(offset).load(std::memory_order_acquire);
      if (v != 0) return v;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return Word(offset).load(std::memory_order_acquire);
  }

  static void SetSignal(v1::Signal* s, const std::string& region, uint64_t offset, uint64_t value) {
    s->mutable_slice()->set_region(region);
    s->mutable_slice()->set_offset(offset);
    s->set_value(value);
  }

  ScopedShm shm_{2 << 20};
};

// Enqueue skips the device path's first resolution for calls naming a host region
// (ops::NamesHostRegion): every tensor field is looked at, nested messages too, and only the
// caller's own host regions count.
TEST(NamesHostRegionTest, FindsTheCallersHostRegionTensorsOnly) {
  ScopedShm shm(1 << 16);
  ASSERT_TRUE(shm.ok());
  regions::RegionRegistry::Options ro;
  ro.allow_client_shm = true;
  ro.device_opener = std::make_shared<FakeDeviceOpener>(1 << 20);
  regions::RegionRegistry registry(ro);
  regions::HostRegionSpec host;
  host.name = "h";
  host.key = shm.key();
  host.byte_size = shm.size();
  host.owner = "uid:a";
  ASSERT_TRUE(registry.RegisterHost(host).ok());
  host.name = "theirs";
  host.owner = "uid:b";
  ASSERT_TRUE(registry.RegisterHost(host).ok());
  regions::DeviceRegionSpec dev;
  dev.name = "d";
  dev.raw_handle = std::string(regions::kDeviceHandleBytes, 'h');
  dev.byte_size = 1 << 20;
  dev.owner = "uid:a";
  ASSERT_TRUE(registry.RegisterDevice(dev).ok());
  auto in = [](v1::Tensor* t, const std::string& region) {
    t->set_dtype(v1::DTYPE_BF16);
    t->add_shape(4);
    t->mutable_region()->set_region(region);
  };
  v1::SparseMlaRequest req;
  in(req.mutable_q(), "d");
  in(req.mutable_kv(), "d");
  in(req.mutable_indices(), "d");
  in(req.mutable_out(), "d");
  req.mutable_lse()->set_dtype(v1::DTYPE_F32);
  req.mutable_lse()->set_inline_data(std::string(16, '\0'));
  EXPECT_FALSE(ops::NamesHostRegion(req, &registry, "uid:a")) << "device regions and inline";
  in(req.mutable_kv(), "nowhere");
  EXPECT_FALSE(ops::NamesHostRegion(req, &registry, "uid:a")) << "unknown: left to Prepare";
  in(req.mutable_kv(), "theirs");
  EXPECT_FALSE(ops::NamesHostRegion(req, &registry, "uid:a")) << "another owner's region";
  // A host-region signal word is not a tensor: the device path takes host words.
  req.mutable_done()->mutable_slice()->set_region("h");
  EXPECT_FALSE(ops::NamesHostRegion(req, &registry, "uid:a"));
  in(req.mutable_out(), "h");
  EXPECT_TRUE(ops::NamesHostRegion(req, &registry, "uid:a")) << "out in a host region";
  v1::PrepareCallRequest nested;
  *nested.mutable_sparse_mla() = req;
  EXPECT_TRUE(ops::NamesHostRegion(nested, &registry, "uid:a")) << "inside a nested message";
  in(nested.mutable_sparse_mla()->mutable_out(), "d");
  EXPECT_FALSE(ops::NamesHostRegion(nested, &registry, "uid:a"));
}

TEST_F(StreamOrderedTest, UnaryCallRunsOnlyAfterReadyAndStoresDone) {
  v1::SparseMlaRequest req = RegionRequest();
  Word(kReady).store(0);
  Word(kDone).store(0);
  SetSignal(req.mutable_ready(), "r", kReady, 7);
  SetSignal(req.mutable_done(), "r", kDone, 9);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::SparseMlaResponse reply;
  grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(reply.stats().enqueued());
  EXPECT_NE(reply.stats().request_id(), 0u);
  EXPECT_FALSE(reply.has_out());
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_TRUE(OutputsPoisoned());
  EXPECT_EQ(Word(kDone).load(), 0u);
  Word(kReady).store(6, std::memory_order_release);  // not yet
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_TRUE(OutputsPoisoned());
  EXPECT_EQ(Word(kDone).load(), 0u);
  Word(kReady).store(7, std::memory_order_release);
  EXPECT_EQ(AwaitWord(kDone, 5000), 9u);
  EXPECT_TRUE(OutputsMatch());
}

// A pending call keeps its request: inline inputs in it count against the caller's call memory
// budget until the call runs, so queued stream-ordered calls cannot hold unbounded memory.
class StreamOrderedBudgetTest : public StreamOrderedTest {
 protected:
  void Configure(DaemonConfig* config) override { config->call_memory_bytes_per_client = 3 << 20; }
};

TEST_F(StreamOrderedBudgetTest, PendingRequestsCountAgainstTheBudget) {
  v1::SparseMlaRequest req = RegionRequest();
  // kv inline, padded to 1 MiB of rows: each pending call holds about 1 MiB.
  const int64_t rows = (1 << 20) / (576 * 2);
  std::vector<uint16_t> kv(static_cast<size_t>(rows) * 576, 0x3f80);  // bf16 1.0
  req.mutable_kv()->Clear();
  req.mutable_kv()->set_dtype(v1::DTYPE_BF16);
  req.mutable_kv()->add_shape(rows);
  req.mutable_kv()->add_shape(576);
  req.mutable_kv()->set_inline_data(kv.data(), kv.size() * sizeof(uint16_t));
  Word(kReady).store(0);
  SetSignal(req.mutable_ready(), "r", kReady, 1);
  auto call = [&]() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::SparseMlaResponse reply;
    return stub_->SparseMla(&ctx, req, &reply);
  };
  ASSERT_TRUE(call().ok());
  ASSERT_TRUE(call().ok());
  grpc::Status third = call();  // 3 MiB of requests would pass the 3 MiB budget
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.error_message();
  EXPECT_NE(third.error_message().find("kept until its ready word"), std::string::npos)
      << third.error_message();
  Word(kReady).store(1, std::memory_order_release);  // both run and give their bytes back
  grpc::Status ok;
  for (int i = 0; i < 200 && !(ok = call()).ok(); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

TEST_F(StreamOrderedTest, CallsOfOneSessionRunInOrder) {
  grpc::ClientContext ctx;
  auto stream = stub_->Session(&ctx);
  v1::SessionRequest m;
  m.set_request_id(1);
  m.mutable_open();
  ASSERT_TRUE(stream->Write(m));
  v1::SessionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  Word(kReady).store(0);
  Word(kDone).store(0);
  Word(kDone + 8).store(0);
  // Call 2 needs no signal of its own but must wait for call 1, which waits for ready.
  m.Clear();
  m.set_request_id(2);
  *m.mutable_sparse_mla() = RegionRequest();
  SetSignal(m.mutable_sparse_mla()->mutable_ready(), "r", kReady, 1);
  SetSignal(m.mutable_sparse_mla()->mutable_done(), "r", kDone, 1);
  ASSERT_TRUE(stream->Write(m));
  m.set_request_id(3);
  m.mutable_sparse_mla()->clear_ready();
  SetSignal(m.mutable_sparse_mla()->mutable_done(), "r", kDone + 8, 2);
  ASSERT_TRUE(stream->Write(m));
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(stream->Read(&resp));
    ASSERT_EQ(resp.code(), 0) << resp.message();
    EXPECT_TRUE(resp.sparse_mla().stats().enqueued());
  }
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(Word(kDone + 8).load(), 0u) << "call 3 ran before call 1";
  EXPECT_TRUE(OutputsPoisoned());
  Word(kReady).store(1, std::memory_order_release);
  EXPECT_EQ(AwaitWord(kDone + 8, 5000), 2u);
  EXPECT_EQ(Word(kDone).load(), 1u);
  EXPECT_TRUE(OutputsMatch());
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(stream->Read(&resp));
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(StreamOrderedTest, WatchdogFailsUnsignalledCallOnlyInItsSession) {
  Word(kReady).store(0);
  Word(kDone).store(0);
  grpc::ClientContext ctx_a;
  auto a = stub_->Session(&ctx_a);
  v1::SessionRequest m;
  m.set_request_id(1);
  m.mutable_open();
  ASSERT_TRUE(a->Write(m));
  v1::SessionResponse resp;
  ASSERT_TRUE(a->Read(&resp));
  m.Clear();
  m.set_request_id(42);
  m.set_timeout_seconds(5);  // room for the other Session's calls on a loaded machine
  *m.mutable_sparse_mla() = RegionRequest();
  SetSignal(m.mutable_sparse_mla()->mutable_ready(), "r", kReady, 5);
  SetSignal(m.mutable_sparse_mla()->mutable_done(), "r", kDone, 5);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(a->Write(m));
  ASSERT_TRUE(a->Read(&resp));
  ASSERT_EQ(resp.code(), 0) << resp.message();
  ASSERT_TRUE(resp.sparse_mla().stats().enqueued());
  const uint64_t server_id = resp.sparse_mla().stats().request_id();

  // Meanwhile another Session's calls complete (stream-ordered without a ready word, and
  // blocking inline).
  {
    grpc::ClientContext ctx_b;
    auto b = stub_->Session(&ctx_b);
    v1::SessionRequest n;
    n.set_request_id(1);
    n.mutable_open();
    ASSERT_TRUE(b->Write(n));
    ASSERT_TRUE(b->Read(&resp));
    n.Clear();
    n.set_request_id(2);
    *n.mutable_sparse_mla() = InlineRequest();
    ASSERT_TRUE(b->Write(n));
    ASSERT_TRUE(b->Read(&resp));
    ASSERT_EQ(resp.code(), 0) << resp.message();
    EXPECT_EQ(std::memcmp(resp.sparse_mla().out().inline_data().data(), want_out_.raw(),
                          SpanBytes(want_out_)),
              0);
    Word(kDone + 8).store(0);
    n.set_request_id(3);
    *n.mutable_sparse_mla() = RegionRequest();
    SetSignal(n.mutable_sparse_mla()->mutable_done(), "r", kDone + 8, 3);
    ASSERT_TRUE(b->Write(n));
    ASSERT_TRUE(b->Read(&resp));
    ASSERT_EQ(resp.code(), 0) << resp.message();
    EXPECT_EQ(AwaitWord(kDone + 8, 5000), 3u);
    EXPECT_TRUE(OutputsMatch());
    // Call 42 still pending after all of that: the second session did not wait for it.
    EXPECT_EQ(Word(kDone).load(), 0u) << "the second session waited for the first";
    ASSERT_TRUE(b->WritesDone());
    EXPECT_FALSE(b->Read(&resp));
    EXPECT_TRUE(b->Finish().ok());
  }
  Poison();
  // The watchdog: an asynchronous failure for request 42, done = value | failure bit.
  ASSERT_TRUE(a->Read(&resp));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(resp.request_id(), 42u);
  EXPECT_EQ(resp.code(), static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED)) << resp.message();
  ASSERT_TRUE(resp.has_call_failed());
  EXPECT_EQ(resp.call_failed().server_request_id(), server_id);
  EXPECT_EQ(resp.call_failed().op(), "sparse_mla");
  EXPECT_EQ(Word(kDone).load(), 5u | kFail);
  EXPECT_GE(waited, std::chrono::milliseconds(4900));
  EXPECT_LT(waited, std::chrono::seconds(8));
  EXPECT_TRUE(OutputsPoisoned()) << "the op ran on unready inputs";
  ASSERT_TRUE(a->WritesDone());
  EXPECT_FALSE(a->Read(&resp));
  EXPECT_TRUE(a->Finish().ok());
}

TEST_F(StreamOrderedTest, CancelledSessionFailsItsPendingWaits) {
  Word(kReady).store(0);
  Word(kDone).store(0);
  {
    grpc::ClientContext ctx;
    auto a = stub_->Session(&ctx);
    v1::SessionRequest m;
    m.set_request_id(1);
    m.mutable_open();
    ASSERT_TRUE(a->Write(m));
    v1::SessionResponse resp;
    ASSERT_TRUE(a->Read(&resp));
    m.Clear();
    m.set_request_id(2);
    *m.mutable_sparse_mla() = RegionRequest();
    SetSignal(m.mutable_sparse_mla()->mutable_ready(), "r", kReady, 1);
    SetSignal(m.mutable_sparse_mla()->mutable_done(), "r", kDone, 1);
    ASSERT_TRUE(a->Write(m));
    ASSERT_TRUE(a->Read(&resp));
    ASSERT_EQ(resp.code(), 0) << resp.message();
    ctx.TryCancel();  // the client goes away
  }
  EXPECT_EQ(AwaitWord(kDone, 3000), 1u | kFail);
  EXPECT_TRUE(OutputsPoisoned());
}

// A drain waits for accepted stream-ordered calls: one whose ready word comes during the drain
// runs and stores done (nothing accepted is lost), and the drain then ends without waiting for its
// timeout.
TEST_F(StreamOrderedTest, DrainRunsCallsWhoseReadyComesInTime) {
  EnqueueUnreadyCall();
  std::atomic<bool> drained{false};
  const auto start = std::chrono::steady_clock::now();
  std::thread drain([&] {
    EXPECT_TRUE(daemon_->Shutdown());
    drained = true;
  });
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_FALSE(drained.load()) << "the drain did not wait for the accepted call";
  EXPECT_EQ(Word(kDone).load(), 0u);
  EXPECT_TRUE(OutputsPoisoned());
  // New calls are refused meanwhile.
  grpc::ClientContext late_ctx;
  v1::SparseMlaResponse late;
  grpc::Status refused = stub_->SparseMla(&late_ctx, RegionRequest(), &late);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  Word(kReady).store(1);
  drain.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4))
      << "the drain waited for its timeout (5 s) after the call ran";
  EXPECT_EQ(Word(kDone).load(), 2u);
  EXPECT_TRUE(OutputsMatch());
}

class StreamOrderedShortDrainTest : public StreamOrderedTest {
 protected:
  void Configure(DaemonConfig* config) override { config->drain_timeout = absl::Milliseconds(500); }
};

// A call whose ready word never comes holds the drain until --drain-timeout, no longer: it then
// fails without running (done has the failure bit, outputs stay poisoned).
TEST_F(StreamOrderedShortDrainTest, DrainTimeoutFailsPendingWaits) {
  EnqueueUnreadyCall();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(daemon_->Shutdown()) << "the drain ended before its timeout";
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, milliseconds(450));
  EXPECT_LT(took, std::chrono::seconds(3)) << "the drain timeout (0.5 s) is a hard limit";
  EXPECT_EQ(Word(kDone).load(), 2u | kFail);
  EXPECT_TRUE(OutputsPoisoned());
  Word(kReady).store(1);  // too late: nothing runs any more
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_TRUE(OutputsPoisoned());
}

TEST_F(StreamOrderedTest, HostileSignalsAreRefused) {
  struct Case {
    std::string region;
    uint64_t offset;
    grpc::StatusCode code;
    const char* says;
  };
  const Case cases[] = {
      {"r", 4, grpc::StatusCode::INVALID_ARGUMENT, "aligned"},
      {"r", static_cast<uint64_t>(shm_.size()) - 4, grpc::StatusCode::INVALID_ARGUMENT, "past"},
      {"r", std::numeric_limits<uint64_t>::max() - 3, grpc::StatusCode::INVALID_ARGUMENT, "past"},
      {"nope", 0, grpc::StatusCode::NOT_FOUND, "nope"},
      {"", 0, grpc::StatusCode::INVALID_ARGUMENT, "region"},
  };
  for (const Case& c : cases) {
    for (const char* field : {"ready", "done"}) {
      v1::SparseMlaRequest req = RegionRequest();
      SetSignal(std::string(field) == "ready" ? req.mutable_ready() : req.mutable_done(), c.region,
                c.offset, 1);
      grpc::ClientContext ctx;
      v1::SparseMlaResponse reply;
      grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
      EXPECT_EQ(s.error_code(), c.code) << field << " " << c.offset << ": " << s.error_message();
      EXPECT_TRUE(absl::StrContains(s.error_message(), field)) << s.error_message();
      EXPECT_TRUE(absl::StrContains(s.error_message(), c.says)) << s.error_message();
    }
  }
  // Another owner's region of the same name (an anonymous TCP caller has its own namespace).
  auto tcp = v1::Attention::NewStub(
      grpc::CreateChannel(daemon_->grpc_addresses()[1], grpc::InsecureChannelCredentials()));
  v1::SparseMlaRequest req = InlineRequest();
  SetSignal(req.mutable_ready(), "r", kReady, 1);
  grpc::ClientContext ctx;
  v1::SparseMlaResponse reply;
  EXPECT_EQ(tcp->SparseMla(&ctx, req, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
  // An inline output cannot be stream-ordered (the reply leaves before the op runs).
  req = RegionRequest();
  req.clear_out();
  SetSignal(req.mutable_ready(), "r", kReady, 1);
  grpc::ClientContext ctx2;
  grpc::Status s = stub_->SparseMla(&ctx2, req, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "out")) << s.error_message();
  EXPECT_TRUE(OutputsPoisoned());
}

// Signal values stay below the failure bit, 2^62 (docs/SERVICE.md "Failure bit"): a ready or
// done value from 2^62 up is refused at accept naming the field, for an op request and for
// RunPrepared; 2^62 - 1 is the largest that runs.
TEST_F(StreamOrderedTest, SignalValuesFromTheFailureBitUpAreRefused) {
  constexpr uint64_t kBit = uint64_t{1} << 62;
  static_assert(kFail == kBit);
  v1::PrepareCallRequest prep;
  *prep.mutable_sparse_mla() = RegionRequest();
  v1::PrepareCallResponse prepared;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_->PrepareCall(&ctx, prep, &prepared);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  std::mt19937_64 rng = attnd::testing::MakeRng();
  const uint64_t random_high = kBit + rng() % (std::numeric_limits<uint64_t>::max() - kBit);
  for (uint64_t value : {kBit, kBit + 7, uint64_t{1} << 63, (uint64_t{1} << 63) | 7, random_high,
                         std::numeric_limits<uint64_t>::max()}) {
    for (const char* field : {"ready", "done"}) {
      const bool ready = std::string(field) == "ready";
      Word(kReady).store(0);
      Word(kDone).store(0);
      v1::SparseMlaRequest req = RegionRequest();
      SetSignal(req.mutable_ready(), "r", kReady, ready ? value : 1);
      SetSignal(req.mutable_done(), "r", kDone, ready ? 1 : value);
      grpc::ClientContext ctx;
      v1::SparseMlaResponse reply;
      grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field << " " << value;
      EXPECT_TRUE(absl::StrContains(s.error_message(), absl::StrCat(field, ": value ", value)))
          << s.error_message();
      EXPECT_TRUE(absl::StrContains(s.error_message(), "2^62")) << s.error_message();

      v1::RunPreparedRequest run;
      run.set_call_id(prepared.call_id());
      SetSignal(run.mutable_ready(), "r", kReady, ready ? value : 1);
      SetSignal(run.mutable_done(), "r", kDone, ready ? 1 : value);
      grpc::ClientContext ctx2;
      v1::RunPreparedResponse run_reply;
      s = stub_->RunPrepared(&ctx2, run, &run_reply);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field << " " << value;
      EXPECT_TRUE(absl::StrContains(s.error_message(), absl::StrCat(field, ": value ", value)))
          << s.error_message();
      // Nothing was queued: the ready word reached, no done stored, no op run.
      Word(kReady).store(1, std::memory_order_release);
      std::this_thread::sleep_for(milliseconds(20));
      EXPECT_EQ(Word(kDone).load(), 0u);
      EXPECT_TRUE(OutputsPoisoned());
    }
  }
  // The largest value allowed runs and is stored as it is.
  Word(kReady).store(0);
  Word(kDone).store(0);
  v1::SparseMlaRequest req = RegionRequest();
  SetSignal(req.mutable_ready(), "r", kReady, kBit - 1);
  SetSignal(req.mutable_done(), "r", kDone, kBit - 1);
  grpc::ClientContext ctx;
  v1::SparseMlaResponse reply;
  grpc::Status s = stub_->SparseMla(&ctx, req, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_TRUE(OutputsPoisoned());
  Word(kReady).store(kBit - 1, std::memory_order_release);
  EXPECT_EQ(AwaitWord(kDone, 5000), kBit - 1);
  EXPECT_TRUE(OutputsMatch());
}

TEST_F(StreamOrderedTest, PreparedCallRunsManyTimesWithNewData) {
  v1::PrepareCallRequest prep;
  *prep.mutable_sparse_mla() = RegionRequest();
  v1::PrepareCallResponse prepared;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_->PrepareCall(&ctx, prep, &prepared);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_NE(prepared.call_id(), 0u);
  EXPECT_EQ(prepared.op(), "sparse_mla");
  std::mt19937_64 rng = attnd::testing::MakeRng();
  for (int round = 0; round < 4; ++round) {
    // New data written into the same regions, then run by id (blocking, then stream-ordered).
    attnd::testing::FillNormal(q_, rng, 1.0);
    attnd::testing::FillUniformInt(indices_, rng, -2, kS + 2);
    std::memcpy(shm_.data() + kQ, q_.raw(), SpanBytes(q_));
    std::memcpy(shm_.data() + kIdx, indices_.raw(), SpanBytes(indices_));
    kernels::sparse_mla::Params p;
    p.q = q_.tensor();
    p.kv = kv_.tensor();
    p.indices = indices_.tensor();
    p.sm_scale = kScale;
    p.out = want_out_.tensor();
    p.lse = want_lse_.tensor();
    kernels::ExecContext ectx;
    ectx.pool = attnd::testing::TestPool();
    ASSERT_TRUE(kernels::sparse_mla::Run(p, ectx).ok());
    Poison();
    v1::RunPreparedRequest run;
    run.set_call_id(prepared.call_id());
    if (round % 2 == 1) {
      Word(kReady).store(0);
      Word(kDone).store(0);
      SetSignal(run.mutable_ready(), "r", kReady, round);
      SetSignal(run.mutable_done(), "r", kDone, round);
    }
    grpc::ClientContext ctx;
    v1::RunPreparedResponse reply;
    grpc::Status s = stub_->RunPrepared(&ctx, run, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    if (round % 2 == 1) {
      EXPECT_TRUE(reply.stats().enqueued());
      std::this_thread::sleep_for(milliseconds(20));
      EXPECT_TRUE(OutputsPoisoned());
      Word(kReady).store(round, std::memory_order_release);
      EXPECT_EQ(AwaitWord(kDone, 5000), static_cast<uint64_t>(round));
    } else {
      EXPECT_FALSE(reply.stats().enqueued());
      EXPECT_EQ(reply.stats().impl(), "cpu");
      EXPECT_GT(reply.stats().flops(), 0);
    }
    EXPECT_TRUE(OutputsMatch()) << "round " << round;
  }
  // Another owner cannot run or release it.
  auto tcp = v1::Attention::NewStub(
      grpc::CreateChannel(daemon_->grpc_addresses()[1], grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    v1::RunPreparedRequest run;
    run.set_call_id(prepared.call_id());
    v1::RunPreparedResponse reply;
    EXPECT_EQ(tcp->RunPrepared(&ctx, run, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
    grpc::ClientContext ctx2;
    v1::ReleaseCallRequest rel;
    rel.set_call_id(prepared.call_id());
    v1::ReleaseCallResponse rr;
    EXPECT_EQ(tcp->ReleaseCall(&ctx2, rel, &rr).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Unknown id.
  {
    grpc::ClientContext ctx;
    v1::RunPreparedRequest run;
    run.set_call_id(prepared.call_id() + 1000);
    v1::RunPreparedResponse reply;
    EXPECT_EQ(stub_->RunPrepared(&ctx, run, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Unregistering a region it names releases it; registering the name again does not revive it.
  {
    grpc::ClientContext ctx;
    v1::UnregisterRegionRequest un;
    un.set_name("r");
    v1::UnregisterRegionResponse ur;
    ASSERT_TRUE(stub_->UnregisterRegion(&ctx, un, &ur).ok());
  }
  Register(stub_.get(), "r");
  grpc::ClientContext ctx;
  v1::RunPreparedRequest run;
  run.set_call_id(prepared.call_id());
  v1::RunPreparedResponse reply;
  grpc::Status s = stub_->RunPrepared(&ctx, run, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "unregistered")) << s.error_message();
}

TEST_F(StreamOrderedTest, TruncatedRegionUnderAPreparedCallFailsCleanly) {
  // A second object holding the kv, shrunk by its owner after the call was prepared.
  ScopedShm other(1 << 20);
  ASSERT_TRUE(other.ok());
  {
    grpc::ClientContext ctx;
    v1::RegisterHostRegionRequest reg;
    reg.set_name("kvobj");
    reg.set_key(other.key());
    reg.set_byte_size(other.size());
    v1::RegisterRegionResponse r;
    ASSERT_TRUE(stub_->RegisterHostRegion(&ctx, reg, &r).ok());
  }
  v1::PrepareCallRequest prep;
  *prep.mutable_sparse_mla() = RegionRequest();
  *prep.mutable_sparse_mla()->mutable_kv() = RegionTensor(kv_, v1::DTYPE_BF16, other, "kvobj", 0);
  v1::PrepareCallResponse prepared;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->PrepareCall(&ctx, prep, &prepared).ok());
  }
  const int fd = shm_open(other.key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  for (bool ordered : {false, true}) {
    Poison();
    Word(kDone).store(0);
    v1::RunPreparedRequest run;
    run.set_call_id(prepared.call_id());
    if (ordered) SetSignal(run.mutable_done(), "r", kDone, 1);
    grpc::ClientContext ctx;
    v1::RunPreparedResponse reply;
    grpc::Status s = stub_->RunPrepared(&ctx, run, &reply);
    if (ordered) {
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(AwaitWord(kDone, 5000), 1u | kFail);
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
      EXPECT_TRUE(absl::StrContains(s.error_message(), "kvobj")) << s.error_message();
    }
  }
}

TEST_F(StreamOrderedTest, PrepareRefusesInlineTensorsAndSignals) {
  v1::PrepareCallRequest prep;
  *prep.mutable_sparse_mla() = RegionRequest();
  *prep.mutable_sparse_mla()->mutable_kv() = InlineTensor(kv_, v1::DTYPE_BF16);
  grpc::ClientContext ctx;
  v1::PrepareCallResponse r;
  grpc::Status s = stub_->PrepareCall(&ctx, prep, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(s.error_message(), "kv:")) << s.error_message();

  *prep.mutable_sparse_mla() = RegionRequest();
  prep.mutable_sparse_mla()->clear_lse();  // returned inline when absent
  grpc::ClientContext ctx2;
  s = stub_->PrepareCall(&ctx2, prep, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(s.error_message(), "lse:")) << s.error_message();

  *prep.mutable_sparse_mla() = RegionRequest();
  SetSignal(prep.mutable_sparse_mla()->mutable_ready(), "r", kReady, 1);
  grpc::ClientContext ctx3;
  EXPECT_EQ(stub_->PrepareCall(&ctx3, prep, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  grpc::ClientContext ctx4;
  EXPECT_EQ(stub_->PrepareCall(&ctx4, v1::PrepareCallRequest(), &r).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(StreamOrderedTest, SessionPreparedCallsGoWithTheLease) {
  uint64_t id = 0;
  {
    grpc::ClientContext ctx;
    auto a = stub_->Session(&ctx);
    v1::SessionRequest m;
    m.set_request_id(1);
    m.mutable_open();
    ASSERT_TRUE(a->Write(m));
    v1::SessionResponse resp;
    ASSERT_TRUE(a->Read(&resp));
    m.Clear();
    m.set_request_id(2);
    *m.mutable_prepare_call()->mutable_sparse_mla() = RegionRequest();
    ASSERT_TRUE(a->Write(m));
    ASSERT_TRUE(a->Read(&resp));
    ASSERT_EQ(resp.code(), 0) << resp.message();
    id = resp.prepare_call().call_id();
    m.Clear();
    m.set_request_id(3);
    m.mutable_run_prepared()->set_call_id(id);
    ASSERT_TRUE(a->Write(m));
    ASSERT_TRUE(a->Read(&resp));
    ASSERT_EQ(resp.code(), 0) << resp.message();
    EXPECT_EQ(resp.request_id(), 3u);
    EXPECT_EQ(resp.run_prepared().stats().impl(), "cpu");
    EXPECT_TRUE(OutputsMatch());
    // A unary RunPrepared of the same caller works while the Session lives.
    grpc::ClientContext uctx;
    v1::RunPreparedRequest run;
    run.set_call_id(id);
    v1::RunPreparedResponse reply;
    EXPECT_TRUE(stub_->RunPrepared(&uctx, run, &reply).ok());
    ctx.TryCancel();  // killed
  }
  for (int i = 0; i < 200; ++i) {
    grpc::ClientContext ctx;
    v1::RunPreparedRequest run;
    run.set_call_id(id);
    v1::RunPreparedResponse reply;
    grpc::Status s = stub_->RunPrepared(&ctx, run, &reply);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      EXPECT_TRUE(absl::StrContains(s.error_message(), "lease")) << s.error_message();
      return;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  ADD_FAILURE() << "the prepared call outlived its Session";
}

}  // namespace
}  // namespace attnd::server::testing
