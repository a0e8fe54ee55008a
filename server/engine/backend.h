// The engine's view of a compute backend (docs/SERVICE.md "Layers"): it runs one step of an
// operator call — either an OpCall (whose tensors it places: host pointers on the CPU, staged or
// in-place device pointers on a GPU) or a plain closure over an ExecContext — and reports the
// implementation, the compute time and the bytes it moved. A call's StopToken reaches the kernels
// (ExecContext::stop): they stop early when it is set. No gRPC here.
//   CpuBackend cpu(&pool);
//   StepResult r;
//   ATTND_RETURN_IF_ERROR(cpu.RunCall(call, &r, &job.stop));
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/common/registry.h"
#include "server/engine/op_call.h"
#include "server/engine/ordered_device.h"
#include "server/regions/registry.h"

namespace attnd::server::engine {

// The stop request of one call (docs/SERVICE.md "Deadlines, cancellation and drain"): set once, by
// the scheduler, when the call's deadline passes, its client cancels or goes away, or the drain
// times out; the first reason is kept. Kernels poll flag() between work items (ExecContext::stop);
// GPU backends check it before each launch. Thread-safe.
class StopToken {
 public:
  enum class Reason { kNone = 0, kDeadline, kCancelled, kShutdown };

  // Asks the call to stop; a later reason does not replace the first. Never blocks.
  void Stop(Reason reason) {
    int none = static_cast<int>(Reason::kNone);
    reason_.compare_exchange_strong(none, static_cast<int>(reason), std::memory_order_relaxed);
    flag_.store(true, std::memory_order_release);
  }
  bool stopped() const { return flag_.load(std::memory_order_acquire); }
  Reason reason() const { return static_cast<Reason>(reason_.load(std::memory_order_relaxed)); }
  // What the kernels poll (a relaxed load per tile).
  const std::atomic<bool>* flag() const { return &flag_; }
  // The call's answer once stopped: DEADLINE_EXCEEDED, CANCELLED or UNAVAILABLE (the drain),
  // with `what` (where it stopped) in the message.
  absl::Status status(absl::string_view what) const;

 private:
  std::atomic<bool> flag_{false};
  std::atomic<int> reason_{static_cast<int>(Reason::kNone)};
};

// A closure step: runs something in `ctx`, writing the implementation's name to *impl.
using StepFn = std::function<absl::Status(const kernels::ExecContext& ctx, std::string* impl)>;

// One step of a job: an op call (the normal case) or a closure (tests, host-only work).
struct JobStep {
  JobStep(StepFn f) : fn(std::move(f)) {}  // NOLINT: implicit, steps are written as lambdas
  JobStep(OpCall* c) : call(c) {}          // NOLINT: not owned; outlives the job
  StepFn fn;
  OpCall* call = nullptr;
};

struct StepResult {
  std::string impl;
  // Device time of the op's launches (GPU events; device-ordered calls: the gate's and the done
  // kernel's %globaltimer stamps), or host wall time on the CPU backend.
  absl::Duration compute = absl::ZeroDuration();
  uint64_t copied_h2d = 0;      // bytes DMA'd host -> device (inline staging, host regions)
  uint64_t copied_d2h = 0;      // bytes DMA'd device -> host
  uint64_t count_readback = 0;  // device-region bytes read back for the work count
  std::string device;           // the device that ran it (UUID; "cpu-0")
  std::string graph;            // "hit" | "update" | "capture" when a graph ran; empty otherwise
  int pre_memsets = 0;          // device-ordered: workspace memsets enqueued before the ready wait
  std::string gate;             // device-ordered with a ready word: "spin" | "wait"; else empty
  std::string skip;             // device-ordered: how a cancel skips the op, "cond" | "enable"
  std::string done_at;          // device-ordered, "cond": "body" (done ends the IF body) | "after"
};

struct DeviceDescription {
  std::string name;
  std::string uuid;
  uint64_t memory_bytes = 0;
  std::string arch;
  int cores = 0;
  // The device's contexts are shared through an MPS server (CUDA only; read once at start-up;
  // docs/OPERATIONS.md "MPS"). Always false on HIP and the CPU backend.
  bool mps = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual kernels::Backend kind() const = 0;
  const char* name() const { return kernels::BackendName(kind()); }
  // Runs a closure step and times it. Thread-safe: scheduler workers call it concurrently.
  // `stop` (may be null) is the call's stop request: passed to the step in ExecContext::stop.
  virtual absl::Status Run(absl::string_view op, const StepFn& step, StepResult* result,
                           const StopToken* stop = nullptr) = 0;
  // Runs an op call: places its tensors, runs the op, brings host outputs back, fills *result.
  // Thread-safe. The default runs it on its host pointers through Run(). With `stop` set (before
  // or during the op) it stops early and answers stop->status(); the outputs are then undefined.
  virtual absl::Status RunCall(OpCall& call, StepResult* result, const StopToken* stop = nullptr);
  virtual std::vector<DeviceDescription> Devices() const = 0;
  // Bytes held by the backend's memory pools (0 for the CPU backend).
  virtual int64_t PoolBytes() const { return 0; }
  // GPU backends: what the region registry needs to open device regions and pin host regions
  // (null on the CPU backend). Shared: regions may outlive the backend.
  virtual std::shared_ptr<regions::DeviceRegionOpener> device_opener() const { return nullptr; }
  virtual std::shared_ptr<regions::HostPinner> host_pinner() const { return nullptr; }
  // A backend that can enqueue stream-ordered calls wholly on a device (CUDA; docs/SERVICE.md
  // "Stream-ordered calls on a CUDA device") returns one queue per ordered queue; null: the
  // host-polled path (CPU, HIP, or a driver without stream memory operations). Thread-safe.
  virtual std::unique_ptr<DeviceOrderedQueue> NewOrderedQueue() const { return nullptr; }

  // Device loss (docs/SERVICE.md "Standard services"): a backend reports each device it can no
  // longer use (GPU: a runtime error after which the device is unusable in the process) once,
  // through ReportDeviceLost; `on_lost` runs then, on the reporting thread, and at once for each
  // device lost before it was set. It must not call back into the backend. Setting another (or
  // nullptr) waits for a report running now. Thread-safe.
  using DeviceLostFn = std::function<void(const std::string& device, const std::string& why)>;
  void SetDeviceLostCallback(DeviceLostFn on_lost) ABSL_LOCKS_EXCLUDED(lost_mu_);
  // The devices reported lost so far (their UUIDs), in the order they were lost. Thread-safe.
  std::vector<std::string> LostDevices() const ABSL_LOCKS_EXCLUDED(lost_mu_);

 protected:
  // `device` became unusable because of `why`; later reports of the same device are ignored.
  void ReportDeviceLost(const std::string& device, absl::string_view why)
      ABSL_LOCKS_EXCLUDED(lost_mu_);

 private:
  mutable absl::Mutex lost_mu_;
  DeviceLostFn on_lost_ ABSL_GUARDED_BY(lost_mu_);
  std::vector<std::pair<std::string, std::string>> lost_ ABSL_GUARDED_BY(lost_mu_);
};

// The host-only checks of an op call for a backend without devices: no device-region tensors, no
// ready event, no device UUID other than `own_uuid`. INVALID_ARGUMENT / UNIMPLEMENTED else.
absl::Status CheckHostOnlyCall(const OpCall& call, absl::string_view own_uuid);

}  // namespace attnd::server::engine
