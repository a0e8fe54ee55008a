#include "kernels/common/thread_pool.h"

#include <algorithm>

namespace attnd::kernels {

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(num_threads > 0 ? num_threads
                                   : std::max(1u, std::thread::hardware_concurrency())) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  // Lock and Unlock by hand: the lock is dropped around each chunk.
  mu_.Lock();
  while (fn_ != nullptr && next_ < n_) {
    const int64_t begin = next_;
    const int64_t end = std::min(n_, begin + chunk_);
    next_ = end;
    const auto* fn = fn_;
    ++active_;
    mu_.Unlock();
    (*fn)(begin, end);
    mu_.Lock();
    if (--active_ == 0 && next_ >= n_) done_cv_.SignalAll();
  }
  mu_.Unlock();
}

void ThreadPool::WorkerLoop() {
  int64_t seen_generation = 0;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen_generation) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen_generation = generation_;
    }
    RunChunks();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (num_threads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  absl::MutexLock call_lock(&call_mu_);
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    n_ = n;
    // About four chunks per thread balances uneven rows without much locking.
    chunk_ = std::max(grain, (n + 4 * num_threads_ - 1) / (4 * num_threads_));
    next_ = 0;
    ++generation_;
  }
  work_cv_.SignalAll();
  RunChunks();
  absl::MutexLock lock(&mu_);
  while (next_ < n_ || active_ != 0) done_cv_.Wait(&mu_);
  fn_ = nullptr;
}

void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)>& fn) {
  if (pool == nullptr) {
    if (n > 0) fn(0, n);
    return;
  }
  pool->ParallelFor(n, grain, fn);
}

}  // namespace attnd::kernels
