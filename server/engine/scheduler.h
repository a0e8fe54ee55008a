// The engine's scheduler (docs/SERVICE.md "Scheduler, deadlines and shutdown"): a bounded queue of
// op calls served by a fixed pool of worker threads that run each call's steps on the backend. A
// watchdog thread enforces deadlines and cancellation on queued jobs (failed at once) and on
// running ones (their StopToken is set; the kernels poll it between tiles and stop early); the
// drain's deadline stops running jobs the same way. No gRPC here: the front submits Jobs and gets
// a JobOutcome back through the job's `done`.
//   Scheduler sched({.queue_capacity = 64, .workers = 2}, &backend);
//   auto job = std::make_unique<Job>(); job->steps = {...}; job->done = [](JobOutcome o) {...};
//   if (absl::Status s = sched.Submit(std::move(job)); !s.ok()) { /* RESOURCE_EXHAUSTED... */ }
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/engine/backend.h"

namespace attnd::server::engine {

struct JobOutcome {
  absl::Status status;
  std::string impl;
  absl::Duration queue = absl::ZeroDuration();    // submitted -> a worker took it
  absl::Duration compute = absl::ZeroDuration();  // sum of the backend's step times
  // Wall time of the steps in the backend (compute plus staging, launches, synchronisation).
  absl::Duration run = absl::ZeroDuration();
  bool ran = false;         // at least one step ran
  uint64_t copied_h2d = 0;  // sums of the steps' StepResult figures
  uint64_t copied_d2h = 0;
  uint64_t count_readback = 0;
  std::string device;  // of the last step that ran
  std::string graph;   // of the last step that ran
};

struct Job {
  uint64_t id = 0;  // request id, for logs
  std::string op;   // op name, for the backend
  // Enforced while queued (the job fails DEADLINE_EXCEEDED at it, without running) and while
  // running (its stop token is set at it).
  absl::Time deadline = absl::InfiniteFuture();
  // Polled while the job is queued or running (by the watchdog, every Options::cancel_poll, and
  // before each step) under the scheduler's lock; may be empty. Must be thread-safe and quick and
  // must not call into the scheduler. Never called once `done` has started.
  std::function<bool()> cancelled;
  std::vector<JobStep> steps;
  // Called exactly once after a successful Submit, on a worker thread (or the thread calling
  // Drain/~Scheduler for jobs failed at shutdown). Must not call back into the scheduler's Drain.
  std::function<void(JobOutcome)> done;
  absl::Time submitted;  // set by Submit
  StopToken stop;        // set by the scheduler; the backend passes it to the kernels
};

class Scheduler {
 public:
  struct Options {
    int queue_capacity = 64;  // jobs waiting (not yet running); full -> RESOURCE_EXHAUSTED
    int workers = 2;
    // Optional: called with the number of queued and of running jobs each time either changes
    // (the attnd_queue_depth / attnd_workers_busy gauges), in order, under the scheduler's lock:
    // it must be quick and must not call back into the scheduler.
    std::function<void(int queued, int running)> on_load;
    // Called after each spin (Options::spin) with the seconds it lasted; may be null.
    std::function<void(double seconds)> on_spin;
    // How often the watchdog polls the `cancelled` of queued and running jobs (deadlines are
    // met to the watchdog's wake-up, not polled).
    absl::Duration cancel_poll = absl::Milliseconds(20);
    // How long a worker that finished a job keeps polling for the next one before it sleeps
    // (docs/FLAGS.md --worker-spin): a call queued meanwhile starts without waking a sleeping
    // thread, at the price of one core busy for up to this long after each job. At most one
    // worker spins at a time. Zero: never.
    absl::Duration spin = absl::ZeroDuration();
  };

  // A call on its way to Submit (resolving its regions, validating): taken first, it makes a drain
  // that starts meanwhile wait for the call and accept its Submit (until the drain's deadline).
  // Movable; released by Submit or when destroyed.
  class Admission {
   public:
    Admission() = default;
    Admission(Admission&& other) noexcept : sched_(other.sched_) { other.sched_ = nullptr; }
    Admission& operator=(Admission&& other) noexcept;
    ~Admission() { Release(); }
    explicit operator bool() const { return sched_ != nullptr; }
    void Release();

