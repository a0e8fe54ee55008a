// The scheduler: runs steps on the backend, bounded queue, deadlines and cancellation before and
// between steps, drain.
#include "server/engine/scheduler.h"

#include <atomic>
#include <future>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace attnd::server::engine {
namespace {

class FakeBackend : public Backend {
 public:
  kernels::Backend kind() const override { return kernels::Backend::kCpu; }
  absl::Status Run(absl::string_view, const StepFn& step, StepResult* result) override {
    kernels::ExecContext ctx;
    const absl::Time start = absl::Now();
    absl::Status s = step(ctx, &result->impl);
    result->compute += absl::Now() - start;
    return s;
  }
  std::vector<DeviceDescription> Devices() const override { return {}; }
};

// A gate steps can wait on.
class Gate {
 public:
  void Open() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void Wait() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&open_));
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

struct Result {
  std::promise<JobOutcome> promise;
  std::future<JobOutcome> future = promise.get_future();
};

Scheduler::Options Opts(int queue_capacity, int workers) {
  Scheduler::Options o;
  o.queue_capacity = queue_capacity;
  o.workers = workers;
  return o;
}

std::unique_ptr<Job> MakeJob(std::vector<StepFn> steps, Result* result) {
  auto job = std::make_unique<Job>();
  job->op = "test";
  job->steps.assign(steps.begin(), steps.end());
  job->done = [result](JobOutcome o) { result->promise.set_value(std::move(o)); };
  return job;
}

StepFn Step(std::atomic<int>* counter, const char* impl = "fake") {
  return [counter, impl](const kernels::ExecContext&, std::string* name) {
    counter->fetch_add(1);
    *name = impl;
    return absl::OkStatus();
  };
}

StepFn WaitStep(Gate* gate) {
  return [gate](const kernels::ExecContext&, std::string* name) {
    gate->Wait();
    *name = "gated";
    return absl::OkStatus();
  };
}

TEST(SchedulerTest, RunsStepsInOrder) {
  FakeBackend backend;
  Scheduler sched(Opts(4, 2), &backend);
  std::atomic<int> n{0};
  Result r;
  ASSERT_TRUE(sched.Submit(MakeJob({Step(&n, "a"), Step(&n, "b")}, &r)).ok());
  JobOutcome o = r.future.get();
  EXPECT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(n.load(), 2);
  EXPECT_EQ(o.impl, "a+b");
  EXPECT_TRUE(o.ran);
}

