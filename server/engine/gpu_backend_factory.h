// Building the GPU backend (CUDA or HIP, whichever this attnd was compiled for) without including
// any GPU header: main and tests ask whether one is built and how many devices it sees, then make
// it. In an ATTND_GPU=off build the answers are "none" and FAILED_PRECONDITION.
//   if (VisibleGpuCount() > 0) ATTND_ASSIGN_OR_RETURN(auto backend, MakeGpuBackend(options));
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/common/thread_pool.h"
#include "server/engine/backend.h"

namespace attnd::server::engine {

struct GpuBackendOptions {
  uint64_t pool_bytes = 8ull << 30;       // device memory reserved per device (hard limit)
  uint64_t staging_bytes = 256ull << 20;  // pinned host staging, shared by all devices
  int streams_per_device = 4;
  bool graphs = true;
  // Stream-ordered calls whose tensors are all in device regions wait, run and store `done` on
  // a device stream (CUDA; the daemon always asks for it). False: every stream-ordered call takes
  // the host-polled path.
  bool device_ordered = true;
  size_t graph_cache_capacity = 512;   // executable graphs kept per device (LRU)
  size_t event_cache_capacity = 1024;  // opened IPC ready events kept per device (LRU)
  // A blocking call's synchronise (the daemon's own launches, no client ready event) that has
  // waited this long marks its device lost as stalled (docs/SERVICE.md "A stalled device");
  // zero: not watched.
  absl::Duration stall_timeout = absl::Minutes(5);
  std::vector<std::string> devices;  // UUIDs or ordinals to serve; empty = all visible
  // Runs calls whose op has no GPU implementation (and whose tensors are all host-resident) on
  // the CPU; null = no fallback (UNIMPLEMENTED). Not owned; must outlive the backend.
  kernels::ThreadPool* cpu_pool = nullptr;
  // Pool figures for metrics ("GPU-…" or "pinned-staging"; state "reserved", "used", "free"),
  // called at start and after each call. May run on any worker thread.
  std::function<void(const std::string& pool, const char* state, int64_t bytes)> on_pool_stats;
  // Log lines (level 0 debug .. 3 error) the backend wants written; may be empty.
  std::function<void(int level, const std::string& message)> on_log;
};

// "cuda" or "hip" when this binary has a GPU backend, else "".
const char* GpuBackendName();
// Devices the GPU runtime reports (0 without a GPU backend, a driver or devices). Never fails.
int VisibleGpuCount();
// Reserves each served device's pool and the staging pool, creates streams. FAILED_PRECONDITION
// without a GPU backend or devices; INVALID_ARGUMENT for a --devices entry that matches nothing;
// RESOURCE_EXHAUSTED when a pool cannot be reserved.
absl::StatusOr<std::unique_ptr<Backend>> MakeGpuBackend(const GpuBackendOptions& options);

}  // namespace attnd::server::engine
