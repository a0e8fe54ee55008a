// The bookkeeping of device-ordered stream-ordered calls without a GPU (docs/SERVICE.md
// "Stream-ordered calls on a CUDA device"): the watchdog's decisions, what a finished call
// answers, the word slots, and the StreamOrderedRunner's device path against a fake backend whose
// "device" (a thread of the test) gates, runs and stores done the way the CUDA graph does: calls
// complete in order, the watchdog cancels then raises the ready word, a later call waiting on the
// same word for a value the raise reached is cancelled too, other words keep their deadlines,
// inline inputs take the device path while host-region tensors (with device-region signal words)
// are refused, and the runner's end cancels what is pending.
#include "server/engine/ordered_device.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/engine/scheduler.h"
#include "server/ops/call_runner.h"
#include "server/ops/stream_ordered.h"
#include "tests/server/fake_device_opener.h"
#include "tests/server/shm_test_util.h"

namespace attnd::server::testing {
namespace {

using engine::DeviceCallState;

TEST(WatchdogDecision, CancelsOnlyUngatedCallsForTheFirstReason) {
  engine::WatchdogInput in;
  in.now = absl::Now();
  in.wait_deadline = in.now + absl::Seconds(1);
  EXPECT_FALSE(engine::WatchdogDecision(in).has_value());
  in.wait_deadline = in.now;
  ASSERT_TRUE(engine::WatchdogDecision(in).has_value());
  EXPECT_EQ(engine::WatchdogDecision(in)->code(), absl::StatusCode::kDeadlineExceeded);
  in.cancelled = true;
  EXPECT_EQ(engine::WatchdogDecision(in)->code(), absl::StatusCode::kCancelled);
  in.drain_expired = true;
  EXPECT_EQ(engine::WatchdogDecision(in)->code(), absl::StatusCode::kUnavailable);
  in.gated = true;  // the gate decided: the op runs or ran
  EXPECT_FALSE(engine::WatchdogDecision(in).has_value());
  in.gated = false;
  in.already_cancelled = true;
  EXPECT_FALSE(engine::WatchdogDecision(in).has_value());
}

TEST(CompletionStatus, FollowsTheStateWord) {
  const std::optional<absl::Status> none;
  const std::optional<absl::Status> timeout = absl::DeadlineExceededError("t");
  EXPECT_TRUE(engine::CompletionStatus(DeviceCallState::kRan, none, absl::OkStatus()).ok());
  // The watchdog fired but the caller's ready won the race: the gate ran the op.
  EXPECT_TRUE(engine::CompletionStatus(DeviceCallState::kRan, timeout, absl::OkStatus()).ok());
  EXPECT_EQ(engine::CompletionStatus(DeviceCallState::kSkipped, timeout, absl::OkStatus()).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(engine::CompletionStatus(DeviceCallState::kSkipped, none, absl::OkStatus()).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(engine::CompletionStatus(DeviceCallState::kFailed, none, absl::UnavailableError("lost"))
                .code(),
            absl::StatusCode::kUnavailable);
}

TEST(SlotTable, HandsOutEachSlotOnce) {
  engine::SlotTable t(3);
  std::vector<size_t> got;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<size_t> s = t.Take();
    ASSERT_TRUE(s.ok());
    got.push_back(*s);
  }
  EXPECT_EQ(t.Take().status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t.in_use(), 3u);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<size_t>{0, 1, 2}));
  t.Give(1);
  ASSERT_TRUE(t.Take().ok());
}

// ---- the runner's device path against a fake device ----

// One enqueued call as the fake device sees it.
struct FakeWork {
  engine::DeviceSignal ready, done;
  std::atomic<bool> cancel{false}, released{false}, gated{false}, finished{false};
  // Cancel came while the ready word was still below the call's value (a real gate could not
  // yet have seen the word reached).
  std::atomic<bool> cancel_before_ready{false};
  std::atomic<int> result{static_cast<int>(DeviceCallState::kPending)};
};

uint64_t LoadWord(void* p) { return __atomic_load_n(static_cast<uint64_t*>(p), __ATOMIC_ACQUIRE); }
void RaiseWord(void* p, uint64_t v) {
  auto* w = static_cast<uint64_t*>(p);
  uint64_t cur = __atomic_load_n(w, __ATOMIC_ACQUIRE);
  while (cur < v &&
         !__atomic_compare_exchange_n(w, &cur, v, false, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
  }
}

class FakeDevice {
 public:
  std::shared_ptr<FakeWork> Add(const engine::DeviceSignal& r, const engine::DeviceSignal& d) {
    auto w = std::make_shared<FakeWork>();
    w->ready = r;
    w->done = d;
    absl::MutexLock lock(&mu_);
    queue_.push_back(w);
    all_.push_back(w);
    return w;
  }
  // What the device stream does: the first unfinished call waits for its ready word; then the
  // gate reads cancel, the op runs or is skipped, done is stored.
  void Step() {
    std::shared_ptr<FakeWork> w;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return;
      w = queue_.front();
    }
    if (w->ready.present && LoadWord(w->ready.device_address) < w->ready.value) return;
    w->gated = true;
    const bool run = !w->cancel.load();
    if (run) ran_.fetch_add(1);
    if (w->done.present) {
      __atomic_store_n(static_cast<uint64_t*>(w->done.device_address),
                       run ? w->done.value : (w->done.value | ops::kSignalFailureBit),
                       __ATOMIC_RELEASE);
    }
    w->result = static_cast<int>(run ? DeviceCallState::kRan : DeviceCallState::kSkipped);
    w->finished = true;
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
  }
  std::vector<std::shared_ptr<FakeWork>> all() {
    absl::MutexLock lock(&mu_);
    return all_;
  }
  int ran() const { return ran_.load(); }

 private:
  absl::Mutex mu_;
  std::deque<std::shared_ptr<FakeWork>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<FakeWork>> all_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> ran_{0};
};

class FakeCall : public engine::DeviceOrderedCall {
 public:
  explicit FakeCall(std::shared_ptr<FakeWork> w) : w_(std::move(w)) {}
  DeviceCallState Poll() override {
    return w_->finished ? static_cast<DeviceCallState>(w_->result.load())
                        : DeviceCallState::kPending;
  }
  bool Gated() const override { return w_->gated; }
  void SetCancel() override {
    if (w_->ready.present && LoadWord(w_->ready.device_address) < w_->ready.value) {
      w_->cancel_before_ready = true;
    }
    w_->cancel = true;
  }
  absl::Status Release() override {
    w_->released = true;
    if (w_->ready.present) RaiseWord(w_->ready.device_address, w_->ready.value);
    return absl::OkStatus();
  }
  absl::Status error() const override { return absl::OkStatus(); }
  void Result(engine::StepResult* r) const override { r->impl = "fake"; }

