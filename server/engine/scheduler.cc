#include "server/engine/scheduler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace attnd::server::engine {
namespace {

absl::Status ShuttingDown() { return absl::UnavailableError("attnd is shutting down"); }

}  // namespace

Scheduler::Scheduler(Options options, Backend* backend) : options_(options), backend_(backend) {
  const int n = options_.workers > 0 ? options_.workers : 1;
  threads_.reserve(n);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

Scheduler::~Scheduler() {
  Drain(absl::Now());
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (auto& t : threads_) t.join();
}

absl::Status Scheduler::Submit(std::unique_ptr<Job> job) {
  {
    absl::MutexLock lock(&mu_);
    if (!accepting_) return ShuttingDown();
    if (static_cast<int>(queue_.size()) >= options_.queue_capacity) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "request queue is full (", options_.queue_capacity, " waiting; --queue-capacity)"));
    }
    job->submitted = absl::Now();
    queue_.push_back(std::move(job));
    ReportLoad();
  }
  work_cv_.Signal();
  return absl::OkStatus();
}

bool Scheduler::Drain(absl::Time deadline) {
  std::deque<std::unique_ptr<Job>> failed;
  bool drained;
  {
    absl::MutexLock lock(&mu_);
    accepting_ = false;
    drained = WaitIdle(deadline);
    if (!drained) {
      aborting_ = true;
      failed.swap(queue_);
      ReportLoad();
    }
  }
  for (auto& job : failed) {
    JobOutcome o;
    o.status = ShuttingDown();
    o.queue = absl::Now() - job->submitted;
    if (job->done) job->done(std::move(o));
  }
  if (!drained) {
    // Running jobs stop at their next step boundary; wait for them so callers can tear down.
    absl::MutexLock lock(&mu_);
    WaitIdle(absl::InfiniteFuture());
  }
  return drained;
}

bool Scheduler::WaitIdle(absl::Time deadline) {
  while (!queue_.empty() || running_ != 0) {
    // WaitWithDeadline is true on timeout: then the answer is whether idle came at the end.
    if (idle_cv_.WaitWithDeadline(&mu_, deadline)) return queue_.empty() && running_ == 0;
  }
  return true;
}

void Scheduler::ReportLoad() {
  if (options_.on_load) options_.on_load(static_cast<int>(queue_.size()), running_);
}

int Scheduler::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

int Scheduler::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

void Scheduler::WorkerLoop() {
  for (;;) {
    std::unique_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) work_cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stop_ and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
      ReportLoad();
    }
    JobOutcome outcome = RunJob(*job);
    if (job->done) job->done(std::move(outcome));
    job.reset();  // release what the job owns before reporting idle
    {
      absl::MutexLock lock(&mu_);
      --running_;
      ReportLoad();
    }
    idle_cv_.SignalAll();
  }
}

JobOutcome Scheduler::RunJob(Job& job) {
  JobOutcome o;
  o.queue = absl::Now() - job.submitted;
  for (size_t i = 0; i < job.steps.size(); ++i) {
    {
      absl::MutexLock lock(&mu_);
      if (aborting_) {
        o.status = ShuttingDown();
        return o;
      }
    }
    // The deadline first: gRPC also cancels a call whose deadline passed, and such a call must
    // be counted as DEADLINE_EXCEEDED (docs/SERVICE.md "Status codes"), not CANCELLED.
    if (absl::Now() >= job.deadline) {
      o.status = absl::DeadlineExceededError(
          i == 0 ? absl::StrCat("deadline passed while queued (", absl::FormatDuration(o.queue),
                                " in the queue)")
                 : absl::StrCat("deadline passed after step ", i, " of ", job.steps.size()));
      return o;
    }
    if (job.cancelled && job.cancelled()) {
      o.status = absl::CancelledError(i == 0 ? "cancelled before it started"
                                             : absl::StrCat("cancelled after step ", i));
      return o;
    }
    StepResult r;
    const JobStep& step = job.steps[i];
    absl::Status s = step.call != nullptr ? backend_->RunCall(*step.call, &r)
                                          : backend_->Run(job.op, step.fn, &r);
    o.ran = true;
    o.compute += r.compute;
    o.copied_h2d += r.copied_h2d;
    o.copied_d2h += r.copied_d2h;
    o.count_readback += r.count_readback;
    if (!r.device.empty()) o.device = r.device;
    if (!r.graph.empty()) o.graph = r.graph;
    if (!r.impl.empty()) o.impl = o.impl.empty() ? r.impl : absl::StrCat(o.impl, "+", r.impl);
    if (!s.ok()) {
      o.status = s;
      return o;
    }
  }
  o.status = absl::OkStatus();
  return o;
}

}  // namespace attnd::server::engine
