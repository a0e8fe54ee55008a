#include "server/engine/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cpu_relax.h"

namespace attnd::server::engine {
namespace {

absl::Status ShuttingDown() { return absl::UnavailableError("attnd is shutting down"); }

// A client whose deadline passes cancels the call on its own clock, ahead of the daemon's copy of
// that deadline (counted from the request's arrival, later than its sending): a cancellation seen
// this close to the deadline is taken for the deadline (docs/SERVICE.md "Status codes").
constexpr absl::Duration kDeadlineSkew = absl::Seconds(1);

}  // namespace

Scheduler::Admission& Scheduler::Admission::operator=(Admission&& other) noexcept {
  if (this != &other) {
    Release();
    sched_ = other.sched_;
    other.sched_ = nullptr;
  }
  return *this;
}

void Scheduler::Admission::Release() {
  if (sched_ == nullptr) return;
  {
    absl::MutexLock lock(&sched_->mu_);
    --sched_->admitted_;
  }
  sched_->idle_cv_.SignalAll();
  sched_ = nullptr;
}

Scheduler::Scheduler(Options options, Backend* backend) : options_(options), backend_(backend) {
  const int n = options_.workers > 0 ? options_.workers : 1;
  threads_.reserve(n);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { WorkerLoop(); });
  watchdog_ = std::thread([this] { WatchdogLoop(); });
}

Scheduler::~Scheduler() {
  Drain(absl::Now());
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  wakeups_.fetch_add(1);  // ends a spin
  work_cv_.SignalAll();
  watch_cv_.SignalAll();
  for (auto& t : threads_) t.join();
  watchdog_.join();
}

Scheduler::Admission Scheduler::Admit() {
  absl::MutexLock lock(&mu_);
  if (!accepting_) return Admission();
  ++admitted_;
  return Admission(this);
}

absl::Status Scheduler::Submit(std::unique_ptr<Job> job, Admission* admission) {
  const bool admitted = admission != nullptr && admission->sched_ == this;
  absl::Status status;
  bool watch = false, drain_waits = false;
  {
    absl::MutexLock lock(&mu_);
    if (!(accepting_ || (admitted && !aborting_))) {
      status = ShuttingDown();
    } else if (static_cast<int>(queue_.size()) >= options_.queue_capacity) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          "request queue is full (", options_.queue_capacity, " waiting; --queue-capacity)"));
    } else {
      job->submitted = absl::Now();
      watch = WatchdogMustLookLocked(*job, job->submitted);
      queue_.push_back(std::move(job));
      ReportLoad();
    }
    // Released with the job queued, under the same lock (a drain never sees the call in
    // neither place, and the call takes the lock once less); only a drain waits for it.
    if (admitted) {
      --admitted_;
      admission->sched_ = nullptr;
      drain_waits = !accepting_;
    }
  }
  if (drain_waits) idle_cv_.SignalAll();
  if (admission != nullptr) admission->Release();  // another scheduler's (none here)
  if (!status.ok()) return status;
  // Bumped after the lock is released, so that the spinner it ends finds the lock free.
  wakeups_.fetch_add(1);
  // A spinning worker sees wakeups_ move and takes the job without a thread wake-up. One that
  // stopped spinning stored spinning_ = false before it took the lock to look at the queue, so
  // either it finds this job there or this load sees false and signals.
  if (!spinning_.load()) work_cv_.Signal();
  if (watch) watch_cv_.Signal();
  return absl::OkStatus();
}

bool Scheduler::Drain(absl::Time deadline, absl::Duration grace) {
  std::vector<std::unique_ptr<Job>> failed;
  bool drained;
  {
    absl::MutexLock lock(&mu_);
    accepting_ = false;
    drained = WaitIdle(deadline);
    if (!drained) {
      aborting_ = true;
      // Running jobs stop at the kernels' next poll (or their next step).
      for (Job* job : running_jobs_) job->stop.Stop(StopToken::Reason::kShutdown);
      for (auto& job : queue_) failed.push_back(std::move(job));
      queue_.clear();
      failing_ += static_cast<int>(failed.size());
      ReportLoad();
    }
  }
  if (!failed.empty()) FailJobs(std::move(failed));
  if (!drained) {
    // Wait for the stopped jobs so that callers can tear down, but no longer than `grace`.
    const absl::Time until =
        grace == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + grace;
    absl::MutexLock lock(&mu_);
    WaitIdle(until);
  }
  return drained;
}

