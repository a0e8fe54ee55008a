#include "server/engine/gpu/gpu_backend.h"

#include <cstdlib>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/status.h"
#include "server/engine/gpu/gpu_status.h"
#include "server/engine/gpu/placement.h"

namespace attnd::server::engine {
namespace gpu_rt {
namespace {

// The ordinals --devices names (every visible one when empty), in the order given.
absl::StatusOr<std::vector<int>> ChooseOrdinals(const std::vector<std::string>& filter, int count) {
  std::vector<ServedDevice> visible;
  for (int i = 0; i < count; ++i) {
    unsigned char uuid[16] = {};
    ATTND_GPU_STATUS(gpu::GetDeviceUuid(i, uuid), absl::StrCat("reading the UUID of device ", i));
    visible.push_back({i, FormatGpuUuid(uuid)});
  }
  std::vector<int> chosen;
  if (filter.empty()) {
    for (int i = 0; i < count; ++i) chosen.push_back(i);
    return chosen;
  }
  std::set<int> seen;
  for (const std::string& entry : filter) {
    int ordinal = -1;
    if (!absl::SimpleAtoi(entry, &ordinal)) ordinal = FindServedDevice(entry, visible);
    if (ordinal < 0 || ordinal >= count) {
      std::string names;
      for (const ServedDevice& d : visible) {
        absl::StrAppend(&names, names.empty() ? "" : ", ", d.ordinal, "=", d.uuid);
      }
      return absl::InvalidArgumentError(
          absl::StrCat("--devices: '", entry, "' matches no visible GPU (visible: ", names, ")"));
    }
    if (seen.insert(ordinal).second) chosen.push_back(ordinal);
  }
  return chosen;
}

#if defined(ATTND_GPU_CUDA)
// The start-up line on MPS (docs/OPERATIONS.md "MPS"): on, with the server's pipe directory, or
// off, with what that costs.
std::string MpsLine(const GpuDevice& d) {
  if (d.description().mps) {
    const char* pipe = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
    return absl::StrCat(d.uuid(), ": MPS on (the MPS server of ",
                        pipe != nullptr && *pipe != '\0' ? pipe : "/tmp/nvidia-mps", ")");
  }
  return absl::StrCat(d.uuid(),
                      ": MPS off (work of other processes on this GPU is time-sliced with "
                      "attnd's; docs/OPERATIONS.md \"MPS\")");
}
#endif

}  // namespace

void GpuBackend::PrepareProcessEnvironment() {
#if defined(ATTND_GPU_CUDA)
  // Before the first context exists (docs/SERVICE.md "Stream-ordered calls on a CUDA device"):
  // every hardware queue the device offers, so that device-ordered calls wait on lanes of their
  // own (a value set by the operator stays); and eager module loading, because loading a module
  // on a kernel's first launch waits for the whole context, and a device-ordered call waiting on
  // its ready word keeps the context busy: the first launch of any kernel (another client's op,
  // the watchdog's release) would then wait for that caller. This one is forced.
  (void)setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  (void)setenv("CUDA_MODULE_LOADING", "EAGER", 1);
#endif
}

absl::StatusOr<std::unique_ptr<GpuBackend>> GpuBackend::Create(const GpuBackendOptions& options) {
  PrepareProcessEnvironment();
  int count = 0;
  const gpu::Error e = gpu::GetDeviceCount(&count);
  if (e != gpu::kSuccess || count <= 0) {
    (void)gpu::GetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend=", gpu::kVendorName, ": no GPU is visible",
        e != gpu::kSuccess ? absl::StrCat(" (", gpu::ErrorString(e), ")") : std::string()));
  }
  absl::StatusOr<std::vector<int>> ordinals = ChooseOrdinals(options.devices, count);
  if (!ordinals.ok()) return ordinals.status();