 private:
  std::shared_ptr<FakeWork> w_;
};

class FakeQueue : public engine::DeviceOrderedQueue {
 public:
  explicit FakeQueue(FakeDevice* d) : d_(d) {}
  absl::StatusOr<std::unique_ptr<engine::DeviceOrderedCall>> Enqueue(
      engine::OpCall& call, const engine::DeviceSignal& ready,
      const engine::DeviceSignal& done) override {
    EXPECT_TRUE(engine::DevicePathEligible(call.tensors()));
    return std::unique_ptr<engine::DeviceOrderedCall>(
        std::make_unique<FakeCall>(d_->Add(ready, done)));
  }

 private:
  FakeDevice* d_;
};

class FakeBackend : public engine::Backend {
 public:
  explicit FakeBackend(FakeDevice* d) : d_(d) {}
  kernels::Backend kind() const override { return kernels::Backend::kCuda; }
  absl::Status Run(absl::string_view, const engine::StepFn&, engine::StepResult*,
                   const engine::StopToken*) override {
    return absl::UnimplementedError("fake backend: the host path does not run here");
  }
  std::vector<engine::DeviceDescription> Devices() const override { return {}; }
  std::unique_ptr<engine::DeviceOrderedQueue> NewOrderedQueue() const override {
    queues_.fetch_add(1);
    return std::make_unique<FakeQueue>(d_);
  }
  mutable std::atomic<int> queues_{0};