void Scheduler::FailJobs(std::vector<std::unique_ptr<Job>> jobs) {
  const absl::Time now = absl::Now();
  for (auto& job : jobs) {
    JobOutcome o;
    o.queue = now - job->submitted;
    if (job->stop.stopped()) {
      o.status = job->stop.reason() == StopToken::Reason::kDeadline
                     ? absl::DeadlineExceededError(absl::StrCat("deadline passed while queued (",
                                                                absl::FormatDuration(o.queue),
                                                                " in the queue)"))
                     : job->stop.status("while queued");
    } else {
      o.status = ShuttingDown();
    }
    if (job->done) job->done(std::move(o));
    job.reset();
  }
  {
    absl::MutexLock lock(&mu_);
    failing_ -= static_cast<int>(jobs.size());
  }
  idle_cv_.SignalAll();
}

bool Scheduler::WaitIdle(absl::Time deadline) {
  while (!IdleLocked()) {
    // WaitWithDeadline is true on timeout: then the answer is whether idle came at the end.
    if (idle_cv_.WaitWithDeadline(&mu_, deadline)) return IdleLocked();
  }
  return true;
}

bool Scheduler::WatchdogMustLookLocked(const Job& job, absl::Time now) const {
  // Awake (watch_until_ is InfinitePast), the watchdog scans the queue and the running jobs
  // before it sleeps again; asleep, it need not wake for a job whose deadline is not earlier
  // than its wake-up and whose `cancelled` its polling (cancel_poll) already covers.
  if (watch_until_ == absl::InfinitePast()) return false;
  if (job.deadline < watch_until_) return true;
  return job.cancelled && watch_until_ > now + options_.cancel_poll;
}

void Scheduler::ReportLoad() {
  if (options_.on_load) options_.on_load(static_cast<int>(queue_.size()), running_);
}

bool Scheduler::drain_expired() const {
  absl::MutexLock lock(&mu_);
  return aborting_;
}

int Scheduler::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

int Scheduler::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

int Scheduler::admitted() const {
  absl::MutexLock lock(&mu_);
  return admitted_;
}

void Scheduler::CheckStop(Job& job, absl::Time now) {
  if (job.stop.stopped()) return;
  // The deadline first: gRPC also cancels a call whose deadline passed, and such a call must
  // be counted as DEADLINE_EXCEEDED (docs/SERVICE.md "Status codes"), not CANCELLED.
  if (now >= job.deadline) {
    job.stop.Stop(StopToken::Reason::kDeadline);
  } else if (job.cancelled && job.cancelled()) {
    job.stop.Stop(now >= job.deadline - kDeadlineSkew ? StopToken::Reason::kDeadline
                                                      : StopToken::Reason::kCancelled);
  } else if (aborting_) {
    job.stop.Stop(StopToken::Reason::kShutdown);
  }
}

void Scheduler::WatchdogLoop() {
  mu_.Lock();  // by hand: dropped while failing expired jobs
  while (!stop_) {
    const absl::Time now = absl::Now();
    absl::Time wake = absl::InfiniteFuture();
    bool poll = false;  // a job with a `cancelled` to poll
    std::vector<std::unique_ptr<Job>> expired;
    for (auto it = queue_.begin(); it != queue_.end();) {
      Job& job = **it;
      CheckStop(job, now);
      if (job.stop.stopped()) {
        expired.push_back(std::move(*it));
        it = queue_.erase(it);
        continue;
      }
      wake = std::min(wake, job.deadline);
      poll = poll || static_cast<bool>(job.cancelled);
      ++it;
    }
    for (Job* job : running_jobs_) {
      CheckStop(*job, now);
      if (job->stop.stopped()) continue;
      wake = std::min(wake, job->deadline);
      poll = poll || static_cast<bool>(job->cancelled);
    }
    if (!expired.empty()) {
      failing_ += static_cast<int>(expired.size());
      ReportLoad();
      mu_.Unlock();
      FailJobs(std::move(expired));
      mu_.Lock();
      continue;
    }
    if (poll) wake = std::min(wake, now + options_.cancel_poll);
    watch_until_ = wake;
    watch_cv_.WaitWithDeadline(&mu_, wake);
    watch_until_ = absl::InfinitePast();
  }
  mu_.Unlock();
}

