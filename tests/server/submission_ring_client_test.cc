// The C++ client's SubmissionRing (client/submission_ring.h) against an in-process CPU attnd:
// prepared calls submitted through the ring run in order (NaN-poisoned outputs stay poisoned
// until the first call's ready word comes), every done word is stored, a full ring answers
// RESOURCE_EXHAUSTED and a closed one FAILED_PRECONDITION; a blocking Call through the ring
// returns once its done word is stored (its outputs complete), also with the daemon's poller
// spinning (DaemonConfig::worker_spin), and refuses what it cannot wait for.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "client/client.h"
#include "client/host_region.h"
#include "client/ordered_caller.h"
#include "client/ring_caller.h"
#include "client/session.h"
#include "client/stream_ordered.h"
#include "client/submission_ring.h"
#include "tests/server/daemon_fixture.h"

namespace attnd::server::testing {
namespace {

class SubmissionRingClientTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    client::ConnectOptions o;
    o.target = daemon_->grpc_addresses()[0];
    absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    client::HostRegionOptions ro;
    ro.bytes = 2 << 20;
    ro.name = "cpp-data";
    absl::StatusOr<std::unique_ptr<client::HostRegion>> r =
        client::HostRegion::Create(client_.get(), ro);
    ASSERT_TRUE(r.ok()) << r.status();
    region_ = *std::move(r);
    ro.bytes = 64 << 10;
    ro.name = "cpp-ring";
    r = client::HostRegion::Create(client_.get(), ro);
    ASSERT_TRUE(r.ok()) << r.status();
    ring_region_ = *std::move(r);
    // Signal words first (128 of them), then the call's tensors.
    absl::StatusOr<kernels::Tensor> words = region_->Allocate(DType::kU8, {1024});
    ASSERT_TRUE(words.ok());
    words_ = static_cast<uint64_t*>(words->data);
    std::memset(words_, 0, 1024);
    p_.q = Copy(q_);
    p_.kv = Copy(kv_);
    p_.indices = Copy(indices_);
    p_.sm_scale = kScale;
    p_.out = *region_->Allocate(DType::kBF16, {kT, kH, 512});
    p_.lse = *region_->Allocate(DType::kF32, {kT, kH});
    absl::StatusOr<uint64_t> call = client::PrepareCall(client_.get(), p_);
    ASSERT_TRUE(call.ok()) << call.status();
    call_ = *call;
  }
  void TearDown() override {
    ring_region_.reset();
    region_.reset();
    client_.reset();
    DaemonTest::TearDown();
  }

  kernels::Tensor Copy(const HostTensor& h) {
    std::vector<int64_t> shape(h.tensor().shape.begin(),
                               h.tensor().shape.begin() + h.tensor().rank);
    kernels::Tensor t = *region_->Allocate(h.tensor().dtype, shape);
    std::memcpy(t.data, h.raw(), SpanBytes(h));
    return t;
  }
  void Poison() {
    std::memset(p_.out.data, 0xff, SpanBytes(want_out_));
    std::memset(p_.lse.data, 0xff, SpanBytes(want_lse_));
  }
  bool Poisoned() const {
    const auto* b = static_cast<const uint8_t*>(p_.out.data);
    for (size_t i = 0; i < SpanBytes(want_out_); ++i) {
      if (b[i] != 0xff) return false;
    }
    return true;
  }
  bool Matches() const {
    return std::memcmp(p_.out.data, want_out_.raw(), SpanBytes(want_out_)) == 0 &&
           std::memcmp(p_.lse.data, want_lse_.raw(), SpanBytes(want_lse_)) == 0;
  }
  static uint64_t Offset(int i) { return 8 * static_cast<uint64_t>(i); }

  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::HostRegion> region_, ring_region_;
  uint64_t* words_ = nullptr;
  kernels::sparse_mla::Params p_;
  uint64_t call_ = 0;
};