 private:
  FakeDevice* d_;
};

constexpr int64_t kT = 2, kH = 16, kK = 8, kS = 64;
constexpr uint64_t kQ = 0, kKv = 64 << 10, kIdx = 192 << 10, kOut = 200 << 10, kLse = 264 << 10;
constexpr uint64_t kWords = 300 << 10;  // signal words from here, 8 bytes apart

class OrderedRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    regions::RegionRegistry::Options ro;
    ro.allow_client_shm = true;
    ro.device_opener = opener_;
    registry_ = std::make_unique<regions::RegionRegistry>(ro);
    regions::DeviceRegionSpec spec;
    spec.name = "d";
    spec.raw_handle = std::string(regions::kDeviceHandleBytes, 'h');
    spec.device_uuid = FakeDeviceOpener::kUuid;
    spec.byte_size = 512 << 10;
    spec.owner = "o";
    const absl::Status reg = registry_->RegisterDevice(spec);
    ASSERT_TRUE(reg.ok()) << reg;
    scheduler_ = std::make_unique<engine::Scheduler>(engine::Scheduler::Options{}, &backend_);
    runner_ = std::make_unique<ops::CallRunner>(&ops_, scheduler_.get(), registry_.get(), nullptr,
                                                ops::CallRunner::Options{});
    ops::StreamOrderedRunner::Options so;
    // Large: it caps every call's wait deadline, and the tests set the short ones they need.
    so.signal_timeout = absl::Seconds(60);
    so.backend = &backend_;
    stream_ = std::make_unique<ops::StreamOrderedRunner>(runner_.get(), &ops_, registry_.get(),
                                                         nullptr, so);
    device_thread_ = std::thread([this] {
      while (!stop_device_) {
        device_.Step();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  void TearDown() override {
    stream_.reset();  // cancels what is pending; the device thread still steps
    stop_device_ = true;
    if (device_thread_.joinable()) device_thread_.join();
    runner_.reset();
    scheduler_.reset();
  }

  char* Base() {
    absl::StatusOr<regions::RegionPin> pin = registry_->Acquire("o", "d");
    EXPECT_TRUE(pin.ok());
    return (*pin)->device_data();
  }
  uint64_t* Word(int i) { return reinterpret_cast<uint64_t*>(Base() + kWords + 8 * i); }

  static v1::Tensor T(v1::DType dtype, std::vector<int64_t> shape, uint64_t offset) {
    v1::Tensor t;
    t.set_dtype(dtype);
    for (int64_t d : shape) t.add_shape(d);
    t.mutable_region()->set_region("d");
    t.mutable_region()->set_offset(offset);
    return t;
  }
  static void Sig(v1::Signal* s, int word, uint64_t value) {
    s->mutable_slice()->set_region("d");
    s->mutable_slice()->set_offset(kWords + 8 * word);
    s->set_value(value);
  }
  std::shared_ptr<v1::SparseMlaRequest> Request(int ready_word, uint64_t ready, int done_word,
                                                uint64_t done) {
    auto req = std::make_shared<v1::SparseMlaRequest>();
    *req->mutable_q() = T(v1::DTYPE_BF16, {kT, kH, 576}, kQ);
    *req->mutable_kv() = T(v1::DTYPE_BF16, {kS, 576}, kKv);
    *req->mutable_indices() = T(v1::DTYPE_I32, {kT, kK}, kIdx);
    *req->mutable_out() = T(v1::DTYPE_BF16, {kT, kH, 512}, kOut);
    *req->mutable_lse() = T(v1::DTYPE_F32, {kT, kH}, kLse);
    req->set_sm_scale(0.04f);
    if (ready_word >= 0) Sig(req->mutable_ready(), ready_word, ready);
    if (done_word >= 0) Sig(req->mutable_done(), done_word, done);
    return req;
  }

  // Enqueues `req`; its outcome lands in statuses_[index] when it is over.
  absl::Status Enqueue(const std::shared_ptr<ops::StreamOrderedRunner::Queue>& q,
                       std::shared_ptr<v1::SparseMlaRequest> req, int index,
                       absl::Duration deadline = absl::Seconds(20),
                       std::optional<bool> names_host_region = std::nullopt) {
    ops::StreamOrderedRunner::Submission s;
    s.id = ops::OpId::kSparseMla;
    s.request = req;
    s.names_host_region = names_host_region;
    s.ready = ops::FindSignal(*req, "ready");
    s.done = ops::FindSignal(*req, "done");
    s.ctx.request_id = runner_->NewRequestId();
    s.ctx.owner = "o";
    s.ctx.deadline = absl::Now() + deadline;
    s.finished = [this, index](absl::Status st) {
      absl::MutexLock lock(&mu_);
      statuses_[index] = st;
      order_.push_back(index);
    };
    return stream_->Enqueue(q, std::move(s));
  }
  bool AwaitDone(int n, absl::Duration timeout = absl::Seconds(5)) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(order_.size()) >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

  std::shared_ptr<FakeDeviceOpener> opener_ = std::make_shared<FakeDeviceOpener>(1 << 20);
  FakeDevice device_;
  FakeBackend backend_{&device_};
  ops::OpTable ops_;
  std::unique_ptr<regions::RegionRegistry> registry_;
  std::unique_ptr<engine::Scheduler> scheduler_;
  std::unique_ptr<ops::CallRunner> runner_;
  std::unique_ptr<ops::StreamOrderedRunner> stream_;
  std::atomic<bool> stop_device_{false};
  std::thread device_thread_;
  absl::Mutex mu_;
  std::map<int, absl::Status> statuses_ ABSL_GUARDED_BY(mu_);
  std::vector<int> order_ ABSL_GUARDED_BY(mu_);
};

TEST_F(OrderedRunnerTest, DeviceCallsRunAfterReadyAndCompleteInOrder) {
  auto q = stream_->NewQueue("session test");
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Enqueue(q, Request(i, 1, 10 + i, 5), i).ok());
  }
  EXPECT_EQ(backend_.queues_.load(), 1);  // one device queue per ordered queue
  ASSERT_EQ(device_.all().size(), 3u);    // all enqueued on the device at accept
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(device_.ran(), 0);
  EXPECT_EQ(*Word(10), 0u);
  // Ready words in reverse: the stream still runs them in order.
  __atomic_store_n(Word(2), 1, __ATOMIC_RELEASE);
  __atomic_store_n(Word(1), 1, __ATOMIC_RELEASE);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(device_.ran(), 0);
  __atomic_store_n(Word(0), 1, __ATOMIC_RELEASE);
  ASSERT_TRUE(AwaitDone(3));
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(order_, (std::vector<int>{0, 1, 2}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(statuses_[i].ok()) << statuses_[i];
    EXPECT_EQ(*Word(10 + i), 5u);
  }
  EXPECT_EQ(stream_->pending(), 0);
}

TEST_F(OrderedRunnerTest, WatchdogCancelsThenRaisesReadyAndLaterCallsKeepTheirDeadlines) {
  auto q = stream_->NewQueue("session test");
  // 0: never ready (deadline 100 ms). 1: same word, value below the raise: released by it, so
  // cancelled too. 2: its own word, set later: runs.
  ASSERT_TRUE(Enqueue(q, Request(0, 4, 10, 1), 0, absl::Milliseconds(100)).ok());
  ASSERT_TRUE(Enqueue(q, Request(0, 3, 11, 2), 1).ok());
  ASSERT_TRUE(Enqueue(q, Request(2, 1, 12, 3), 2).ok());
  ASSERT_TRUE(AwaitDone(2));
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(statuses_[0].code(), absl::StatusCode::kDeadlineExceeded) << statuses_[0];
    EXPECT_EQ(statuses_[1].code(), absl::StatusCode::kDeadlineExceeded) << statuses_[1];
    EXPECT_EQ(statuses_.count(2), 0u);  // waits for its own ready
  }
  const auto all = device_.all();
  EXPECT_TRUE(all[0]->cancel && all[0]->released);
  EXPECT_TRUE(all[1]->cancel_before_ready) << "call 1 was cancelled only after the raise";
  EXPECT_EQ(*Word(0), 4u);  // the watchdog raised the caller's ready word to the value
  EXPECT_EQ(*Word(10), 1u | ops::kSignalFailureBit);
  EXPECT_EQ(*Word(11), 2u | ops::kSignalFailureBit);
  EXPECT_FALSE(all[2]->cancel.load());
  EXPECT_EQ(device_.ran(), 0);  // skipped calls never ran
  __atomic_store_n(Word(2), 1, __ATOMIC_RELEASE);
  ASSERT_TRUE(AwaitDone(3));
  absl::MutexLock lock(&mu_);
  EXPECT_TRUE(statuses_[2].ok()) << statuses_[2];
  EXPECT_EQ(*Word(12), 3u);
  EXPECT_EQ(device_.ran(), 1);
}

TEST_F(OrderedRunnerTest, ALaterCallsDeadlineCancelsItWithoutReleasingTheEarlierWait) {
  auto q = stream_->NewQueue("session test");
  ASSERT_TRUE(Enqueue(q, Request(0, 1, 10, 1), 0).ok());
  ASSERT_TRUE(Enqueue(q, Request(1, 1, 11, 2), 1, absl::Milliseconds(50)).ok());
  const auto all = device_.all();
  // The watchdog cancels call 1 at its deadline (it may look late on a loaded machine).
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!all[1]->cancel.load() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(2));
  EXPECT_TRUE(all[1]->cancel.load());
  // Not released: call 0 still waits on its own word, and raising call 1's word now would not
  // free the stream anyway.
  EXPECT_FALSE(all[1]->released.load());
  EXPECT_EQ(*Word(1), 0u);
  EXPECT_FALSE(all[0]->cancel.load());
  __atomic_store_n(Word(0), 1, __ATOMIC_RELEASE);
  ASSERT_TRUE(AwaitDone(2));
  absl::MutexLock lock(&mu_);
  EXPECT_TRUE(statuses_[0].ok());
  EXPECT_EQ(statuses_[1].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*Word(11), 2u | ops::kSignalFailureBit);
}