  std::unique_ptr<GpuBackend> b(new GpuBackend(options));
  GpuDevice::Options dopt;
  dopt.pool_bytes = options.pool_bytes;
  dopt.streams = options.streams_per_device;
  dopt.graphs = options.graphs;
  dopt.graph_capacity = options.graph_cache_capacity;
  dopt.event_capacity = options.event_cache_capacity;
  GpuBackend* raw = b.get();
  dopt.log = [raw](const std::string& message) { raw->Log(2, message); };
  for (int ordinal : *ordinals) {
    absl::StatusOr<std::unique_ptr<GpuDevice>> device = GpuDevice::Create(ordinal, dopt);
    if (!device.ok()) return device.status();
    b->served_.push_back({ordinal, (*device)->uuid()});
    b->devices_.push_back(*std::move(device));
  }
  if (options.staging_bytes > 0) {
    void* base = nullptr;
    if (gpu::HostAllocPortable(&base, options.staging_bytes) == gpu::kSuccess) {
      b->staging_ = std::make_unique<MemoryPool>("pinned-staging", static_cast<char*>(base),
                                                 options.staging_bytes,
                                                 [](char* p) { (void)gpu::FreeHost(p); });
    } else {
      (void)gpu::GetLastError();
      b->Log(2, absl::StrCat("cannot pin ", FormatBytes(options.staging_bytes),
                             " of host staging (--staging-bytes); inline tensors are copied from "
                             "pageable memory"));
    }
  }
  // Unpinning host regions and closing IPC mappings wait for a device whose stream waits on a
  // ready word: they run on a thread of their own (docs/SERVICE.md "Eager module loading").
  b->teardown_ = std::make_shared<GpuTeardownThread>();
  b->opener_ = std::make_shared<IpcMemOpener>(b->served_, b->teardown_);
  b->pinner_ = std::make_shared<HostRegionPinner>(b->teardown_);
  if (options.cpu_pool != nullptr) b->cpu_ = std::make_unique<CpuBackend>(options.cpu_pool);
  if (options.device_ordered) {
    b->ordered_ = MakeOrderedRuntime(raw, [raw](const std::string& m) { raw->Log(2, m); });
  }
  if (options.stall_timeout > absl::ZeroDuration()) {
    b->stall_watch_ = std::make_unique<StallWatch>(
        options.stall_timeout, [raw](int device, const std::string& what, absl::Duration waited) {
          raw->OnStall(device, what, waited);
        });
  }
  for (const auto& d : b->devices_) {
    b->PublishPools(*d);
    b->Log(1, absl::StrCat("serving ", d->uuid(), " (", d->description().name, ", ordinal ",
                           d->ordinal(), ", compute ", d->description().arch, ", ",
                           d->description().cores, " SMs, pool ", FormatBytes(options.pool_bytes),
                           ")"));
#if defined(ATTND_GPU_CUDA)
    b->Log(1, MpsLine(*d));
#endif
  }
  return b;
}

GpuBackend::~GpuBackend() {
  stall_watch_.reset();  // its thread reports through devices_
  ordered_.reset();
  // Unpins and IPC closes of regions already gone run before the devices' memory goes (regions
  // still registered keep the teardown thread alive themselves).
  if (teardown_ != nullptr) teardown_->Flush();
  devices_.clear();
  staging_.reset();
}

std::unique_ptr<DeviceOrderedQueue> GpuBackend::NewOrderedQueue() const {
  // The queue uses the devices' thread-safe parts only (pools, event cache, usability).
  return NewGpuOrderedQueue(const_cast<GpuBackend*>(this), ordered_);
}

kernels::Backend GpuBackend::kind() const {
#if defined(ATTND_GPU_CUDA)
  return kernels::Backend::kCuda;
#else
  return kernels::Backend::kHip;
#endif
}

void GpuBackend::Log(int level, const std::string& message) const {
  if (options_.on_log) options_.on_log(level, message);
}

StallWatch::Token GpuBackend::WatchSync(const GpuDevice& device, absl::string_view op,
                                        absl::string_view impl) {
  if (stall_watch_ == nullptr) return {};
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (devices_[i].get() == &device) return stall_watch_->Begin(static_cast<int>(i), op, impl);
  }
  return {};
}

void GpuBackend::OnStall(int device_index, const std::string& what, absl::Duration waited) {
  GpuDevice& device = *devices_[static_cast<size_t>(device_index)];
  const std::string why =
      absl::StrCat("stalled: the synchronise after ", what, " has waited ",
                   absl::FormatDuration(waited), " for the device (--device-stall-timeout ",
                   absl::FormatDuration(options_.stall_timeout), ")");
  device.MarkLost(absl::UnavailableError(why));
  Log(3, absl::StrCat(device.uuid(), " ", why));
  ReportDeviceLost(device.uuid(), why);
}

