// The engine's view of a compute backend (DESIGN.md §5): it runs one step of an operator call
// (a closure over the op's params that calls the op's Run/Dispatch with the backend's
// ExecContext) and reports the implementation and the compute time. No gRPC here.
//   CpuBackend cpu(&pool);
//   StepResult r;
//   ATTND_RETURN_IF_ERROR(cpu.Run("sparse_mla", step, &r));
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/common/registry.h"

namespace attnd::server::engine {

// One step of a call: runs the op in `ctx`, writing the chosen implementation to *impl.
using StepFn = std::function<absl::Status(const kernels::ExecContext& ctx, std::string* impl)>;

struct StepResult {
  std::string impl;
  absl::Duration compute = absl::ZeroDuration();
};

struct DeviceDescription {
  std::string name;
  std::string uuid;
  uint64_t memory_bytes = 0;
  std::string arch;
  int cores = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual kernels::Backend kind() const = 0;
  const char* name() const { return kernels::BackendName(kind()); }
  // Runs `step` and times it. Thread-safe: scheduler workers call it concurrently.
  virtual absl::Status Run(absl::string_view op, const StepFn& step, StepResult* result) = 0;
  virtual std::vector<DeviceDescription> Devices() const = 0;
  // Bytes held by the backend's memory pools (0 for the CPU backend).
  virtual int64_t PoolBytes() const { return 0; }
};

}  // namespace attnd::server::engine