TEST_F(OrderedRunnerTest, QueuesAreIndependent) {
  auto a = stream_->NewQueue("session a");
  auto b = stream_->NewQueue("session b");
  ASSERT_TRUE(Enqueue(a, Request(0, 1, 10, 1), 0).ok());
  ASSERT_TRUE(Enqueue(b, Request(1, 1, 11, 1), 1).ok());
  EXPECT_EQ(backend_.queues_.load(), 2);
  // The fake device is one stream, so b's call waits behind a's there; the point here is the
  // runner's bookkeeping: each queue's calls complete on their own.
  __atomic_store_n(Word(0), 1, __ATOMIC_RELEASE);
  __atomic_store_n(Word(1), 1, __ATOMIC_RELEASE);
  ASSERT_TRUE(AwaitDone(2));
  absl::MutexLock lock(&mu_);
  EXPECT_TRUE(statuses_[0].ok());
  EXPECT_TRUE(statuses_[1].ok());
}

TEST_F(OrderedRunnerTest, InlineInputsTakeTheDevicePathHostRegionsDoNot) {
  auto q = stream_->NewQueue("session test");
  auto req = Request(0, 1, 10, 1);
  req->mutable_q()->clear_region();  // inline q: staged at accept, still the device path
  req->mutable_q()->set_inline_data(std::string(kT * kH * 576 * 2, '\0'));
  ASSERT_TRUE(Enqueue(q, req, 0).ok());
  EXPECT_EQ(device_.all().size(), 1u);
  __atomic_store_n(Word(0), 1, __ATOMIC_RELEASE);
  ASSERT_TRUE(AwaitDone(1));

  // A host-region tensor: the host-polled path, where a device-region signal word cannot go.
  attnd::testing::ScopedShm shm(1 << 20);
  ASSERT_TRUE(shm.ok());
  regions::HostRegionSpec h;
  h.name = "h";
  h.key = shm.key();
  h.byte_size = shm.size();
  h.owner = "o";
  ASSERT_TRUE(registry_->RegisterHost(h).ok());
  auto host = Request(1, 1, 11, 1);
  host->mutable_q()->mutable_region()->set_region("h");
  host->mutable_q()->mutable_region()->set_offset(0);
  const absl::Status s = Enqueue(q, host, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("device region"), std::string::npos) << s;
  EXPECT_EQ(device_.all().size(), 1u);
}