void GpuBackend::PublishPools(const GpuDevice& device) const {
  if (!options_.on_pool_stats) return;
  auto publish = [this](const std::string& name, const ArenaStats& s) {
    options_.on_pool_stats(name, "reserved", static_cast<int64_t>(s.reserved));
    options_.on_pool_stats(name, "used", static_cast<int64_t>(s.used));
    options_.on_pool_stats(name, "free", static_cast<int64_t>(s.reserved - s.used));
  };
  publish(device.uuid(), device.pool().stats());
  if (staging_ != nullptr) publish(staging_->name(), staging_->stats());
}

std::vector<DeviceDescription> GpuBackend::Devices() const {
  std::vector<DeviceDescription> out;
  for (const auto& d : devices_) out.push_back(d->description());
  return out;
}

int64_t GpuBackend::PoolBytes() const {
  int64_t total = 0;
  for (const auto& d : devices_) total += static_cast<int64_t>(d->pool().stats().reserved);
  return total;
}

absl::Status GpuBackend::Run(absl::string_view op, const StepFn& step, StepResult* result,
                             const StopToken* stop) {
  if (stop != nullptr && stop->stopped()) return stop->status("before the launch");
  GpuDevice& device = *devices_.front();
  ATTND_RETURN_IF_ERROR(device.CheckUsable());
  ATTND_GPU_STATUS(gpu::SetDevice(device.ordinal()), "selecting the device");
  GpuDevice::StreamLease lease = device.AcquireStream();
  kernels::ExecContext ctx;
  ctx.backend = kind();
  ctx.stream = lease.stream();
  ctx.device = device.ordinal();
  if (stop != nullptr) ctx.stop = stop->flag();
  result->device = device.uuid();
  const absl::Time start = absl::Now();
  absl::Status s = step(ctx, &result->impl);
  StallWatch::Token watched = WatchSync(device, op, result->impl);
  absl::Status synced = GpuStatus(gpu::StreamSynchronize(lease.stream()), "running the step");
  watched.End();
  result->compute += absl::Now() - start;
  if (synced.code() == absl::StatusCode::kUnavailable) {
    device.MarkLost(synced);
    ReportDeviceLost(device.uuid(), synced.message());
  }
  if (synced.ok() && stop != nullptr && stop->stopped()) return stop->status("while running");
  return s.ok() ? synced : s;
}

absl::Status GpuBackend::RunCall(OpCall& call, StepResult* result, const StopToken* stop) {
  absl::StatusOr<size_t> index = SelectDevice(call.tensors(), call.device_uuid(), served_);
  if (!index.ok()) return index.status();
  GpuDevice& device = *devices_[*index];
  ATTND_RETURN_IF_ERROR(device.CheckUsable());
  absl::Status s = RunOnDevice(device, call, result, stop);
  if (s.code() == absl::StatusCode::kUnimplemented && cpu_ != nullptr && !call.HasDeviceTensors() &&
      call.ready_event().empty()) {
    *result = StepResult();
    s = RunOnCpu(call, result, stop);
  }
  // UNAVAILABLE from the runtime: the device is lost. (A call stopped by the drain timeout
  // answers UNAVAILABLE too, without any device error.)
  const bool drained =
      stop != nullptr && stop->stopped() && stop->reason() == StopToken::Reason::kShutdown;
  if (s.code() == absl::StatusCode::kUnavailable && !drained) {
    device.MarkLost(s);
    Log(3, absl::StrCat(device.uuid(), " lost: ", s.message()));
    ReportDeviceLost(device.uuid(), s.message());
  }
  PublishPools(device);
  return s;
}

absl::Status GpuBackend::RunOnCpu(OpCall& call, StepResult* result, const StopToken* stop) {
  const std::vector<void*> data = call.HostData();
  absl::Status s = cpu_->Run(
      call.op(),
      [&call, &data](const kernels::ExecContext& ctx, std::string* impl) {
        return call.Run(ctx, data, impl);
      },
      result, stop);
  result->device = CpuBackend::kUuid;
  return s;
}

