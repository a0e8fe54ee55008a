// The region registry (DESIGN.md §3-4, after Triton's shared-memory extension): named host
// regions (POSIX shm mapped once) and device regions (raw IPC handles) in one namespace, pins that
// keep a region alive while requests use it, and leases that remove a session's regions when it
// ends. Constructed by its owner (main, a test) and passed in; never global.
//   RegionRegistry registry({.allow_client_shm = true});
//   ATTND_RETURN_IF_ERROR(registry.RegisterHost({"kv", "/my-shm", 0, size, ""}));
//   ATTND_ASSIGN_OR_RETURN(RegionPin pin, registry.Acquire("kv"));  // pin.data() ...
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/regions/host_mapping.h"

namespace attnd::server::regions {

enum class RegionKind { kHost, kDevice };
const char* RegionKindName(RegionKind kind);  // "host", "device"

inline constexpr size_t kDeviceHandleBytes = 64;  // cudaIpcMemHandle_t and hipIpcMemHandle_t

struct HostRegionSpec {
  std::string name;
  std::string key;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
  std::string lease;  // empty: not tied to a lease
};

struct DeviceRegionSpec {
  std::string name;
  std::string raw_handle;  // exactly kDeviceHandleBytes
  std::string device_uuid;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
  std::string lease;
};

// Opens device IPC handles; provided by GPU backends (issue 4). Thread-safe.
class DeviceRegionOpener {
 public:
  virtual ~DeviceRegionOpener() = default;
  // Checks that `spec` names a device this backend serves; opening may happen lazily later.
  virtual absl::Status Check(const DeviceRegionSpec& spec) = 0;
};

struct RegionDescription {
  std::string name;
  RegionKind kind = RegionKind::kHost;
  std::string key;
  std::string device_uuid;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
  std::string lease;
  int64_t in_flight = 0;
};

class RegionRegistry;

// One registered region. Immutable after registration except for the in-flight count; its memory
// stays mapped while the registry or any pin holds it.
class Region {
 public:
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  const RegionDescription& description() const { return desc_; }
  const std::string& name() const { return desc_.name; }
  RegionKind kind() const { return desc_.kind; }
  uint64_t byte_size() const { return desc_.byte_size; }
  // Host: the first byte of the region. Device: null (opened by the GPU backend, issue 4).
  char* data() const { return mapping_.data(); }
  int64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

 private:
  friend class RegionRegistry;
  friend class RegionPin;
  struct Stats;
  Region(RegionDescription desc, HostMapping mapping, std::shared_ptr<Stats> stats);
  // Runs `fn` once the region is released (unmapped); immediately if that already happened is
  // impossible here because the caller holds a reference.
  void OnRelease(std::function<void()> fn);

  const RegionDescription desc_;
  HostMapping mapping_;
  std::shared_ptr<Stats> stats_;
  std::atomic<int64_t> in_flight_{0};
  std::mutex mu_;
  std::vector<std::function<void()>> on_release_ ABSL_GUARDED_BY(mu_);
};

// Keeps a region mapped and counted as in flight while a request uses it. Movable; cheap.
class RegionPin {
 public:
  RegionPin() = default;
  explicit RegionPin(std::shared_ptr<Region> region);
  ~RegionPin();
  RegionPin(RegionPin&& other) noexcept = default;
  RegionPin& operator=(RegionPin&& other) noexcept;
  RegionPin(const RegionPin&) = delete;
  RegionPin& operator=(const RegionPin&) = delete;

  const Region* get() const { return region_.get(); }
  const Region* operator->() const { return region_.get(); }
  explicit operator bool() const { return region_ != nullptr; }

 private:
  std::shared_ptr<Region> region_;
};

class RegionRegistry {
 public:
  struct Options {
    bool allow_client_shm = false;
    DeviceRegionOpener* device_opener = nullptr;  // null: no GPU backend (CPU daemon)
    size_t max_regions = 65536;
    // Called with the live count and bytes of a kind whenever they change (metrics). May run on
    // any thread, including the one dropping a request's last pin; must not call the registry.
    std::function<void(RegionKind, int64_t count, int64_t bytes)> on_stats;
  };
  explicit RegionRegistry(Options options);
  ~RegionRegistry();
  RegionRegistry(const RegionRegistry&) = delete;
  RegionRegistry& operator=(const RegionRegistry&) = delete;

  // Registers a host region: validates name and key, maps the shm object. ALREADY_EXISTS for a
  // taken name, NOT_FOUND for an unknown lease or shm object, FAILED_PRECONDITION when client
  // shared memory is disabled, INVALID_ARGUMENT for bad ranges. Thread-safe; does syscalls
  // (shm_open, fstat, mmap) but never waits on other requests.
  absl::Status RegisterHost(const HostRegionSpec& spec);
  // Registers a device region: INVALID_ARGUMENT unless the handle is exactly kDeviceHandleBytes,
  // UNIMPLEMENTED without a GPU backend. Thread-safe.
  absl::Status RegisterDevice(const DeviceRegionSpec& spec);

  // Removes `name` (or, when empty, every region of `lease`; with both empty every region that
  // has no lease) from the namespace at once, so it can be registered again; `done` receives the
  // removed names once no request uses any of them any more (their memory is unmapped by then).
  // `done` runs on this thread when nothing is in flight, else on the thread that drops the last
  // pin. NOT_FOUND (and `done` not called) for an unknown name or a name held by another lease.
  // Thread-safe; never blocks.
  absl::Status UnregisterAsync(const std::string& name, const std::string& lease,
                               std::function<void(std::vector<std::string>)> done);
  // The same, waiting for in-flight requests. Blocks; not for reactor threads.
  absl::StatusOr<std::vector<std::string>> Unregister(const std::string& name,
                                                      const std::string& lease);

  // Pins a region for one request. NOT_FOUND for an unknown name. Thread-safe, non-blocking.
  absl::StatusOr<RegionPin> Acquire(absl::string_view name) const;

  std::vector<RegionDescription> List() const;  // sorted by name; thread-safe

  // Leases: OpenLease returns a fresh id; CloseLease removes the lease and unregisters its
  // regions (asynchronously: their memory goes once their requests end). Thread-safe.
  std::string OpenLease();
  void CloseLease(const std::string& lease);
  bool LeaseOpen(const std::string& lease) const;

  bool allow_client_shm() const { return options_.allow_client_shm; }
  // Live (still mapped, including unregistered ones still in use) count and bytes of a kind.
  void Totals(RegionKind kind, int64_t* count, int64_t* bytes) const;

 private:
  absl::Status Insert(std::shared_ptr<Region> region);
  absl::Status CheckLease(const std::string& lease) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  std::shared_ptr<Region::Stats> stats_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Region>, std::less<>> regions_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t lease_salt_ = 0;
};

}  // namespace attnd::server::regions