TEST(SchedulerTest, StepErrorsStopTheJob) {
  FakeBackend backend;
  Scheduler sched(Opts(4, 1), &backend);
  std::atomic<int> n{0};
  Result r;
  StepFn fail = [](const kernels::ExecContext&, std::string*) {
    return absl::InvalidArgumentError("q: bad");
  };
  ASSERT_TRUE(sched.Submit(MakeJob({fail, Step(&n)}, &r)).ok());
  EXPECT_EQ(r.future.get().status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(n.load(), 0);
}

TEST(SchedulerTest, FullQueueIsResourceExhausted) {
  FakeBackend backend;
  Scheduler sched(Opts(2, 1), &backend);
  Gate gate;
  Result running, q1, q2, q3;
  ASSERT_TRUE(sched.Submit(MakeJob({WaitStep(&gate)}, &running)).ok());
  while (sched.running() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(sched.Submit(MakeJob({WaitStep(&gate)}, &q1)).ok());
  ASSERT_TRUE(sched.Submit(MakeJob({WaitStep(&gate)}, &q2)).ok());
  const absl::Status s = sched.Submit(MakeJob({WaitStep(&gate)}, &q3));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(sched.queued(), 2);
  gate.Open();
  EXPECT_TRUE(running.future.get().status.ok());
  EXPECT_TRUE(q1.future.get().status.ok());
  EXPECT_TRUE(q2.future.get().status.ok());
}

// on_load sees every change of (queued, running), in order, and ends at (0, 0).
TEST(SchedulerTest, ReportsQueueDepthAndRunningJobs) {
  FakeBackend backend;
  absl::Mutex mu;
  std::vector<std::pair<int, int>> loads;  // guarded by mu (a local: not annotatable)
  Scheduler::Options options;
  options.queue_capacity = 4;
  options.workers = 1;
  options.on_load = [&](int queued, int running) {
    absl::MutexLock lock(&mu);
    loads.emplace_back(queued, running);
  };
  Scheduler sched(options, &backend);
  auto last = [&] {
    absl::MutexLock lock(&mu);
    return loads.empty() ? std::make_pair(-1, -1) : loads.back();
  };
  Gate gate;
  Result running, q1, q2;
  ASSERT_TRUE(sched.Submit(MakeJob({WaitStep(&gate)}, &running)).ok());
  while (sched.running() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(last(), std::make_pair(0, 1));
  ASSERT_TRUE(sched.Submit(MakeJob({WaitStep(&gate)}, &q1)).ok());
  EXPECT_EQ(last(), std::make_pair(1, 1));
  ASSERT_TRUE(sched.Submit(MakeJob({WaitStep(&gate)}, &q2)).ok());
  EXPECT_EQ(last(), std::make_pair(2, 1));
  gate.Open();
  EXPECT_TRUE(running.future.get().status.ok());
  EXPECT_TRUE(q1.future.get().status.ok());
  EXPECT_TRUE(q2.future.get().status.ok());
  sched.Drain(absl::InfiniteFuture());
  absl::MutexLock lock(&mu);
  const std::vector<std::pair<int, int>> want = {{1, 0}, {0, 1}, {1, 1}, {2, 1}, {2, 0},
                                                 {1, 1}, {1, 0}, {0, 1}, {0, 0}};
  EXPECT_EQ(loads, want);
}

TEST(SchedulerTest, DeadlinePassedInTheQueue) {
  FakeBackend backend;
  Scheduler sched(Opts(4, 1), &backend);
  std::atomic<int> n{0};
  Result r;
  auto job = MakeJob({Step(&n)}, &r);
  job->deadline = absl::Now() - absl::Milliseconds(1);
  ASSERT_TRUE(sched.Submit(std::move(job)).ok());
  JobOutcome o = r.future.get();
  EXPECT_EQ(o.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(o.ran);
  EXPECT_EQ(n.load(), 0);
}

TEST(SchedulerTest, DeadlineBetweenSteps) {
  FakeBackend backend;
  Scheduler sched(Opts(4, 1), &backend);
  std::atomic<int> n{0};
  Result r;
  // The deadline leaves the worker time to start the job on a loaded machine; the first step then
  // runs past it, so it passes between the two steps.
  const absl::Time deadline = absl::Now() + absl::Milliseconds(500);
  StepFn slow = [deadline](const kernels::ExecContext&, std::string*) {
    absl::SleepFor(deadline - absl::Now() + absl::Milliseconds(20));
    return absl::OkStatus();
  };
  auto job = MakeJob({slow, Step(&n)}, &r);
  job->deadline = deadline;
  ASSERT_TRUE(sched.Submit(std::move(job)).ok());
  JobOutcome o = r.future.get();
  EXPECT_EQ(o.status.code(), absl::StatusCode::kDeadlineExceeded) << o.status;
  EXPECT_TRUE(o.ran);
  EXPECT_EQ(n.load(), 0);
}

TEST(SchedulerTest, CancelledBeforeStartAndBetweenSteps) {
  FakeBackend backend;
  Scheduler sched(Opts(4, 1), &backend);
  std::atomic<int> n{0};
  Result before;
  auto job = MakeJob({Step(&n)}, &before);
  job->cancelled = [] { return true; };
  ASSERT_TRUE(sched.Submit(std::move(job)).ok());
  EXPECT_EQ(before.future.get().status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(n.load(), 0);

  std::atomic<bool> cancel{false};
  Result between;
  StepFn first = [&cancel](const kernels::ExecContext&, std::string*) {
    cancel = true;  // the client cancels while step 1 runs
    return absl::OkStatus();
  };
  job = MakeJob({first, Step(&n)}, &between);
  job->cancelled = [&cancel] { return cancel.load(); };
  ASSERT_TRUE(sched.Submit(std::move(job)).ok());
  EXPECT_EQ(between.future.get().status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(n.load(), 0);
}

TEST(SchedulerTest, DrainFinishesQueuedWork) {
  FakeBackend backend;
  Scheduler sched(Opts(8, 1), &backend);
  std::atomic<int> n{0};
  Result r[4];
  for (Result& x : r) ASSERT_TRUE(sched.Submit(MakeJob({Step(&n)}, &x)).ok());
  EXPECT_TRUE(sched.Drain(absl::Now() + absl::Seconds(10)));
  for (Result& x : r) EXPECT_TRUE(x.future.get().status.ok());
  EXPECT_EQ(n.load(), 4);
  Result late;
  EXPECT_EQ(sched.Submit(MakeJob({Step(&n)}, &late)).code(), absl::StatusCode::kUnavailable);
}

TEST(SchedulerTest, DrainDeadlineFailsQueuedWork) {
  FakeBackend backend;
  Scheduler sched(Opts(8, 1), &backend);
  Gate gate;
  std::atomic<int> n{0};
  Result running, queued;
  ASSERT_TRUE(sched.Submit(MakeJob({WaitStep(&gate), Step(&n)}, &running)).ok());
  while (sched.running() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(sched.Submit(MakeJob({Step(&n)}, &queued)).ok());
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gate.Open();
  });
  EXPECT_FALSE(sched.Drain(absl::Now() + absl::Milliseconds(20)));
  opener.join();
  EXPECT_EQ(queued.future.get().status.code(), absl::StatusCode::kUnavailable);
  // The running job stops at its next step boundary.
  EXPECT_EQ(running.future.get().status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(n.load(), 0);
}

}  // namespace
}  // namespace attnd::server::engine