void Scheduler::SpinForWork() {
  bool expected = false;
  if (!spinning_.compare_exchange_strong(expected, true)) return;
  bool idle;
  uint64_t seen;
  {
    // Under the lock that Submit pushes under: a job queued after this moves wakeups_ later.
    absl::MutexLock lock(&mu_);
    idle = queue_.empty() && !stop_;
    seen = wakeups_.load();
  }
  if (idle) {
    const absl::Time start = absl::Now();
    const absl::Time until = start + options_.spin;
    for (int i = 1; wakeups_.load() == seen; ++i) {
      attnd::CpuRelax();
      if (i % 64 == 0 && absl::Now() >= until) break;
    }
    if (options_.on_spin) options_.on_spin(absl::ToDoubleSeconds(absl::Now() - start));
  }
  spinning_.store(false);
}

void Scheduler::WorkerLoop() {
  for (;;) {
    std::unique_ptr<Job> job;
    bool more = false, watch = false;
    if (options_.spin > absl::ZeroDuration()) SpinForWork();
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) work_cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stop_ and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
      running_jobs_.push_back(job.get());
      ReportLoad();
      // A Submit that saw a spinning worker did not signal: pass the wake-up on.
      more = options_.spin > absl::ZeroDuration() && !queue_.empty();
      watch = WatchdogMustLookLocked(*job, absl::Now());
    }
    if (more) work_cv_.Signal();
    if (watch) watch_cv_.Signal();
    JobOutcome outcome = RunJob(*job);
    {
      // Off the watchdog's list before `done`: its `cancelled` must not be polled after that.
      absl::MutexLock lock(&mu_);
      running_jobs_.erase(std::find(running_jobs_.begin(), running_jobs_.end(), job.get()));
    }
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
      CheckStop(job, absl::Now());
    }
    if (job.stop.stopped()) {
      if (i == 0 && job.stop.reason() == StopToken::Reason::kDeadline) {
        o.status = absl::DeadlineExceededError(absl::StrCat(
            "deadline passed while queued (", absl::FormatDuration(o.queue), " in the queue)"));
      } else {
        o.status =
            job.stop.status(i == 0 ? "before it started"
                                   : absl::StrCat("after step ", i, " of ", job.steps.size()));
      }
      return o;
    }
    StepResult r;
    const JobStep& step = job.steps[i];
    const absl::Time step_start = absl::Now();
    absl::Status s = step.call != nullptr ? backend_->RunCall(*step.call, &r, &job.stop)
                                          : backend_->Run(job.op, step.fn, &r, &job.stop);
    o.run += absl::Now() - step_start;
    o.ran = true;
    o.compute += r.compute;
    o.copied_h2d += r.copied_h2d;
    o.copied_d2h += r.copied_d2h;
    o.count_readback += r.count_readback;
    if (!r.device.empty()) o.device = r.device;
    if (!r.graph.empty()) o.graph = r.graph;
    if (!r.impl.empty()) o.impl = o.impl.empty() ? r.impl : absl::StrCat(o.impl, "+", r.impl);
    // Stopped while the step ran (the kernels returned early, or finished as the stop came): the
    // outputs are not to be trusted, whatever the step answered.
    if (job.stop.stopped()) {
      o.status = job.stop.status(
          absl::StrCat("while running (step ", i + 1, " of ", job.steps.size(), ")"));
      return o;
    }
    if (!s.ok()) {
      o.status = s;
      return o;
    }
  }
  o.status = absl::OkStatus();
  return o;
}

}  // namespace attnd::server::engine