TEST_F(SubmissionRingClientTest, SubmittedCallsRunInOrder) {
  absl::StatusOr<std::unique_ptr<client::SubmissionRing>> ring =
      client::SubmissionRing::Open(client_.get(), *ring_region_, 0, 8, region_.get());
  ASSERT_TRUE(ring.ok()) << ring.status();
  Poison();
  // The first call waits for word 0; the next ones (no ready word) wait behind it.
  ASSERT_EQ((*ring)->Submit(call_, Offset(0), 1, Offset(1), 1), absl::StatusCode::kOk);
  constexpr int kN = 40;  // five times around the ring
  int full = 0;
  for (int i = 1; i < kN; ++i) {
    absl::StatusCode c;
    while ((c = (*ring)->Submit(call_, client::SubmissionRing::kNoReady, 0, Offset(1 + i),
                                100 + i)) == absl::StatusCode::kResourceExhausted) {
      ++full;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    ASSERT_EQ(c, absl::StatusCode::kOk) << i;
  }
  EXPECT_EQ((*ring)->submitted(), static_cast<uint64_t>(kN));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(Poisoned());
  for (int i = 0; i < kN; ++i) EXPECT_EQ(client::LoadSignal(words_ + 1 + i), 0u) << i;
  client::StoreSignal(words_, 1);
  ASSERT_TRUE(client::WaitSignal(words_ + 1, 1, absl::Seconds(10)).ok());
  for (int i = 1; i < kN; ++i) {
    absl::StatusOr<uint64_t> d = client::WaitSignal(words_ + 1 + i, 100 + i, absl::Seconds(10));
    ASSERT_TRUE(d.ok()) << i << ": " << d.status();
    EXPECT_EQ(*d, static_cast<uint64_t>(100 + i));
  }
  EXPECT_TRUE(Matches());
  EXPECT_GT(full, 0) << "an 8-entry ring filled up behind the unready first call";
  EXPECT_EQ((*ring)->taken(), static_cast<uint64_t>(kN));
  EXPECT_TRUE((*ring)->Close().ok());
  EXPECT_EQ((*ring)->state(), 1u);  // closed
  EXPECT_EQ((*ring)->Submit(call_, client::SubmissionRing::kNoReady, 0, Offset(0), 1),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(SubmissionRingClientTest, FullRingAndUnknownCall) {
  absl::StatusOr<std::unique_ptr<client::SubmissionRing>> ring =
      client::SubmissionRing::Open(client_.get(), *ring_region_, 64, 1, region_.get());
  ASSERT_TRUE(ring.ok()) << ring.status();
  // One slot: Submits back to back find it full until the poller takes the entry (it polls
  // every 50 to 500 µs; a Submit takes nanoseconds).
  int ok = 0, full = 0;
  for (int i = 0; i < 1000; ++i) {
    const absl::StatusCode c =
        (*ring)->Submit(call_ + 99, client::SubmissionRing::kNoReady, 0, Offset(2), 3);
    ASSERT_TRUE(c == absl::StatusCode::kOk || c == absl::StatusCode::kResourceExhausted) << c;
    (c == absl::StatusCode::kOk ? ok : full) += 1;
  }
  EXPECT_GE(ok, 1);
  EXPECT_GT(full, 0);
  // The unknown call id gets the failure bit.
  absl::StatusOr<uint64_t> d = client::WaitSignal(words_ + 2, 3, absl::Seconds(10));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kAborted) << d.status();
  EXPECT_EQ(client::LoadSignal(words_ + 2), 3 | client::kSignalFailureBit);
  // Misplaced rings are refused by the client or the daemon.
  EXPECT_FALSE(client::SubmissionRing::Open(client_.get(), *ring_region_, 32, 4).ok());
  EXPECT_FALSE(client::SubmissionRing::Open(client_.get(), *ring_region_, 0, 4096).ok());
}

TEST_F(SubmissionRingClientTest, RingOnASessionEndsWithIt) {
  absl::StatusOr<std::unique_ptr<client::Session>> session =
      client::Session::Open(client_.get(), {});
  ASSERT_TRUE(session.ok()) << session.status();
  absl::StatusOr<std::unique_ptr<client::SubmissionRing>> ring =
      client::SubmissionRing::Open(session->get(), *ring_region_, 0, 16, region_.get());
  ASSERT_TRUE(ring.ok()) << ring.status();
  for (uint64_t run = 1; run <= 3; ++run) {
    Poison();
    ASSERT_EQ((*ring)->Submit(call_, Offset(0), run, Offset(1), run), absl::StatusCode::kOk);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_TRUE(Poisoned());
    client::StoreSignal(words_, run);
    ASSERT_TRUE(client::WaitSignal(words_ + 1, run, absl::Seconds(10)).ok());
    EXPECT_TRUE(Matches()) << run;
  }
  // A second ring on the Session, closed by message; unknown ids are NOT_FOUND.
  absl::StatusOr<std::unique_ptr<client::SubmissionRing>> second =
      client::SubmissionRing::Open(session->get(), *ring_region_, 4096, 4, region_.get());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE((*second)->Close().ok());
  v1::SessionRequest close;
  close.mutable_close_ring()->set_ring_id((*second)->ring_id());
  EXPECT_EQ((*session)->Exchange(close, absl::Seconds(10)).status().code(),
            absl::StatusCode::kNotFound);
  // The Session ends: its lease takes the first ring with it.
  EXPECT_TRUE((*session)->Close().ok());
  for (int i = 0; i < 5000 && (*ring)->state() != 1; ++i) {     // the daemon ends the lease after
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the stream's status
  }
  EXPECT_EQ((*ring)->state(), 1u);
  EXPECT_EQ((*ring)->Submit(call_, client::SubmissionRing::kNoReady, 0, Offset(1), 9),
            absl::StatusCode::kFailedPrecondition);
  ring->reset();  // its CloseRing on the ended Session fails quietly
}

// A ring whose signal region is unregistered is closed by the daemon; the client's Close() then
// gets NOT_FOUND from CloseRing and takes it as closed (docs/SERVICE.md "Submission rings").
TEST_F(SubmissionRingClientTest, CloseAfterTheDaemonClosedTheRingIsOk) {
  client::HostRegionOptions ro;
  ro.bytes = 4096;
  ro.name = "cpp-signals-gone";
  absl::StatusOr<std::unique_ptr<client::HostRegion>> gone =
      client::HostRegion::Create(client_.get(), ro);
  ASSERT_TRUE(gone.ok()) << gone.status();
  absl::StatusOr<std::unique_ptr<client::SubmissionRing>> ring =
      client::SubmissionRing::Open(client_.get(), *ring_region_, 8192, 4, gone->get());
  ASSERT_TRUE(ring.ok()) << ring.status();
  gone->reset();  // unregisters the ring's signal region: the daemon closes the ring
  for (int i = 0; i < 5000 && (*ring)->state() != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ((*ring)->state(), 1u);
  EXPECT_TRUE((*ring)->Close().ok());
  EXPECT_TRUE((*ring)->Close().ok());  // idempotent
}

// SubmissionRing::Call: each call's outputs are complete when it returns (poisoned before),
// its errors are the done word's (failure bit, deadline) or the ring's (closed).
TEST_F(SubmissionRingClientTest, CallWaitsForItsDoneWord) {
  absl::StatusOr<std::unique_ptr<client::SubmissionRing>> ring =
      client::SubmissionRing::Open(client_.get(), *ring_region_, 0, 4, region_.get());
  ASSERT_TRUE(ring.ok()) << ring.status();
  for (const absl::Duration spin : {absl::ZeroDuration(), absl::Milliseconds(2)}) {
    for (uint64_t v = 1; v <= 12; ++v) {  // three times around the ring
      Poison();
      const uint64_t value = (spin > absl::ZeroDuration() ? 100 : 0) + v;
      absl::StatusOr<uint64_t> d = (*ring)->Call(call_, client::SubmissionRing::kNoReady, 0,
                                                 Offset(1), value, absl::Seconds(10), spin);
      ASSERT_TRUE(d.ok()) << v << ": " << d.status();
      EXPECT_EQ(*d, value);
      EXPECT_TRUE(Matches()) << "outputs complete when Call returns, call " << v;
    }
  }
  // A ready word not reached: DEADLINE_EXCEEDED with the outputs untouched; once the word comes
  // the call runs (its done word tells).
  Poison();
  absl::StatusOr<uint64_t> late = (*ring)->Call(call_, Offset(0), 5, Offset(2), 1,
                                                absl::Milliseconds(30), absl::Milliseconds(1));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_TRUE(Poisoned());
  client::StoreSignal(words_, 5);
  ASSERT_TRUE(client::WaitSignal(words_ + 2, 1, absl::Seconds(10)).ok());
  EXPECT_TRUE(Matches());
  // An unknown call: ABORTED (the failure bit).
  absl::StatusOr<uint64_t> unknown = (*ring)->Call(call_ + 77, client::SubmissionRing::kNoReady, 0,
                                                   Offset(3), 1, absl::Seconds(10));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kAborted) << unknown.status();
  // Done words the client cannot read are refused before anything is submitted.
  const uint64_t before = (*ring)->submitted();
  for (const uint64_t bad : {region_->size(), region_->size() - 4, uint64_t{12}, ~uint64_t{0}}) {
    absl::StatusOr<uint64_t> r =
        (*ring)->Call(call_, client::SubmissionRing::kNoReady, 0, bad, 1, absl::Seconds(1));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad << ": " << r.status();
  }
  EXPECT_EQ((*ring)->submitted(), before);
  // A closed ring: FAILED_PRECONDITION at once.
  ASSERT_TRUE((*ring)->Close().ok());
  absl::StatusOr<uint64_t> closed =
      (*ring)->Call(call_, client::SubmissionRing::kNoReady, 0, Offset(1), 50, absl::Seconds(10));
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kFailedPrecondition) << closed.status();
}

TEST_F(SubmissionRingClientTest, WaitSignalSpinsThenHonoursItsTimeout) {
  client::StoreSignal(words_ + 4, 0);
  for (const absl::Duration spin : {absl::Milliseconds(1), absl::Seconds(10)}) {
    const absl::Time start = absl::Now();
    absl::StatusOr<uint64_t> r = client::WaitSignal(words_ + 4, 1, absl::Milliseconds(20), spin);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "a spin longer than the timeout";
  }
  std::thread store([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    client::StoreSignal(words_ + 4, 3);
  });
  absl::StatusOr<uint64_t> r =
      client::WaitSignal(words_ + 4, 2, absl::Seconds(10), absl::Milliseconds(50));
  store.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 3u);
}

