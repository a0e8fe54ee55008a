// The CPU backend: runs op steps with ExecContext{kCpu, pool}; the pool is owned by the caller
// (main builds it from --cpu-threads).
//   kernels::ThreadPool pool(4);
//   CpuBackend backend(&pool);
#pragma once

#include "server/engine/backend.h"

namespace attnd::server::engine {

class CpuBackend : public Backend {
 public:
  static constexpr const char* kUuid = "cpu-0";  // its one "device"

  // `pool` (not owned, may be null = run on the worker thread) must outlive the backend.
  explicit CpuBackend(kernels::ThreadPool* pool);

  kernels::Backend kind() const override { return kernels::Backend::kCpu; }
  // Thread-safe; concurrent steps share the pool (its ParallelFor serialises them).
  absl::Status Run(absl::string_view op, const StepFn& step, StepResult* result,
                   const StopToken* stop = nullptr) override;
  // Runs `call` on its host pointers; refuses device regions, ready events and device UUIDs
  // other than kUuid. The kernels poll `stop` between work items. Thread-safe.
  absl::Status RunCall(OpCall& call, StepResult* result, const StopToken* stop = nullptr) override;
  std::vector<DeviceDescription> Devices() const override;

 private:
  kernels::ThreadPool* const pool_;
};

}  // namespace attnd::server::engine