absl::Status GpuBackend::RunOnDevice(GpuDevice& device, OpCall& call, StepResult* result,
                                     const StopToken* stop) {
  ATTND_GPU_STATUS(gpu::SetDevice(device.ordinal()), "selecting the device");
  result->device = device.uuid();
  GpuDevice::StreamLease lease = device.AcquireStream();
  const gpu::Stream stream = lease.stream();
  // Declared after the lease: synchronises its stream before the lease returns it.
  CallPlacement placement(&device, staging_.get(), stream);
  ATTND_RETURN_IF_ERROR(placement.Place(call.tensors()));

  kernels::ExecContext ctx;
  ctx.backend = kind();
  ctx.stream = stream;
  ctx.device = device.ordinal();
  if (stop != nullptr) ctx.stop = stop->flag();
  std::string impl;
  int64_t workspace_bytes = 0;
  ATTND_RETURN_IF_ERROR(call.Select(ctx, placement.data(), &impl, &workspace_bytes));
  absl::StatusOr<void*> workspace = placement.Workspace(workspace_bytes);
  if (!workspace.ok()) return workspace.status();
  ctx.workspace = *workspace;
  ctx.workspace_bytes = *workspace != nullptr ? workspace_bytes : 0;
  if (!call.ready_event().empty()) {
    ATTND_RETURN_IF_ERROR(device.events().Wait(call.ready_event(), stream));
  }

  std::string key = call.LaunchKey();
  absl::StrAppend(&key, "|impl=", impl, "|ws=", ctx.workspace_bytes);
  std::vector<const void*> pointers(placement.data().begin(), placement.data().end());
  pointers.push_back(ctx.workspace);
  // The last point before the op's launches (staging may have taken a while): a call already
  // asked to stop launches nothing. CallPlacement's destructor synchronises what was staged.
  if (stop != nullptr && stop->stopped()) return stop->status("before the launch");
  ATTND_GPU_STATUS(gpu::EventRecord(lease.start(), stream), "recording the start event");
  std::string graph;
  ATTND_RETURN_IF_ERROR(
      device.graphs().Launch(call, ctx, placement.data(), key, pointers, &impl, &graph));
  ATTND_GPU_STATUS(gpu::EventRecord(lease.stop(), stream), "recording the stop event");
  ATTND_RETURN_IF_ERROR(placement.Collect(call.tensors()));
  {
    // Watched only without a client's ready event: the stream then holds the daemon's own
    // work alone, whose time does not depend on a client.
    StallWatch::Token watched;
    if (call.ready_event().empty()) watched = WatchSync(device, call.op(), impl);
    ATTND_GPU_STATUS(gpu::StreamSynchronize(stream),
                     absl::StrCat("running ", call.op(), " (", impl, ") on ", device.uuid()));
  }
  // Stopped during the launches (a multi-launch op stops launching; what was enqueued ran): the
  // outputs are incomplete.
  if (stop != nullptr && stop->stopped()) return stop->status("while running");
  float ms = 0;
  ATTND_GPU_STATUS(gpu::EventElapsedMs(&ms, lease.start(), lease.stop()),
                   "reading the compute time");
  placement.Finish();
  result->impl = impl;
  result->graph = graph;
  result->compute += absl::Microseconds(static_cast<double>(ms) * 1e3);
  result->copied_h2d += placement.h2d_bytes();
  result->copied_d2h += placement.d2h_bytes();
  result->count_readback += placement.readback_bytes();
  return absl::OkStatus();
}

}  // namespace gpu_rt

const char* GpuBackendName() {
#if defined(ATTND_GPU_CUDA)
  return "cuda";
#else
  return "hip";
#endif
}

int VisibleGpuCount() {
  gpu_rt::GpuBackend::PrepareProcessEnvironment();  // before the driver starts
  int count = 0;
  if (gpu::GetDeviceCount(&count) != gpu::kSuccess) {
    (void)gpu::GetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeGpuBackend(const GpuBackendOptions& options) {
  absl::StatusOr<std::unique_ptr<gpu_rt::GpuBackend>> b = gpu_rt::GpuBackend::Create(options);
  if (!b.ok()) return b.status();
  return std::unique_ptr<Backend>(*std::move(b));
}

}  // namespace attnd::server::engine
