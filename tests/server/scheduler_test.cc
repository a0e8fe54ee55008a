// The scheduler: runs steps on the backend, bounded queue, deadlines and cancellation of queued
// jobs (failed at once) and of running ones (their stop token reaches the step), drain with a hard
// deadline, admissions.
#include "server/engine/scheduler.h"

#include <atomic>
#include <future>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/common/thread_pool.h"
#include "kernels/topk/topk.h"
#include "server/engine/cpu_backend.h"

namespace attnd::server::engine {
namespace {

class FakeBackend : public Backend {
 public:
  kernels::Backend kind() const override { return kernels::Backend::kCpu; }
  absl::Status Run(absl::string_view, const StepFn& step, StepResult* result,
                   const StopToken* stop) override {
    kernels::ExecContext ctx;
    if (stop != nullptr) ctx.stop = stop->flag();
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

// A step that works until its call is asked to stop, like a CPU kernel polling between tiles
// (answering kernels::StoppedStatus()), or OK after `limit` (the stop never came). `started`
// (optional) opens when it begins.
StepFn PollingStep(Gate* started = nullptr, absl::Duration limit = absl::Seconds(60)) {
  return [started, limit](const kernels::ExecContext& ctx, std::string* name) {
    *name = "polling";
    if (started != nullptr) started->Open();
    const absl::Time end = absl::Now() + limit;
    while (absl::Now() < end) {
      if (kernels::StopRequested(ctx)) return kernels::StoppedStatus();
      absl::SleepFor(absl::Milliseconds(1));  // one "tile"
    }
    return absl::OkStatus();
  };
}

// Whether `r` has its outcome within `timeout`.
bool Within(Result& r, absl::Duration timeout) {
  return r.future.wait_for(absl::ToChronoSeconds(timeout)) == std::future_status::ready;
}

// WaitStep that opens `started` first.
StepFn GatedStep(Gate* started, Gate* gate) {
  return [started, gate](const kernels::ExecContext&, std::string* name) {
    started->Open();
    gate->Wait();
    *name = "gated";
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

TEST(SchedulerTest, RunTimeCoversTheSteps) {
  FakeBackend backend;
  Scheduler sched(Opts(4, 1), &backend);
  Result r;
  StepFn sleepy = [](const kernels::ExecContext&, std::string* name) {
    absl::SleepFor(absl::Milliseconds(5));
    *name = "sleepy";
    return absl::OkStatus();
  };
  ASSERT_TRUE(sched.Submit(MakeJob({sleepy, sleepy}, &r)).ok());
  JobOutcome o = r.future.get();
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_GE(o.compute, absl::Milliseconds(10));
  EXPECT_GE(o.run, o.compute);
}

// --worker-spin: with one worker (the spinner) or several, jobs submitted while a worker spins,
// runs or has just taken one all run at once: none waits for a spin (60 s here, so a job that
// did would miss its 10 s bound whatever the machine's load) to time out, and shutdown ends a
// spin. A worker that stopped spinning sleeps and is woken as without spin.
TEST(SchedulerTest, SpinningWorkersTakeEveryJob) {
  for (int workers : {1, 3}) {
    FakeBackend backend;
    Scheduler::Options o = Opts(256, workers);
    o.spin = absl::Seconds(60);
    auto sched = std::make_unique<Scheduler>(o, &backend);
    std::atomic<int> n{0};
    const absl::Time start = absl::Now();
    // One at a time, each submitted as soon as the previous one finished (the spinner's case).
    for (int i = 0; i < 200; ++i) {
      Result r;
      ASSERT_TRUE(sched->Submit(MakeJob({Step(&n)}, &r)).ok());
      ASSERT_TRUE(Within(r, absl::Seconds(10))) << "workers " << workers << " job " << i;
    }
    // Bursts: several queued at once while the spinner is busy or has just taken one.
    for (int burst = 0; burst < 50; ++burst) {
      std::vector<Result> rs(4);
      for (Result& r : rs) ASSERT_TRUE(sched->Submit(MakeJob({Step(&n)}, &r)).ok());
      for (Result& r : rs) ASSERT_TRUE(Within(r, absl::Seconds(10))) << "burst " << burst;
    }
    EXPECT_EQ(n.load(), 200 + 50 * 4);
    EXPECT_LT(absl::Now() - start, absl::Seconds(50)) << "a job waited for a spin to end";
    const absl::Time stop = absl::Now();
    sched.reset();
    EXPECT_LT(absl::Now() - stop, absl::Seconds(10)) << "shutdown waited for the spin";
  }
  FakeBackend backend;
  Scheduler::Options o = Opts(4, 1);
  o.spin = absl::Milliseconds(2);
  Scheduler sched(o, &backend);
  std::atomic<int> n{0};
  for (int i = 0; i < 3; ++i) {
    absl::SleepFor(absl::Milliseconds(20));  // past the spin: the worker sleeps
    Result r;
    ASSERT_TRUE(sched.Submit(MakeJob({Step(&n)}, &r)).ok());
    ASSERT_TRUE(Within(r, absl::Seconds(10))) << i;
  }
  EXPECT_EQ(n.load(), 3);
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
  // The deadline leaves the worker time to start the job; the first step then runs past it, so it
  // passes between the two steps. On a loaded machine the deadline may pass before the worker
  // takes the job (it then fails queued, without running): try again with a longer one.
  for (absl::Duration timeout = absl::Milliseconds(500);; timeout *= 4) {
    ASSERT_LT(timeout, absl::Seconds(30)) << "the worker never took the job in time";
    std::atomic<int> n{0};
    Result r;
    const absl::Time deadline = absl::Now() + timeout;
    StepFn slow = [deadline](const kernels::ExecContext&, std::string*) {
      absl::SleepFor(deadline - absl::Now() + absl::Milliseconds(20));
      return absl::OkStatus();
    };
    auto job = MakeJob({slow, Step(&n)}, &r);
    job->deadline = deadline;
    ASSERT_TRUE(sched.Submit(std::move(job)).ok());
    JobOutcome o = r.future.get();
    EXPECT_EQ(o.status.code(), absl::StatusCode::kDeadlineExceeded) << o.status;
    EXPECT_EQ(n.load(), 0);
    if (o.ran) break;
  }
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
    // Only once the drain's deadline has passed (a fixed delay could beat it on a loaded
    // machine and let the queued job run).
    while (!sched.drain_expired()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
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

// A running job whose deadline passes is stopped through its token (the step polls it) and
// answers DEADLINE_EXCEEDED long before the step's own end.
TEST(SchedulerTest, RunningJobStopsAtItsDeadline) {
  FakeBackend backend;
  Scheduler sched(Opts(4, 1), &backend);
  // On a loaded machine the deadline may pass before the worker takes the job (it then fails
  // queued, without running): try again with a longer one.
  for (absl::Duration timeout = absl::Milliseconds(100);; timeout *= 4) {
    ASSERT_LT(timeout, absl::Seconds(30)) << "the worker never took the job in time";
    Result r;
    auto job = MakeJob({PollingStep()}, &r);
    job->deadline = absl::Now() + timeout;
    ASSERT_TRUE(sched.Submit(std::move(job)).ok());
    ASSERT_TRUE(Within(r, absl::Seconds(30))) << "the deadline did not reach the running step";
    JobOutcome o = r.future.get();
    EXPECT_EQ(o.status.code(), absl::StatusCode::kDeadlineExceeded) << o.status;
    if (o.ran) break;
  }
}

// A running job whose client cancels (the `cancelled` poll) stops and answers CANCELLED.
TEST(SchedulerTest, RunningJobStopsWhenCancelled) {
  FakeBackend backend;
  Scheduler sched(Opts(4, 1), &backend);
  Gate started;
  std::atomic<bool> cancel{false};
  Result r;
  auto job = MakeJob({PollingStep(&started)}, &r);
  job->cancelled = [&cancel] { return cancel.load(); };
  ASSERT_TRUE(sched.Submit(std::move(job)).ok());
  started.Wait();
  cancel = true;
  ASSERT_TRUE(Within(r, absl::Seconds(30))) << "the cancellation did not reach the running step";
  JobOutcome o = r.future.get();
  EXPECT_EQ(o.status.code(), absl::StatusCode::kCancelled) << o.status;
  EXPECT_TRUE(o.ran);
}

// A cancellation seen within a second of the deadline is the client's deadline passing on its own
// clock: counted DEADLINE_EXCEEDED, not CANCELLED.
TEST(SchedulerTest, CancellationAtTheDeadlineCountsAsTheDeadline) {
  FakeBackend backend;
  Scheduler sched(Opts(4, 1), &backend);
  std::atomic<bool> cancel{false};
  Result r;
  auto job = MakeJob({PollingStep()}, &r);
  job->deadline = absl::Now() + absl::Milliseconds(900);
  job->cancelled = [&cancel] { return cancel.load(); };
  ASSERT_TRUE(sched.Submit(std::move(job)).ok());
  cancel = true;  // queued or running by now: the same answer
  EXPECT_EQ(r.future.get().status.code(), absl::StatusCode::kDeadlineExceeded);
}

// A step that finishes while its stop comes is not trusted: the stop's status wins.
TEST(SchedulerTest, StopDuringAStepWinsOverItsStatus) {
  FakeBackend backend;
  Scheduler sched(Opts(4, 1), &backend);
  std::atomic<bool> cancel{false};
  std::atomic<int> n{0};
  Result r;
  StepFn first = [&cancel](const kernels::ExecContext& ctx, std::string*) {
    cancel = true;
    while (!kernels::StopRequested(ctx)) absl::SleepFor(absl::Milliseconds(1));
    return absl::OkStatus();  // "finished" anyway
  };
  auto job = MakeJob({first, Step(&n)}, &r);
  job->cancelled = [&cancel] { return cancel.load(); };
  ASSERT_TRUE(sched.Submit(std::move(job)).ok());
  EXPECT_EQ(r.future.get().status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(n.load(), 0);
}

// A queued job fails at its deadline while the only worker is still busy (it does not wait for a
// worker to find out).
TEST(SchedulerTest, QueuedJobFailsAtItsDeadlineWhileWorkersAreBusy) {
  FakeBackend backend;
  Scheduler sched(Opts(4, 1), &backend);
  Gate gate, started;
  std::atomic<int> n{0};
  Result running, queued;
  ASSERT_TRUE(sched.Submit(MakeJob({GatedStep(&started, &gate)}, &running)).ok());
  started.Wait();
  auto job = MakeJob({Step(&n)}, &queued);
  job->deadline = absl::Now() + absl::Milliseconds(100);
  ASSERT_TRUE(sched.Submit(std::move(job)).ok());
  const bool failed_while_busy = Within(queued, absl::Seconds(30));
  gate.Open();
  ASSERT_TRUE(failed_while_busy) << "the queued job waited for the worker";
  JobOutcome o = queued.future.get();
  EXPECT_EQ(o.status.code(), absl::StatusCode::kDeadlineExceeded) << o.status;
  EXPECT_FALSE(o.ran);
  EXPECT_EQ(n.load(), 0);
  EXPECT_TRUE(running.future.get().status.ok());
  EXPECT_EQ(sched.queued(), 0);
}

// Likewise a queued job whose client cancels.
TEST(SchedulerTest, QueuedJobCancelledWhileWorkersAreBusy) {
  FakeBackend backend;
  Scheduler sched(Opts(4, 1), &backend);
  Gate gate, started;
  std::atomic<int> n{0};
  std::atomic<bool> cancel{false};
  Result running, queued;
  ASSERT_TRUE(sched.Submit(MakeJob({GatedStep(&started, &gate)}, &running)).ok());
  started.Wait();
  auto job = MakeJob({Step(&n)}, &queued);
  job->cancelled = [&cancel] { return cancel.load(); };
  ASSERT_TRUE(sched.Submit(std::move(job)).ok());
  cancel = true;
  const bool failed_while_busy = Within(queued, absl::Seconds(30));
  gate.Open();
  ASSERT_TRUE(failed_while_busy) << "the queued job waited for the worker";
  EXPECT_EQ(queued.future.get().status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(n.load(), 0);
  EXPECT_TRUE(running.future.get().status.ok());
}

// The drain's deadline is a hard limit: running jobs are stopped through their token and answer
// UNAVAILABLE, queued ones fail, and Drain returns long before the running step's own end.
TEST(SchedulerTest, DrainDeadlineStopsRunningJobs) {
  FakeBackend backend;
  Scheduler sched(Opts(8, 1), &backend);
  Gate started;
  std::atomic<int> n{0};
  Result running, queued;
  ASSERT_TRUE(sched.Submit(MakeJob({PollingStep(&started), Step(&n)}, &running)).ok());
  started.Wait();
  ASSERT_TRUE(sched.Submit(MakeJob({Step(&n)}, &queued)).ok());
  const absl::Time start = absl::Now();
  EXPECT_FALSE(sched.Drain(absl::Now() + absl::Milliseconds(50), absl::Seconds(30)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "Drain waited for the running step";
  EXPECT_EQ(sched.running(), 0);
  ASSERT_TRUE(Within(running, absl::Seconds(0)));
  JobOutcome o = running.future.get();
  EXPECT_EQ(o.status.code(), absl::StatusCode::kUnavailable) << o.status;
  EXPECT_TRUE(o.ran);
  EXPECT_EQ(queued.future.get().status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(n.load(), 0);
}

// A job that ignores its stop holds Drain no longer than the grace; running() then says so.
TEST(SchedulerTest, DrainGraceBoundsAJobThatDoesNotStop) {
  FakeBackend backend;
  Scheduler sched(Opts(8, 1), &backend);
  Gate gate, started;
  Result stuck;
  ASSERT_TRUE(sched.Submit(MakeJob({GatedStep(&started, &gate)}, &stuck)).ok());
  started.Wait();
  EXPECT_FALSE(sched.Drain(absl::Now() + absl::Milliseconds(20), absl::Milliseconds(100)));
  EXPECT_EQ(sched.running(), 1);
  gate.Open();
  EXPECT_EQ(stuck.future.get().status.code(), absl::StatusCode::kUnavailable);
}

// An admission taken before the drain (a call resolving its regions) holds the drain, and its
// Submit is accepted although the scheduler no longer accepts new calls.
TEST(SchedulerTest, AdmittedCallIsWaitedForByTheDrain) {
  FakeBackend backend;
  Scheduler sched(Opts(8, 1), &backend);
  Scheduler::Admission admission = sched.Admit();
  ASSERT_TRUE(admission);
  std::atomic<bool> drained{false};
  std::thread drain([&] {
    EXPECT_TRUE(sched.Drain(absl::Now() + absl::Seconds(60)));
    drained = true;
  });
  while (sched.Admit()) absl::SleepFor(absl::Milliseconds(1));  // the drain has begun
  EXPECT_FALSE(drained.load()) << "the drain did not wait for the admitted call";
  std::atomic<int> n{0};
  Result r;
  ASSERT_TRUE(sched.Submit(MakeJob({Step(&n)}, &r), &admission).ok());
  EXPECT_FALSE(admission);
  EXPECT_TRUE(r.future.get().status.ok());
  drain.join();
  EXPECT_TRUE(drained.load());
  EXPECT_EQ(n.load(), 1);
  Result late;
  EXPECT_EQ(sched.Submit(MakeJob({Step(&n)}, &late)).code(), absl::StatusCode::kUnavailable);
}

// The CPU backend passes the stop request to the kernels, and a stopped call answers the stop's
// reason; a real CPU kernel asked to stop returns at once.
TEST(SchedulerTest, CpuBackendPassesTheStopToTheKernels) {
  kernels::ThreadPool pool(2);
  CpuBackend cpu(&pool);
  StopToken stop;
  StepResult r;
  bool saw_flag = false;
  StepFn step = [&](const kernels::ExecContext& ctx, std::string*) {
    saw_flag = ctx.stop == stop.flag();
    stop.Stop(StopToken::Reason::kShutdown);
    stop.Stop(StopToken::Reason::kDeadline);  // the first reason stays
    return absl::OkStatus();
  };
  EXPECT_EQ(cpu.Run("test", step, &r, &stop).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(saw_flag);

  // topk over 4 rows with the stop already set: the CPU implementation answers StoppedStatus().
  std::vector<float> logits(4 * 64, 1.0f);
  std::vector<int32_t> indices(4 * 8, 7);
  std::vector<int32_t> lengths(4, 64);
  kernels::topk::Params p;
  p.logits = kernels::MakeTensor(logits.data(), kernels::DType::kF32, {4, 64});
  p.lengths = kernels::MakeTensor(lengths.data(), kernels::DType::kI32, {4});
  p.indices = kernels::MakeTensor(indices.data(), kernels::DType::kI32, {4, 8});
  p.k = 8;
  kernels::ExecContext ctx;
  ctx.pool = &pool;
  ctx.stop = stop.flag();
  std::string impl;
  const absl::Status s = kernels::topk::Run(p, ctx, &impl);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_EQ(indices[0], 7) << "the stopped kernel ran";
  ctx.stop = nullptr;
  EXPECT_TRUE(kernels::topk::Run(p, ctx, &impl).ok());
}

}  // namespace
}  // namespace attnd::server::engine
