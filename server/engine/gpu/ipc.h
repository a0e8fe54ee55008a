// GPU inter-process sharing for the daemon (docs/SERVICE.md "Regions"): device regions (IPC memory
// handles opened once per allocation and shared by refcount, since a process may open an allocation
// only once), the callers' input-ready IPC events (opened once per handle, kept in a bounded LRU)
// and host regions pinned with the runtime so that copies from and to them are DMA.
//   auto opener = std::make_shared<IpcMemOpener>(served);   // RegionRegistry::Options
//   ATTND_RETURN_IF_ERROR(events.Wait(handle_bytes, stream));
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/common/gpu/vendor.h"
#include "server/engine/device_select.h"
#include "server/regions/registry.h"

namespace attnd::server::engine::gpu_rt {

// One thread that runs GPU runtime calls which can wait for the whole device (unpinning host
// memory, closing IPC mappings: while any stream of the daemon waits on a ready word they return
// only once it ends; docs/SERVICE.md "Eager module loading"), so that no request, completion or
// watchdog thread ever waits in them. Runs posted work in order; the destructor runs what is left
// and joins. Thread-safe.
//   auto t = std::make_shared<GpuTeardownThread>();  t->Post([p] { gpu::HostUnregister(p); });
class GpuTeardownThread {
 public:
  GpuTeardownThread();
  ~GpuTeardownThread();
  GpuTeardownThread(const GpuTeardownThread&) = delete;
  GpuTeardownThread& operator=(const GpuTeardownThread&) = delete;

  void Post(std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns once everything posted before the call has run (tests, shutdown).
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t done() const ABSL_LOCKS_EXCLUDED(mu_);  // work items run so far

 private:
  void Loop();

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> work_ ABSL_GUARDED_BY(mu_);
  uint64_t posted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Opens RegisterDeviceRegion handles. Keyed by the 64 handle bytes: regions of one allocation
// share its mapping, closed (IpcCloseMemHandle) when the last of them lets go. Thread-safe.
class IpcMemOpener : public regions::DeviceRegionOpener,
                     public std::enable_shared_from_this<IpcMemOpener> {
 public:
  // `teardown` (not null): where mappings are closed.
  IpcMemOpener(std::vector<ServedDevice> served, std::shared_ptr<GpuTeardownThread> teardown);

  // Opens (or shares) the allocation on the device spec.device_uuid names (or, when empty, the
  // device the allocation lives on) and checks [offset, offset + byte_size) against the
  // allocation's size (cuMemGetAddressRange through the runtime; when the driver cannot tell, the
  // declared size is trusted: docs/SERVICE.md). INVALID_ARGUMENT for an unknown device, a handle
  // that does not open, a device mismatch or a range past the allocation.
  absl::StatusOr<std::shared_ptr<regions::DeviceMapping>> Open(
      const regions::DeviceRegionSpec& spec) override ABSL_LOCKS_EXCLUDED(mu_);

  size_t open_allocations() const ABSL_LOCKS_EXCLUDED(mu_);  // allocations mapped now (tests)

 private:
  struct Entry {
    char* base = nullptr;
    uint64_t size = 0;  // 0: unknown
    int ordinal = 0;
    std::string uuid;
    int64_t refs = 0;
  };
  class Mapping;
  void Release(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Entry> OpenOnDevice(const std::string& handle, int ordinal) const;
  // IpcCloseMemHandle(base) on device `ordinal`, on the teardown thread. CUDA counts opens of
  // one handle in a context, so a re-open before the close runs is safe.
  void Close(char* base, int ordinal) const;

  const std::vector<ServedDevice> served_;
  const std::shared_ptr<GpuTeardownThread> teardown_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> open_ ABSL_GUARDED_BY(mu_);
};

// Registers host regions' pages with the runtime (portable: DMA-able by every device).
// Release unpins and unmaps on the teardown thread (`teardown`: not null).
class HostRegionPinner : public regions::HostPinner {
 public:
  explicit HostRegionPinner(std::shared_ptr<GpuTeardownThread> teardown)
      : teardown_(std::move(teardown)) {}
  absl::Status Pin(void* p, size_t bytes) override;
  void Unpin(void* p) override;
  void Release(void* p, std::function<void()> then) override;

 private:
  static void UnpinNow(void* p);  // Unpin's body, needing no pinner

  const std::shared_ptr<GpuTeardownThread> teardown_;
};

// The ready events of one device: each distinct handle opened once (IpcOpenEventHandle) and kept
// in an LRU of `capacity`; waiting happens under the cache's lock so that an event is never
// destroyed between lookup and wait. Thread-safe.
class IpcEventCache {
 public:
  IpcEventCache(int ordinal, size_t capacity);
  ~IpcEventCache();
  IpcEventCache(const IpcEventCache&) = delete;
  IpcEventCache& operator=(const IpcEventCache&) = delete;

  // Makes `stream` wait for the event `handle` (exactly 64 bytes) names. INVALID_ARGUMENT when
  // the handle does not open. The device must be current.
  absl::Status Wait(const std::string& handle, gpu::Stream stream) ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int ordinal_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<std::pair<std::string, gpu::Event>> lru_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::list<std::pair<std::string, gpu::Event>>::iterator> map_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace attnd::server::engine::gpu_rt