// The same daemon with its poller (and workers) polling after each call (--worker-spin).
class SpinningRingClientTest : public SubmissionRingClientTest {
 protected:
  void Configure(DaemonConfig* config) override { config->worker_spin = absl::Milliseconds(2); }
};

TEST_F(SpinningRingClientTest, CallsAndRingChangesWhileThePollerSpins) {
  absl::StatusOr<std::unique_ptr<client::SubmissionRing>> ring =
      client::SubmissionRing::Open(client_.get(), *ring_region_, 0, 8, region_.get());
  ASSERT_TRUE(ring.ok()) << ring.status();
  // Another thread opens and closes rings of its own while this one keeps the poller busy: the
  // table's changes must get through a poller that sweeps without sleeping.
  std::atomic<bool> stop{false};
  std::atomic<int> changes{0};
  absl::Duration slowest;
  std::thread other([&] {
    uint64_t offset = 4096;
    while (!stop.load()) {
      const absl::Time t0 = absl::Now();
      absl::StatusOr<std::unique_ptr<client::SubmissionRing>> r =
          client::SubmissionRing::Open(client_.get(), *ring_region_, offset, 4, region_.get());
      if (!r.ok() || !(*r)->Close().ok()) break;
      slowest = std::max(slowest, absl::Now() - t0);
      changes.fetch_add(1);
      offset = offset == 4096 ? 8192 : 4096;
    }
  });
  for (uint64_t v = 1; v <= 300; ++v) {
    if (v % 50 == 1) Poison();
    absl::StatusOr<uint64_t> d =
        (*ring)->Call(call_, client::SubmissionRing::kNoReady, 0, Offset(1), v, absl::Seconds(10),
                      absl::Milliseconds(1));
    ASSERT_TRUE(d.ok()) << v << ": " << d.status();
    if (v % 50 == 1) {
      EXPECT_TRUE(Matches()) << v;
    }
  }
  // Opens and closes go on after the calls too (the poller spins up to 2 ms past the last).
  const int during = changes.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop.store(true);
  other.join();
  EXPECT_GT(during, 0) << "no ring opened and closed while the poller was busy";
  EXPECT_LT(slowest, absl::Seconds(5));
  EXPECT_TRUE((*ring)->Close().ok());
}

