// The engine's scheduler (docs/SERVICE.md "Scheduler, deadlines and shutdown"): a bounded queue of
// op calls served by a fixed pool of worker threads that run each call's steps on the backend,
// honouring deadlines and cancellation before the first step and between steps. No gRPC here: the
// front submits Jobs and gets a JobOutcome back through the job's `done`.
//   Scheduler sched({.queue_capacity = 64, .workers = 2}, &backend);
//   auto job = std::make_unique<Job>(); job->steps = {...}; job->done = [](JobOutcome o) {...};
//   if (absl::Status s = sched.Submit(std::move(job)); !s.ok()) { /* RESOURCE_EXHAUSTED... */ }
#pragma once

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
  bool ran = false;                               // at least one step ran
  uint64_t copied_h2d = 0;                        // sums of the steps' StepResult figures
  uint64_t copied_d2h = 0;
  uint64_t count_readback = 0;
  std::string device;  // of the last step that ran
  std::string graph;   // of the last step that ran
};

struct Job {
  uint64_t id = 0;  // request id, for logs
  std::string op;   // op name, for the backend
  absl::Time deadline = absl::InfiniteFuture();
  // Polled before each step; may be empty. Must be thread-safe.
  std::function<bool()> cancelled;
  std::vector<JobStep> steps;
  // Called exactly once after a successful Submit, on a worker thread (or the thread calling
  // Drain/~Scheduler for jobs failed at shutdown). Must not call back into the scheduler's Drain.
  std::function<void(JobOutcome)> done;
  absl::Time submitted;  // set by Submit
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
  };
  // `backend` (not owned) must outlive the scheduler. Starts the workers.
  Scheduler(Options options, Backend* backend);
  // Drains with no time limit left: fails queued jobs with UNAVAILABLE, joins the workers.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues `job`. RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE once draining; `done`
  // is then not called. Thread-safe, never blocks on running work.
  absl::Status Submit(std::unique_ptr<Job> job) ABSL_LOCKS_EXCLUDED(mu_);

  // Stops accepting (Submit -> UNAVAILABLE), then waits until every queued and running job is
  // done or `deadline` passes; at the deadline still-queued jobs fail with UNAVAILABLE (running
  // ones finish their current step, then stop with UNAVAILABLE). True when everything finished
  // before the deadline. Thread-safe; blocks.
  bool Drain(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  int queued() const ABSL_LOCKS_EXCLUDED(mu_);
  int running() const ABSL_LOCKS_EXCLUDED(mu_);
  int capacity() const { return options_.queue_capacity; }
  int workers() const { return options_.workers; }

 private:
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  JobOutcome RunJob(Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Drain's wait: true once nothing is queued or running, false when `deadline` passed first.
  bool WaitIdle(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReportLoad() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  Backend* const backend_;
  mutable absl::Mutex mu_;
  absl::CondVar work_cv_;  // a job was queued, or stop_
  absl::CondVar idle_cv_;  // a job finished
  std::deque<std::unique_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool aborting_ ABSL_GUARDED_BY(mu_) = false;  // drain deadline passed: stop between steps
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace attnd::server::engine
