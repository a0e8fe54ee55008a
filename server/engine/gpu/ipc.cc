#include "server/engine/gpu/ipc.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/engine/gpu/gpu_status.h"

namespace attnd::server::engine::gpu_rt {
namespace {

// A handle that does not open is the caller's error (a failed open leaves the context usable);
// out of memory is RESOURCE_EXHAUSTED.
absl::Status OpenError(gpu::Error e, absl::string_view what, absl::string_view hint) {
  (void)gpu::GetLastError();
  const std::string msg = absl::StrCat(what, ": ", gpu::kVendorName, " error ", static_cast<int>(e),
                                       " (", gpu::ErrorString(e), ")", hint);
#if defined(ATTND_GPU_CUDA)
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
#else
  if (e == hipErrorOutOfMemory) return absl::ResourceExhaustedError(msg);
#endif
  return absl::InvalidArgumentError(msg);
}

std::string ServedUuids(const std::vector<ServedDevice>& served) {
  std::string out;
  for (const ServedDevice& d : served) absl::StrAppend(&out, out.empty() ? "" : ", ", d.uuid);
  return out;
}

}  // namespace

GpuTeardownThread::GpuTeardownThread() : thread_([this] { Loop(); }) {}

GpuTeardownThread::~GpuTeardownThread() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();  // posted work holds no reference to this object: never this thread
}

void GpuTeardownThread::Post(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  work_.push_back(std::move(work));
  ++posted_;
}

void GpuTeardownThread::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = posted_;
  auto reached = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= target; };
  mu_.Await(absl::Condition(&reached));
}

uint64_t GpuTeardownThread::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

void GpuTeardownThread::Loop() {
  for (;;) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !work_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (work_.empty()) return;  // stopping, and everything posted has run
      work = std::move(work_.front());
      work_.pop_front();
    }
    if (work) work();
    absl::MutexLock lock(&mu_);
    ++done_;
  }
}

class IpcMemOpener::Mapping : public regions::DeviceMapping {
 public:
  Mapping(std::shared_ptr<IpcMemOpener> owner, std::string key, const Entry& entry)
      : owner_(std::move(owner)),
        key_(std::move(key)),
        base_(entry.base),
        size_(entry.size),
        ordinal_(entry.ordinal),
        uuid_(entry.uuid) {}
  ~Mapping() override { owner_->Release(key_); }

  char* base() const override { return base_; }
  uint64_t size() const override { return size_; }
  int device() const override { return ordinal_; }
  const std::string& device_uuid() const override { return uuid_; }

 private:
  std::shared_ptr<IpcMemOpener> owner_;
  const std::string key_;
  char* const base_;
  const uint64_t size_;
  const int ordinal_;
  const std::string uuid_;
};

IpcMemOpener::IpcMemOpener(std::vector<ServedDevice> served,
                           std::shared_ptr<GpuTeardownThread> teardown)
    : served_(std::move(served)), teardown_(std::move(teardown)) {}

void IpcMemOpener::Close(char* base, int ordinal) const {
  teardown_->Post([base, ordinal]() {
    int current = 0;
    const bool restore = gpu::GetDevice(&current) == gpu::kSuccess;
    (void)gpu::SetDevice(ordinal);
    (void)gpu::IpcCloseMemHandle(base);
    (void)gpu::GetLastError();
    if (restore) (void)gpu::SetDevice(current);
  });
}

size_t IpcMemOpener::open_allocations() const {
  absl::MutexLock lock(&mu_);
  return open_.size();
}

absl::StatusOr<IpcMemOpener::Entry> IpcMemOpener::OpenOnDevice(const std::string& handle,
                                                               int ordinal) const {
  ATTND_GPU_STATUS(gpu::SetDevice(ordinal), "selecting the device");
  gpu::IpcMemHandle h;
  static_assert(sizeof(h) == regions::kDeviceHandleBytes, "IPC memory handles are 64 bytes");
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  const gpu::Error e = gpu::IpcOpenMemHandle(&p, h);
  if (e != gpu::kSuccess) {
    return OpenError(e, "raw_handle: cannot open the IPC memory handle",
                     " (want the handle of a live device allocation of another process on this "
                     "host, in the same PID namespace)");
  }
  Entry entry;
  entry.base = static_cast<char*>(p);
  entry.ordinal = ordinal;
  int actual = ordinal;
  if (gpu::PointerDevice(p, &actual) != gpu::kSuccess) {
    (void)gpu::GetLastError();
    actual = ordinal;
  }
  entry.ordinal = actual;
  void* base = nullptr;
  size_t size = 0;
  if (gpu::MemGetAddressRange(p, &base, &size) == gpu::kSuccess && base == p) {
    entry.size = size;
  } else {
    (void)gpu::GetLastError();  // unknown: the declared byte_size is trusted (documented)
  }
  return entry;
}