TEST_F(OrderedRunnerTest, AKnownHostRegionFlagIsTakenAsGiven) {
  // A prepared call says whether it names a host region (known since PrepareCall): Enqueue
  // takes that instead of looking at the request's regions.
  auto q = stream_->NewQueue("session test");
  const absl::Status s = Enqueue(q, Request(0, 1, 10, 1), 0, absl::Seconds(20), true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;  // device words, host path
  EXPECT_EQ(device_.all().size(), 0u);
  ASSERT_TRUE(Enqueue(q, Request(1, 1, 11, 1), 1, absl::Seconds(20), false).ok());
  EXPECT_EQ(device_.all().size(), 1u);
  __atomic_store_n(Word(1), 1, __ATOMIC_RELEASE);
  EXPECT_TRUE(AwaitDone(1));
}

TEST_F(OrderedRunnerTest, EndingTheRunnerCancelsPendingDeviceCalls) {
  auto q = stream_->NewQueue("session test");
  ASSERT_TRUE(Enqueue(q, Request(0, 9, 10, 1), 0).ok());
  stream_.reset();  // the device thread is still stepping
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(order_.size(), 1u);
  EXPECT_EQ(statuses_[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(*Word(0), 9u);
  EXPECT_EQ(*Word(10), 1u | ops::kSignalFailureBit);
}

}  // namespace
}  // namespace attnd::server::testing
