// Launches an op call's launch sequence on a stream through the device's graph cache
// (docs/SERVICE.md "GPU backend"): replayed when its launch key and pointers match a cached
// executable graph, re-captured and applied with an executable-graph update when only the pointers
// changed, captured and instantiated otherwise. A key whose capture fails (a launcher that is not
// capture-safe) is remembered and launched directly from then on. With graphs off every call
// launches directly.
//   std::string result;  // "hit" | "update" | "capture" | "" (direct)
//   ATTND_RETURN_IF_ERROR(runner.Launch(call, ctx, data, key, pointers, &impl, &result));
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/graph_cache.h"
#include "server/engine/op_call.h"

namespace attnd::server::engine::gpu_rt {

class GraphRunner {
 public:
  // `capacity` executable graphs kept (LRU); `enabled` false: always launch directly. `log`
  // (may be empty) receives one warning per key that cannot be captured.
  GraphRunner(size_t capacity, bool enabled, std::function<void(const std::string&)> log);
  ~GraphRunner();
  GraphRunner(const GraphRunner&) = delete;
  GraphRunner& operator=(const GraphRunner&) = delete;

  // Runs `call` (bound to `data`) on ctx.stream. `key` is the call's launch key plus the
  // implementation and workspace size; `pointers` every pointer the launch uses (tensors and
  // workspace). *result: the graph cache outcome, empty for a direct launch. The device must be
  // current. Thread-safe: the cache is locked while a graph is looked up, captured, updated and
  // launched (launching only enqueues).
  absl::Status Launch(OpCall& call, const kernels::ExecContext& ctx, const std::vector<void*>& data,
                      const std::string& key, const std::vector<const void*>& pointers,
                      std::string* impl, std::string* result) ABSL_LOCKS_EXCLUDED(mu_);

  bool enabled() const { return enabled_; }
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Captures `call` on ctx.stream into a new graph (*graph null when the capture failed; the
  // op's own error is returned when it refused). Runs under the cache's lock (see Launch).
  absl::Status Capture(OpCall& call, const kernels::ExecContext& ctx,
                       const std::vector<void*>& data, std::string* impl, void** graph,
                       bool* capture_failed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool enabled_;
  std::function<void(const std::string&)> log_;
  mutable absl::Mutex mu_;
  GraphCache cache_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnd::server::engine::gpu_rt
