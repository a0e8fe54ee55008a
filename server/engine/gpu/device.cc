#include "server/engine/gpu/device.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/engine/device_select.h"
#include "server/engine/gpu/gpu_status.h"

namespace attnd::server::engine::gpu_rt {

absl::StatusOr<std::unique_ptr<GpuDevice>> GpuDevice::Create(int ordinal, const Options& options) {
  std::unique_ptr<GpuDevice> d(new GpuDevice(ordinal));
  ATTND_GPU_STATUS(gpu::SetDevice(ordinal), absl::StrCat("selecting device ", ordinal));
  gpu::DeviceProp prop;
  ATTND_GPU_STATUS(gpu::GetDeviceProperties(&prop, ordinal),
                   absl::StrCat("reading the properties of device ", ordinal));
  unsigned char uuid[16] = {};
  ATTND_GPU_STATUS(gpu::GetDeviceUuid(ordinal, uuid),
                   absl::StrCat("reading the UUID of device ", ordinal));
  d->description_.name = prop.name;
  d->description_.uuid = FormatGpuUuid(uuid);
  d->description_.memory_bytes = prop.totalGlobalMem;
  d->description_.arch = gpu::ArchName(prop);
  d->description_.cores = gpu::MultiprocessorCount(prop);
  // A driver that does not know the attribute answers an error: no MPS then, and start-up goes on.
  if (gpu::DeviceUsesMps(ordinal, &d->description_.mps) != gpu::kSuccess) {
    (void)gpu::GetLastError();
    d->description_.mps = false;
  }

  void* base = nullptr;
  const gpu::Error e = gpu::Malloc(&base, options.pool_bytes);
  if (e != gpu::kSuccess) {
    (void)gpu::GetLastError();
    size_t free_bytes = 0, total = 0;
    (void)gpu::MemGetInfo(&free_bytes, &total);
    return absl::ResourceExhaustedError(absl::StrCat(
        "--pool-bytes=", FormatBytes(options.pool_bytes), ": cannot reserve it on ",
        d->description_.uuid, " (", d->description_.name, ": ", FormatBytes(free_bytes),
        " free of ", FormatBytes(total), "): ", gpu::ErrorString(e)));
  }
  d->pool_ = std::make_unique<MemoryPool>(d->description_.uuid, static_cast<char*>(base),
                                          options.pool_bytes, [ordinal](char* p) {
                                            (void)gpu::SetDevice(ordinal);
                                            (void)gpu::Free(p);
                                          });
  absl::StatusOr<PoolBlock> empty = d->pool_->Allocate(Arena::kAlignment);
  if (!empty.ok()) return empty.status();
  d->empty_ = *std::move(empty);

  d->slots_.resize(static_cast<size_t>(std::max(options.streams, 1)));
  for (Slot& slot : d->slots_) {
    ATTND_GPU_STATUS(gpu::StreamCreate(&slot.stream), "creating a stream");
    ATTND_GPU_STATUS(gpu::EventCreate(&slot.start), "creating a timing event");
    ATTND_GPU_STATUS(gpu::EventCreate(&slot.stop), "creating a timing event");
  }
  {
    absl::MutexLock lock(&d->mu_);
    d->busy_.assign(d->slots_.size(), false);
  }
  d->graphs_ = std::make_unique<GraphRunner>(options.graph_capacity, options.graphs, options.log);
  d->events_ = std::make_unique<IpcEventCache>(ordinal, options.event_capacity);
  return d;
}

GpuDevice::~GpuDevice() {
  (void)gpu::SetDevice(ordinal_);
  for (const Slot& slot : slots_) {
    if (slot.stream != nullptr) (void)gpu::StreamSynchronize(slot.stream);
  }
  graphs_.reset();
  events_.reset();
  for (const Slot& slot : slots_) {
    if (slot.start != nullptr) (void)gpu::EventDestroy(slot.start);
    if (slot.stop != nullptr) (void)gpu::EventDestroy(slot.stop);
    if (slot.stream != nullptr) (void)gpu::StreamDestroy(slot.stream);
  }
  empty_.Reset();
  pool_.reset();
  (void)gpu::GetLastError();
}

GpuDevice::StreamLease::StreamLease(StreamLease&& other) noexcept
    : device_(other.device_), index_(other.index_) {
  other.device_ = nullptr;
}

GpuDevice::StreamLease::~StreamLease() {
  if (device_ != nullptr) device_->Release(index_);
}

gpu::Stream GpuDevice::StreamLease::stream() const { return device_->slots_[index_].stream; }
gpu::Event GpuDevice::StreamLease::start() const { return device_->slots_[index_].start; }
gpu::Event GpuDevice::StreamLease::stop() const { return device_->slots_[index_].stop; }

int GpuDevice::FreeSlot() const {
  for (size_t i = 0; i < busy_.size(); ++i) {
    if (!busy_[i]) return static_cast<int>(i);
  }
  return -1;
}

GpuDevice::StreamLease GpuDevice::AcquireStream() {
  absl::MutexLock lock(&mu_);
  int index;
  while ((index = FreeSlot()) < 0) free_cv_.Wait(&mu_);
  busy_[index] = true;
  return StreamLease(this, index);
}

void GpuDevice::Release(int index) {
  {
    absl::MutexLock lock(&mu_);
    busy_[index] = false;
  }
  free_cv_.Signal();
}

absl::Status GpuDevice::CheckUsable() const {
  if (!lost_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return absl::UnavailableError(
      absl::StrCat(description_.uuid, " is unusable since: ", lost_why_, " (restart attnd)"));
}

void GpuDevice::MarkLost(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (lost_.load()) return;
  lost_why_ = std::string(why.message());
  lost_.store(true, std::memory_order_release);
}

}  // namespace attnd::server::engine::gpu_rt
