// The GPU backend (CUDA or HIP; docs/SERVICE.md "GPU backend"): one daemon serves every visible GPU
// (or those --devices names). A call runs on the device of its device regions (else its
// device_uuid, else the first served device), on a stream leased from that device's pool:
// host-resident tensors are staged into the device memory pool, device regions bound in place, the
// caller's ready event waited on in-stream, the op launched through the graph cache between two
// timing events, host outputs brought back, the stream synchronised. Built only with
// ATTND_GPU=cuda|hip; main makes it through gpu_backend_factory.h.
//   ATTND_ASSIGN_OR_RETURN(auto backend, GpuBackend::Create(options));
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engine/backend.h"
#include "server/engine/cpu_backend.h"
#include "server/engine/device_select.h"
#include "server/engine/gpu/device.h"
#include "server/engine/gpu/ipc.h"
#include "server/engine/gpu/ordered_queue.h"
#include "server/engine/gpu_backend_factory.h"
#include "server/engine/memory_pool.h"
#include "server/engine/stall_watch.h"

namespace attnd::server::engine::gpu_rt {

class GpuBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<GpuBackend>> Create(const GpuBackendOptions& options);
  // Sets the CUDA environment the backend needs (CUDA_DEVICE_MAX_CONNECTIONS=32 unless set,
  // CUDA_MODULE_LOADING=EAGER) for a driver not started yet; Create and VisibleGpuCount call it,
  // and a process that touches CUDA earlier calls it first. No-op on HIP.
  static void PrepareProcessEnvironment();
  ~GpuBackend() override;

  kernels::Backend kind() const override;
  // A closure step on the first served device: a leased stream in ctx, synchronised after.
  absl::Status Run(absl::string_view op, const StepFn& step, StepResult* result,
                   const StopToken* stop = nullptr) override;
  // See the header comment. INVALID_ARGUMENT for mixed or unknown devices, RESOURCE_EXHAUSTED
  // when the device pool cannot hold the call's staged tensors and workspace, UNAVAILABLE once
  // the device is lost. An op without a GPU implementation for the call runs on the CPU when
  // every tensor is host-resident (and a CPU pool was given), else UNIMPLEMENTED. `stop`: checked
  // (host side) before the op is launched and by multi-launch ops between launches (ctx.stop);
  // work already enqueued runs to its end (the stream is synchronised before its memory is
  // reused), then the call answers stop->status(). Thread-safe.
  absl::Status RunCall(OpCall& call, StepResult* result, const StopToken* stop = nullptr) override;
  std::vector<DeviceDescription> Devices() const override;
  int64_t PoolBytes() const override;
  std::shared_ptr<regions::DeviceRegionOpener> device_opener() const override { return opener_; }
  std::shared_ptr<regions::HostPinner> host_pinner() const override { return pinner_; }
  std::unique_ptr<DeviceOrderedQueue> NewOrderedQueue() const override;

  const std::vector<ServedDevice>& served() const { return served_; }
  GpuDevice& device(size_t index) { return *devices_[index]; }
  MemoryPool* staging() const { return staging_.get(); }
  int streams_per_device() const { return options_.streams_per_device; }

 private:
  explicit GpuBackend(GpuBackendOptions options) : options_(std::move(options)) {}
  absl::Status RunOnDevice(GpuDevice& device, OpCall& call, StepResult* result,
                           const StopToken* stop);
  absl::Status RunOnCpu(OpCall& call, StepResult* result, const StopToken* stop);
  void PublishPools(const GpuDevice& device) const;
  void Log(int level, const std::string& message) const;
  // A watched synchronise of `device` after `op` (`impl`; both valid until the token ends); an
  // empty token when unwatched.
  StallWatch::Token WatchSync(const GpuDevice& device, absl::string_view op,
                              absl::string_view impl);
  void OnStall(int device_index, const std::string& what, absl::Duration waited);

  const GpuBackendOptions options_;
  std::vector<std::unique_ptr<GpuDevice>> devices_;
  std::vector<ServedDevice> served_;
  std::unique_ptr<MemoryPool> staging_;
  std::shared_ptr<GpuTeardownThread> teardown_;  // shared with opener_ and pinner_
  std::shared_ptr<IpcMemOpener> opener_;
  std::shared_ptr<HostRegionPinner> pinner_;
  std::shared_ptr<OrderedRuntime> ordered_;  // null: stream-ordered calls take the host path
  std::unique_ptr<CpuBackend> cpu_;          // fallback for ops without a GPU implementation
  // Watches blocking calls' synchronises (null: --device-stall-timeout=0); destroyed first.
  std::unique_ptr<StallWatch> stall_watch_;
};

}  // namespace attnd::server::engine::gpu_rt