   private:
    friend class Scheduler;
    explicit Admission(Scheduler* sched) : sched_(sched) {}
    Scheduler* sched_ = nullptr;
  };
  // `backend` (not owned) must outlive the scheduler. Starts the workers.
  Scheduler(Options options, Backend* backend);
  // Drains with no time limit left: fails queued jobs with UNAVAILABLE, joins the workers.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // An admission for a call about to be prepared and submitted; empty (false) once draining.
  Admission Admit() ABSL_LOCKS_EXCLUDED(mu_);

  // Queues `job`. RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE once draining (unless
  // `admission` was taken before the drain began and its deadline has not passed); `done` is
  // then not called. Releases `admission` (may be null). Thread-safe, never blocks on running
  // work.
  absl::Status Submit(std::unique_ptr<Job> job, Admission* admission = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Stops accepting (Submit -> UNAVAILABLE), then waits until every admitted, queued and running
  // job is done or `deadline` passes. At the deadline still-queued jobs fail with UNAVAILABLE and
  // running ones are stopped (their StopToken: they answer UNAVAILABLE at the kernels' next
  // poll); Drain then waits for them at most `grace` more. True when everything finished before
  // the deadline; running() tells whether a job outlived the grace. Thread-safe; blocks.
  bool Drain(absl::Time deadline, absl::Duration grace = absl::InfiniteDuration())
      ABSL_LOCKS_EXCLUDED(mu_);

  // True once the drain's deadline has passed (queued jobs failed, running ones stopped): holders
  // of admissions must give them up now. Thread-safe.
  bool drain_expired() const ABSL_LOCKS_EXCLUDED(mu_);
  int queued() const ABSL_LOCKS_EXCLUDED(mu_);
  int running() const ABSL_LOCKS_EXCLUDED(mu_);
  int admitted() const ABSL_LOCKS_EXCLUDED(mu_);
  int capacity() const { return options_.queue_capacity; }
  int workers() const { return options_.workers; }

 private:
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Options::spin: polls `wakeups_` until it moves, the spin time passes or another worker is
  // spinning already. The caller then takes the queue's lock as usual.
  void SpinForWork() ABSL_LOCKS_EXCLUDED(mu_);
  void WatchdogLoop() ABSL_LOCKS_EXCLUDED(mu_);
  JobOutcome RunJob(Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Sets job's stop token when its deadline passed or it was cancelled (or the drain timed out).
  void CheckStop(Job& job, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls the `done` of jobs taken off the queue (failed), outside the lock.
  void FailJobs(std::vector<std::unique_ptr<Job>> jobs) ABSL_LOCKS_EXCLUDED(mu_);
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && running_ == 0 && admitted_ == 0 && failing_ == 0;
  }
  // Drain's wait: true once nothing is admitted, queued or running, false when `deadline` passed
  // first.
  bool WaitIdle(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReportLoad() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the watchdog, asleep, must be woken to watch `job` (queued or started): its deadline
  // comes before the watchdog's wake-up, or it has a `cancelled` the watchdog is not polling.
  // Waking it for every job costs each call a thread wake-up and a turn at mu_.
  bool WatchdogMustLookLocked(const Job& job, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  Backend* const backend_;
  mutable absl::Mutex mu_;
  absl::CondVar work_cv_;   // a job was queued, or stop_
  absl::CondVar idle_cv_;   // a job finished (or an admission was released)
  absl::CondVar watch_cv_;  // a job to watch was queued or started, or stop_
  // When the sleeping watchdog wakes up next; InfinitePast while it is awake.
  absl::Time watch_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::deque<std::unique_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<Job*> running_jobs_ ABSL_GUARDED_BY(mu_);  // whose `done` has not started
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int admitted_ ABSL_GUARDED_BY(mu_) = 0;  // Admissions not yet released
  int failing_ ABSL_GUARDED_BY(mu_) = 0;   // jobs taken off the queue whose `done` runs
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool aborting_ ABSL_GUARDED_BY(mu_) = false;  // drain deadline passed: running jobs stopped
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Options::spin: bumped by each Submit (after its push) and at shutdown; what a spinning
  // worker polls. spinning_: a worker spins now.
  std::atomic<uint64_t> wakeups_{0};
  std::atomic<bool> spinning_{false};
  std::vector<std::thread> threads_;
  std::thread watchdog_;
};

}  // namespace attnd::server::engine