TEST_F(SpinningRingClientTest, ReadyWordsStoredWhileTheWaiterSpins) {
  // The stream-ordered waiter polls without sleeping after a call is queued: a ready word
  // stored a little later (within and past its spin) starts the call, never earlier.
  absl::StatusOr<std::unique_ptr<client::SubmissionRing>> ring =
      client::SubmissionRing::Open(client_.get(), *ring_region_, 0, 8, region_.get());
  ASSERT_TRUE(ring.ok()) << ring.status();
  for (const int delay_us : {300, 5000}) {
    for (uint64_t v = 1; v <= 5; ++v) {
      const uint64_t value = (delay_us == 300 ? 0 : 100) + v;
      Poison();
      std::thread store([this, delay_us, value] {
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
        ASSERT_TRUE(Poisoned()) << "ran before its ready word";
        client::StoreSignal(words_, value);
      });
      absl::StatusOr<uint64_t> d = (*ring)->Call(call_, Offset(0), value, Offset(1), value,
                                                 absl::Seconds(10), absl::Milliseconds(1));
      store.join();
      ASSERT_TRUE(d.ok()) << delay_us << " " << v << ": " << d.status();
      EXPECT_TRUE(Matches()) << delay_us << " " << v;
    }
  }
}

TEST_F(SubmissionRingClientTest, RingCallerRunsPreparedCallsBlocking) {
  for (const uint32_t bad : {0u, 3u, 8192u}) {
    client::RingCallerOptions o;
    o.entries = bad;
    EXPECT_EQ(client::RingCaller::Open(client_.get(), o).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  client::RingCallerOptions o;
  o.entries = 4;
  absl::StatusOr<std::unique_ptr<client::RingCaller>> caller =
      client::RingCaller::Open(client_.get(), o);
  ASSERT_TRUE(caller.ok()) << caller.status();
  for (int i = 0; i < 10; ++i) {  // around its four slots more than twice
    Poison();
    absl::Status s = (*caller)->Run(call_, absl::Seconds(10));
    ASSERT_TRUE(s.ok()) << i << ": " << s;
    EXPECT_TRUE(Matches()) << "outputs in place when Run returns, run " << i;
  }
  // A failed call is ABORTED; the caller goes on.
  EXPECT_EQ((*caller)->Run(call_ + 55, absl::Seconds(10)).code(), absl::StatusCode::kAborted);
  Poison();
  ASSERT_TRUE((*caller)->Run(call_, absl::Seconds(10)).ok());
  EXPECT_TRUE(Matches());
  EXPECT_EQ((*caller)->calls(), 12u);
  EXPECT_TRUE((*caller)->Close().ok());
  EXPECT_TRUE((*caller)->Close().ok());  // idempotent
  EXPECT_EQ((*caller)->Run(call_).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SubmissionRingClientTest, RingCallerRunAfterWaitsForTheReadyWord) {
  absl::StatusOr<std::unique_ptr<client::RingCaller>> caller =
      client::RingCaller::Open(client_.get(), {});
  ASSERT_TRUE(caller.ok()) << caller.status();
  ASSERT_TRUE((*caller)->Run(call_, absl::Seconds(10)).ok());  // Run and RunAfter mix
  for (int i = 0; i < 3; ++i) {
    Poison();
    std::thread producer;
    uint64_t* seen = nullptr;
    absl::Status s = (*caller)->RunAfter(
        call_,
        [&](uint64_t* word, uint64_t value) {
          seen = word;
          EXPECT_TRUE((*caller)->region().Contains(word, 8));
          // A "stream" that gets to the write 20 ms later.
          producer = std::thread([this, word, value] {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            EXPECT_TRUE(Poisoned()) << "ran before its ready word";
            client::StoreSignal(word, value);
          });
          return absl::OkStatus();
        },
        absl::Seconds(10));
    producer.join();
    ASSERT_TRUE(s.ok()) << i << ": " << s;
    EXPECT_NE(seen, nullptr);
    EXPECT_TRUE(Matches()) << i;
  }
  EXPECT_EQ((*caller)->calls(), 4u);
  // The callback's error is the call's; nothing was submitted.
  EXPECT_EQ(
      (*caller)
          ->RunAfter(call_, [](uint64_t*, uint64_t) { return absl::InternalError("no stream"); })
          .code(),
      absl::StatusCode::kInternal);
  EXPECT_EQ((*caller)->calls(), 4u);
  ASSERT_TRUE((*caller)->Run(call_, absl::Seconds(10)).ok());
}

TEST_F(SubmissionRingClientTest, RingCallerOnASessionEndsWithItsLease) {
  absl::StatusOr<std::unique_ptr<client::Session>> session =
      client::Session::Open(client_.get(), {});
  ASSERT_TRUE(session.ok()) << session.status();
  client::RingCallerOptions o;
  o.session = session->get();
  o.spin = absl::ZeroDuration();  // sleeping between looks works too
  absl::StatusOr<std::unique_ptr<client::RingCaller>> caller =
      client::RingCaller::Open(client_.get(), o);
  ASSERT_TRUE(caller.ok()) << caller.status();
  for (int i = 0; i < 3; ++i) {
    Poison();
    ASSERT_TRUE((*caller)->Run(call_, absl::Seconds(10)).ok()) << i;
    EXPECT_TRUE(Matches()) << i;
  }
  // The Session ends: its lease takes the ring (and the caller's region) with it.
  ASSERT_TRUE((*session)->Close().ok());
  absl::Status after = absl::OkStatus();
  for (int i = 0; i < 5000 && after.ok(); ++i) {  // the daemon ends the lease after the status
    after = (*caller)->Run(call_, absl::Seconds(10));
    if (after.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  caller->reset();  // its CloseRing and unregistration on the ended lease fail quietly
}

TEST_F(SubmissionRingClientTest, OrderedCallerRunsCallsAndPreparesOnce) {
  for (const auto& [entries, depth, prepared] :
       {std::tuple{3u, 4u, 4u}, std::tuple{4u, 0u, 4u}, std::tuple{4u, 4u, 0u},
        std::tuple{4u, 5000u, 4u}}) {
    client::OrderedCallerOptions o;
    o.entries = entries;
    o.depth = depth;
    o.max_prepared = prepared;
    EXPECT_EQ(client::OrderedCaller::Open(client_.get(), o).status().code(),
              absl::StatusCode::kInvalidArgument)
        << entries << " " << depth << " " << prepared;
  }
  client::OrderedCallerOptions o;
  o.entries = 4;
  o.depth = 2;  // every other call reuses a done word: Call waits for the oldest
  absl::StatusOr<std::unique_ptr<client::OrderedCaller>> caller =
      client::OrderedCaller::Open(client_.get(), o);
  ASSERT_TRUE(caller.ok()) << caller.status();
  for (int i = 0; i < 10; ++i) {
    Poison();
    absl::StatusOr<uint64_t> n = (*caller)->Call(p_);
    ASSERT_TRUE(n.ok()) << i << ": " << n.status();
    EXPECT_EQ(*n, static_cast<uint64_t>(i + 1));
    ASSERT_TRUE((*caller)->Wait(*n, absl::Seconds(10)).ok()) << i;
    EXPECT_TRUE(Matches()) << "outputs in place once Wait returns, call " << i;
  }
  for (int i = 0; i < 6; ++i) ASSERT_TRUE((*caller)->Call(p_).ok()) << i;  // back to back
  ASSERT_TRUE((*caller)->Wait().ok());
  EXPECT_TRUE(Matches());
  EXPECT_EQ((*caller)->prepares(), 1u) << "the same request prepared again";
  EXPECT_EQ((*caller)->retired(), 16u);
  EXPECT_EQ((*caller)->pending(), 0u);
  const std::vector<uint64_t> ids = (*caller)->prepared_ids();
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_TRUE((*caller)->Close().ok());
  EXPECT_TRUE((*caller)->Close().ok());  // idempotent
  EXPECT_EQ(client::RunPrepared(client_.get(), ids[0]).status().code(), absl::StatusCode::kNotFound)
      << "released at Close";
  EXPECT_EQ((*caller)->Call(p_).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SubmissionRingClientTest, OrderedCallerWithStreamHooks) {
  absl::StatusOr<std::unique_ptr<client::OrderedCaller>> caller =
      client::OrderedCaller::Open(client_.get(), {});
  ASSERT_TRUE(caller.ok()) << caller.status();
  std::vector<std::pair<uint64_t*, uint64_t>> writes, waits;
  std::vector<std::thread> producers;
  client::StreamHooks hooks;
  hooks.write = [&](uint64_t* word, uint64_t value) {
    writes.emplace_back(word, value);
    EXPECT_TRUE((*caller)->region().Contains(word, 8));
    // A "stream" that gets to the write 20 ms later.
    producers.emplace_back([this, word, value] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_TRUE(Poisoned()) << "ran before its ready word";
      client::StoreSignal(word, value);
    });
    return absl::OkStatus();
  };
  hooks.wait = [&](uint64_t* word, uint64_t value) {
    waits.emplace_back(word, value);
    EXPECT_TRUE((*caller)->region().Contains(word, 8));
    return absl::OkStatus();
  };
  for (int i = 0; i < 3; ++i) {
    Poison();
    absl::StatusOr<uint64_t> n = (*caller)->Call(p_, &hooks);
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_TRUE((*caller)->Wait(*n, absl::Seconds(10)).ok());
    EXPECT_TRUE(Matches()) << i;
    // The wait hook names the call's own done word, stored with its number.
    ASSERT_EQ(waits.size(), static_cast<size_t>(i + 1));
    EXPECT_EQ(waits.back().second, *n);
    EXPECT_EQ(client::LoadSignal(waits.back().first), *n);
  }
  for (std::thread& t : producers) t.join();
  ASSERT_EQ(writes.size(), 3u);
  EXPECT_EQ(writes[0].first, writes[2].first) << "one ready word, its value growing";
  EXPECT_EQ(writes[2].second, 3u);
  EXPECT_NE(waits[0].first, waits[1].first) << "a done word per pending call";
  // A stream that has not got to the write: Abort gives up on the call (its done word gets the
  // failure bit, so a stream waiting on it goes on) and it is reported failed, once.
  uint64_t* ready_word = writes[0].first;
  client::StreamHooks stalled = hooks;
  stalled.write = [](uint64_t*, uint64_t) { return absl::OkStatus(); };
  absl::StatusOr<uint64_t> n = (*caller)->Call(p_, &stalled);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ((*caller)->pending(), 1u);
  (*caller)->Abort();
  EXPECT_EQ((*caller)->pending(), 0u);
  EXPECT_EQ(client::LoadSignal(waits.back().first), *n | client::kSignalFailureBit);
  EXPECT_EQ((*caller)->Check().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE((*caller)->Check().ok());
  client::StoreSignal(ready_word, *n);  // the daemon's entry runs once its ready word comes
  for (int i = 0; i < 10000 && client::LoadSignal(waits.back().first) != *n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(client::LoadSignal(waits.back().first), *n);
  // A hook's error is the call's; nothing was submitted.
  client::StreamHooks broken = hooks;
  broken.write = [](uint64_t*, uint64_t) { return absl::InternalError("no stream"); };
  EXPECT_EQ((*caller)->Call(p_, &broken).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ((*caller)->calls(), 4u);
}

TEST_F(SubmissionRingClientTest, OrderedCallerReportsAFailedCallOnce) {
  absl::StatusOr<std::unique_ptr<client::OrderedCaller>> caller =
      client::OrderedCaller::Open(client_.get(), {});
  ASSERT_TRUE(caller.ok()) << caller.status();
  ASSERT_TRUE((*caller)->Call(p_).ok());
  ASSERT_TRUE((*caller)->Wait().ok());
  // Its prepared call released behind its back: the next entry is refused (the failure bit).
  ASSERT_TRUE(client::ReleaseCall(client_.get(), (*caller)->prepared_ids()[0]).ok());
  ASSERT_TRUE((*caller)->Call(p_).ok());
  absl::Status failed = (*caller)->Wait(client::OrderedCaller::kLatest, absl::Seconds(10));
  EXPECT_EQ(failed.code(), absl::StatusCode::kAborted) << failed;
  EXPECT_NE(failed.message().find("call 2 (SparseMlaRequest) failed"), std::string::npos) << failed;
  EXPECT_TRUE((*caller)->Check().ok()) << "reported once";
  EXPECT_EQ((*caller)->prepared(), 0u) << "the failed request's call is made anew";
  Poison();
  ASSERT_TRUE((*caller)->Call(p_).ok());
  ASSERT_TRUE((*caller)->Wait().ok());
  EXPECT_TRUE(Matches());
  EXPECT_EQ((*caller)->prepares(), 2u);
  // A failure nobody waited for is reported by the next Call, which is not made.
  ASSERT_TRUE(client::ReleaseCall(client_.get(), (*caller)->prepared_ids()[0]).ok());
  ASSERT_TRUE((*caller)->Call(p_).ok());
  for (int i = 0; i < 10000 && (*caller)->pending() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ((*caller)->Call(p_).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*caller)->calls(), 4u);
  // A tensor outside every region: PrepareCall refuses it.
  kernels::sparse_mla::Params outside = p_;
  std::vector<uint8_t> heap(SpanBytes(q_));
  outside.q.data = heap.data();
  EXPECT_EQ((*caller)->Call(outside).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*caller)->Close().ok());
}

TEST_F(SubmissionRingClientTest, OrderedCallerEvictsAfterARefusedStreamWrite) {
  // A call whose write hook fails is never submitted and the next call takes its number:
  // evicting its prepared call (max_prepared 1, another request next) must not wait for it.
  client::OrderedCallerOptions o;
  o.max_prepared = 1;
  o.timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<client::OrderedCaller>> caller =
      client::OrderedCaller::Open(client_.get(), o);
  ASSERT_TRUE(caller.ok()) << caller.status();
  ASSERT_TRUE((*caller)->Call(p_).ok());
  ASSERT_TRUE((*caller)->Wait().ok());
  client::StreamHooks refused;
  refused.write = [](uint64_t*, uint64_t) { return absl::UnavailableError("no stream"); };
  refused.wait = [](uint64_t*, uint64_t) { return absl::OkStatus(); };
  EXPECT_EQ((*caller)->Call(p_, &refused).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*caller)->calls(), 1u);
  kernels::sparse_mla::Params other = p_;
  other.sm_scale = p_.sm_scale * 0.5f;  // another request: the first one is evicted
  const absl::Time start = absl::Now();
  absl::StatusOr<uint64_t> n = (*caller)->Call(other);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "the eviction waited for a call never made";
  EXPECT_TRUE((*caller)->Wait().ok());
  EXPECT_EQ((*caller)->prepares(), 2u);
  EXPECT_EQ((*caller)->prepared(), 1u);
}

TEST_F(SubmissionRingClientTest, OrderedCallerOnASessionEndsWithItsLease) {
  absl::StatusOr<std::unique_ptr<client::Session>> session =
      client::Session::Open(client_.get(), {});
  ASSERT_TRUE(session.ok()) << session.status();
  client::OrderedCallerOptions o;
  o.session = session->get();
  absl::StatusOr<std::unique_ptr<client::OrderedCaller>> caller =
      client::OrderedCaller::Open(client_.get(), o);
  ASSERT_TRUE(caller.ok()) << caller.status();
  Poison();
  ASSERT_TRUE((*caller)->Call(p_).ok());
  ASSERT_TRUE((*caller)->Wait(client::OrderedCaller::kLatest, absl::Seconds(10)).ok());
  EXPECT_TRUE(Matches());
  ASSERT_TRUE((*session)->Close().ok());
  // The daemon ends the lease after the status, so calls go on for a while. Once the ring went
  // with the lease a call fails FAILED_PRECONDITION. A call the daemon took just before the
  // lease ended is cancelled instead (ABORTED, reported once: its done word has the failure
  // bit); the caller then drops that prepared call, so the next one prepares anew on the ended
  // lease and PrepareCall refuses it (NOT_FOUND: no open lease).
  absl::Status after = absl::OkStatus();
  bool aborted = false;
  for (int i = 0; i < 5000 && (after.ok() || absl::IsAborted(after)); ++i) {
    aborted = aborted || absl::IsAborted(after);
    absl::StatusOr<uint64_t> n = (*caller)->Call(p_);
    after = n.ok() ? (*caller)->Wait(*n, absl::Seconds(10)) : n.status();
    if (after.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (aborted) {
    EXPECT_TRUE(absl::IsNotFound(after) || absl::IsFailedPrecondition(after)) << after;
  } else {
    EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  }
  EXPECT_TRUE((*caller)->Close().ok());  // the ring and region went with the lease: quietly
}

}  // namespace
}  // namespace attnd::server::testing
