// A fixed pool of worker threads for the CPU backend. Constructed by its owner (main, a test) and
// passed to kernels through ExecContext; never global.
//   ThreadPool pool(4);
//   pool.ParallelFor(rows, /*grain=*/1, [&](int64_t begin, int64_t end) { ... });
#pragma once

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace attnd::kernels {

class ThreadPool {
 public:
  // num_threads <= 0 means std::thread::hardware_concurrency(). The calling thread also works,
  // so a pool of N runs N-way parallel with N-1 helper threads.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over [0, n) in chunks of at least `grain` items and returns when all
  // chunks are done. Thread-safe: concurrent callers are serialised (one loop runs at a time);
  // fn must not call ParallelFor on the same pool.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn)
      ABSL_LOCKS_EXCLUDED(call_mu_, mu_);

 private:
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void RunChunks() ABSL_LOCKS_EXCLUDED(mu_);

  const int num_threads_;
  std::vector<std::thread> workers_;
  absl::Mutex call_mu_;  // serialises ParallelFor callers; taken before mu_
  absl::Mutex mu_;
  absl::CondVar work_cv_;  // a new loop (generation_) or stop_
  absl::CondVar done_cv_;  // the current loop's last chunk finished
  const std::function<void(int64_t, int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t chunk_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// Runs fn over [0, n) on `pool`, or inline when pool is null.
void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)>& fn);

}  // namespace attnd::kernels
