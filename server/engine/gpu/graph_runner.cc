#include "server/engine/gpu/graph_runner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/gpu/vendor.h"
#include "server/engine/gpu/gpu_status.h"

namespace attnd::server::engine::gpu_rt {

GraphRunner::GraphRunner(size_t capacity, bool enabled, std::function<void(const std::string&)> log)
    : enabled_(enabled), log_(std::move(log)), cache_(capacity, [](void* exec) {
        (void)gpu::GraphExecDestroy(static_cast<gpu::GraphExec>(exec));
      }) {}

GraphRunner::~GraphRunner() {
  absl::MutexLock lock(&mu_);
  cache_.Clear();
}

size_t GraphRunner::size() const {
  absl::MutexLock lock(&mu_);
  return cache_.size();
}

absl::Status GraphRunner::Capture(OpCall& call, const kernels::ExecContext& ctx,
                                  const std::vector<void*>& data, std::string* impl, void** graph,
                                  bool* capture_failed) {
  const auto stream = static_cast<gpu::Stream>(ctx.stream);
  *graph = nullptr;
  *capture_failed = false;
  if (gpu::StreamBeginCapture(stream) != gpu::kSuccess) {
    (void)gpu::GetLastError();
    *capture_failed = true;
    return absl::OkStatus();
  }
  const absl::Status run = call.Run(ctx, data, impl);
  gpu::Graph g = nullptr;
  const gpu::Error end = gpu::StreamEndCapture(stream, &g);
  if (!run.ok() || end != gpu::kSuccess || g == nullptr) {
    if (g != nullptr) (void)gpu::GraphDestroy(g);
    (void)gpu::GetLastError();
    // The op's own refusal (bad arguments, no implementation) is the answer. A runtime error
    // while capturing means a launch is not capture-safe: the caller launches directly.
    if (!run.ok() && run.code() != absl::StatusCode::kInternal && end == gpu::kSuccess) {
      return run;
    }
    *capture_failed = true;
    return absl::OkStatus();
  }
  *graph = g;
  return absl::OkStatus();
}

absl::Status GraphRunner::Launch(OpCall& call, const kernels::ExecContext& ctx,
                                 const std::vector<void*>& data, const std::string& key,
                                 const std::vector<const void*>& pointers, std::string* impl,
                                 std::string* result) {
  result->clear();
  if (!enabled_) return call.Run(ctx, data, impl);
  const auto stream = static_cast<gpu::Stream>(ctx.stream);
  absl::ReleasableMutexLock lock(&mu_);
  GraphCache::Entry* entry = cache_.Find(key);
  if (entry != nullptr && !entry->capturable) {
    lock.Release();
    return call.Run(ctx, data, impl);
  }
  const GraphResult plan = GraphCache::Plan(entry, pointers);
  if (plan == GraphResult::kHit) {
    ATTND_GPU_STATUS(gpu::GraphLaunch(static_cast<gpu::GraphExec>(entry->exec), stream),
                     "replaying the op's graph");
    *result = GraphResultName(plan);
    return absl::OkStatus();
  }
  void* captured = nullptr;
  bool capture_failed = false;
  if (absl::Status s = Capture(call, ctx, data, impl, &captured, &capture_failed); !s.ok()) {
    return s;
  }
  if (capture_failed) {
    GraphCache::Entry direct;
    direct.capturable = false;
    cache_.Insert(key, std::move(direct));
    lock.Release();
    if (log_) {
      log_(absl::StrCat("op ", call.op(),
                        " cannot be captured as a graph; launching it "
                        "directly (launch key ",
                        key, ")"));
    }
    return call.Run(ctx, data, impl);
  }
  const auto graph = static_cast<gpu::Graph>(captured);
  GraphResult outcome = plan;
  if (plan == GraphResult::kUpdate) {
    if (gpu::GraphExecUpdate(static_cast<gpu::GraphExec>(entry->exec), graph) == gpu::kSuccess) {
      entry->pointers = pointers;
    } else {
      (void)gpu::GetLastError();
      outcome = GraphResult::kCapture;  // the topology changed: instantiate afresh
    }
  }
  if (outcome == GraphResult::kCapture) {
    gpu::GraphExec exec = nullptr;
    const gpu::Error e = gpu::GraphInstantiate(&exec, graph);
    (void)gpu::GraphDestroy(graph);
    if (e != gpu::kSuccess) {
      absl::Status s = GpuStatus(e, "instantiating the op's graph");
      if (s.code() == absl::StatusCode::kUnavailable) return s;
      GraphCache::Entry direct;
      direct.capturable = false;
      cache_.Insert(key, std::move(direct));
      lock.Release();
      if (log_) log_(absl::StrCat("op ", call.op(), ": ", s.message(), "; launching directly"));
      return call.Run(ctx, data, impl);
    }
    GraphCache::Entry fresh;
    fresh.exec = exec;
    fresh.pointers = pointers;
    entry = cache_.Insert(key, std::move(fresh));
  } else {
    (void)gpu::GraphDestroy(graph);
  }
  ATTND_GPU_STATUS(gpu::GraphLaunch(static_cast<gpu::GraphExec>(entry->exec), stream),
                   "launching the op's graph");
  *result = GraphResultName(outcome);
  return absl::OkStatus();
}

}  // namespace attnd::server::engine::gpu_rt