absl::StatusOr<std::shared_ptr<regions::DeviceMapping>> IpcMemOpener::Open(
    const regions::DeviceRegionSpec& spec) {
  if (served_.empty()) return absl::FailedPreconditionError("no GPU is served");
  int named = -1;
  if (!spec.device_uuid.empty()) {
    named = FindServedDevice(spec.device_uuid, served_);
    if (named < 0) {
      return absl::InvalidArgumentError(absl::StrCat("device_uuid: '", spec.device_uuid,
                                                     "' is not a device this daemon serves (",
                                                     ServedUuids(served_), ")"));
    }
  }
  const std::string& key = spec.raw_handle;
  absl::MutexLock lock(&mu_);
  auto it = open_.find(key);
  if (it == open_.end()) {
    const int first = named >= 0 ? served_[named].ordinal : served_[0].ordinal;
    absl::StatusOr<Entry> entry = OpenOnDevice(key, first);
    if (!entry.ok()) return entry.status();
    if (entry->ordinal != first && named < 0) {
      // Unnamed device: map it again in the context of the device it lives on.
      Close(entry->base, first);
      entry = OpenOnDevice(key, entry->ordinal);
      if (!entry.ok()) return entry.status();
    }
    int served_index = -1;
    for (size_t i = 0; i < served_.size(); ++i) {
      if (served_[i].ordinal == entry->ordinal) served_index = static_cast<int>(i);
    }
    if (served_index < 0 || (named >= 0 && served_index != named)) {
      Close(entry->base, entry->ordinal);
      return absl::InvalidArgumentError(
          absl::StrCat("raw_handle: the allocation lives on device ordinal ", entry->ordinal,
                       named >= 0 ? absl::StrCat(", not on ", served_[named].uuid) : std::string(),
                       " (served: ", ServedUuids(served_), ")"));
    }
    entry->uuid = served_[served_index].uuid;
    it = open_.emplace(key, *entry).first;
  } else if (named >= 0 && served_[named].ordinal != it->second.ordinal) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_uuid: '", spec.device_uuid, "', but the allocation is on ", it->second.uuid));
  }
  Entry& entry = it->second;
  uint64_t end = 0;
  if (__builtin_add_overflow(spec.offset, spec.byte_size, &end) ||
      (entry.size > 0 && end > entry.size)) {
    const std::string msg =
        absl::StrCat("device region: offset ", spec.offset, " + byte_size ", spec.byte_size,
                     " is past the end of the allocation (", entry.size, " bytes)");
    if (entry.refs == 0) {
      Close(entry.base, entry.ordinal);
      open_.erase(it);
    }
    return absl::InvalidArgumentError(msg);
  }
  ++entry.refs;
  return std::shared_ptr<regions::DeviceMapping>(
      std::make_shared<Mapping>(shared_from_this(), key, entry));
}

void IpcMemOpener::Release(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(key);
  if (it == open_.end() || --it->second.refs > 0) return;
  Close(it->second.base, it->second.ordinal);
  open_.erase(it);
}

absl::Status HostRegionPinner::Pin(void* p, size_t bytes) {
#if defined(ATTND_GPU_CUDA)
  // Mapped too: a device-ordered call's stream waits on (and its done kernel stores to) a signal
  // word of a host region through the device pointer of these pages (docs/SERVICE.md
  // "Stream-ordered calls on a CUDA device").
  return GpuStatus(cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped),
                   "registering the host region's pages");
#else
  return GpuStatus(gpu::HostRegisterPortable(p, bytes), "registering the host region's pages");
#endif
}

void HostRegionPinner::UnpinNow(void* p) {
  (void)gpu::HostUnregister(p);
  (void)gpu::GetLastError();
}

void HostRegionPinner::Unpin(void* p) { UnpinNow(p); }

void HostRegionPinner::Release(void* p, std::function<void()> then) {
  // The base class's Release (unpin, then `then`), run on the teardown thread; Unpin uses no
  // member, so the pinner may be gone by then.
  teardown_->Post([p, then = std::move(then)]() {
    HostRegionPinner::UnpinNow(p);
    if (then) then();
  });
}

IpcEventCache::IpcEventCache(int ordinal, size_t capacity)
    : ordinal_(ordinal), capacity_(capacity > 0 ? capacity : 1) {}

IpcEventCache::~IpcEventCache() {
  absl::MutexLock lock(&mu_);
  if (!lru_.empty()) (void)gpu::SetDevice(ordinal_);
  for (auto& [handle, event] : lru_) (void)gpu::EventDestroy(event);
  lru_.clear();
  map_.clear();
}

size_t IpcEventCache::size() const {
  absl::MutexLock lock(&mu_);
  return map_.size();
}

absl::Status IpcEventCache::Wait(const std::string& handle, gpu::Stream stream) {
  if (handle.size() != regions::kDeviceHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ready_event: is ", handle.size(), " bytes, want exactly ", regions::kDeviceHandleBytes));
  }
  absl::MutexLock lock(&mu_);
  gpu::Event event = nullptr;
  auto it = map_.find(handle);
  if (it != map_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    event = it->second->second;
  } else {
    gpu::IpcEventHandle h;
    static_assert(sizeof(h) == regions::kDeviceHandleBytes, "IPC event handles are 64 bytes");
    std::memcpy(&h, handle.data(), sizeof(h));
    const gpu::Error e = gpu::IpcOpenEventHandle(&event, h);
    if (e != gpu::kSuccess) {
      return OpenError(e, "ready_event: cannot open the IPC event handle",
                       " (want an event created with cudaEventInterprocess by another process)");
    }
    lru_.emplace_front(handle, event);
    map_.emplace(handle, lru_.begin());
    while (map_.size() > capacity_) {
      (void)gpu::EventDestroy(lru_.back().second);
      map_.erase(lru_.back().first);
      lru_.pop_back();
    }
  }
  return GpuStatus(gpu::StreamWaitEvent(stream, event), "waiting for the ready event");
}

}  // namespace attnd::server::engine::gpu_rt
