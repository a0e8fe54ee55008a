// The region registry (docs/SERVICE.md "Regions", after Triton's shared-memory extension): named
// host regions (POSIX shm mapped once) and device regions (raw IPC handles), pins that keep a
// region alive while requests use it, and leases that remove a session's regions when it ends.
// Every region and lease belongs to an owner (the caller's identity, docs/SERVICE.md "Trust
// model"): each owner has its own namespace of region names, and names, lists, uses and removes
// only its own regions and leases. Constructed by its owner (main, a test) and passed in; never
// global.
//   RegionRegistry registry({.allow_client_shm = true});
//   spec.owner = "uid:1000"; spec.object_uid = 1000;  // name "kv", key "/my-shm", ...
//   ATTND_RETURN_IF_ERROR(registry.RegisterHost(spec));
//   ATTND_ASSIGN_OR_RETURN(RegionPin pin, registry.Acquire("uid:1000", "kv"));  // pin->data() ...
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
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
  std::string owner;  // the namespace the region is registered in (may be empty: one like any)
  // Set: the shm object must be a regular file owned by this uid (the caller's), else
  // PERMISSION_DENIED. Unset: any object the daemon can open (a root caller, tests).
  std::optional<uid_t> object_uid;
};

struct DeviceRegionSpec {
  std::string name;
  std::string raw_handle;  // exactly kDeviceHandleBytes
  std::string device_uuid;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
  std::string lease;
  std::string owner;  // the namespace the region is registered in
};

// An opened device allocation (a GPU IPC mapping), shared by every region inside it: a handle
// names the base of an allocation and may be opened only once per process, so regions of one
// allocation share one mapping, which is closed when the last of them (and the last request
// pinning one) lets go. Implemented by GPU backends.
class DeviceMapping {
 public:
  virtual ~DeviceMapping() = default;
  virtual char* base() const = 0;     // the allocation's first byte in this process
  virtual uint64_t size() const = 0;  // the allocation's bytes; 0 when the runtime cannot tell
  virtual int device() const = 0;     // the device's ordinal in this process
  virtual const std::string& device_uuid() const = 0;  // "GPU-…"
};

// Opens device IPC handles; provided by GPU backends. Thread-safe.
class DeviceRegionOpener {
 public:
  virtual ~DeviceRegionOpener() = default;
  // The mapping of spec.raw_handle (opened now, or shared with regions already open on the same
  // allocation) on the device spec.device_uuid names, with [offset, offset + byte_size) checked
  // against the allocation. INVALID_ARGUMENT for a handle that does not open, a device not
  // served, a range past the allocation.
  virtual absl::StatusOr<std::shared_ptr<DeviceMapping>> Open(const DeviceRegionSpec& spec) = 0;
};

// Registers host memory with the GPU runtime (page-locked and mapped for every device) so that
// copies between it and device memory are DMA. Provided by GPU backends. Thread-safe.
class HostPinner {
 public:
  virtual ~HostPinner() = default;
  virtual absl::Status Pin(void* p, size_t bytes) = 0;
  virtual void Unpin(void* p) = 0;  // `p` as given to a successful Pin
  // Unpins `p` and then runs `then` (the mapping's unmap). This default does both now, on the
  // caller's thread; a pinner whose Unpin can block (a GPU runtime's, while a stream waits:
  // docs/SERVICE.md "Eager module loading") may do both later on a thread of its own.
  virtual void Release(void* p, std::function<void()> then) {
    Unpin(p);
    if (then) then();
  }
};

struct RegionDescription {
  std::string owner;
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
struct SharedHostMapping;

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
  // Host: the first byte of the region. Device: null (device memory: see device_data()).
  char* data() const;
  // Device: the region's first byte in this process's mapping of the allocation; null for host.
  char* device_data() const {
    return device_ != nullptr ? device_->base() + desc_.offset : nullptr;
  }
  int device_ordinal() const { return device_ != nullptr ? device_->device() : -1; }
  // Host: registered with the GPU runtime (copies from and to it are DMA).
  bool pinned() const;
  // Host: its shm object was truncated while registered, and an access past the new end got
  // zero pages instead (HostMapping::faulted). Probes the mapping's last byte first, so a GPU
  // backend (whose copies of pinned pages never fault) sees it too. Sticky; calls using the
  // region fail.
  bool truncated() const;
  int64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

 private:
  friend class RegionRegistry;
  friend class RegionPin;
  struct Stats;
  Region(RegionDescription desc, std::shared_ptr<SharedHostMapping> host,
         std::shared_ptr<Stats> stats);
  Region(RegionDescription desc, std::shared_ptr<DeviceMapping> device,
         std::shared_ptr<Stats> stats);
  // Runs `fn` once the region is released (unmapped); immediately if that already happened is
  // impossible here because the caller holds a reference.
  void OnRelease(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);

  const RegionDescription desc_;
  // Host regions: the mapping, shared by every region of the same object and range (one mmap
  // however often a range is registered).
  std::shared_ptr<SharedHostMapping> host_;
  std::shared_ptr<DeviceMapping> device_;  // device regions
  std::shared_ptr<Stats> stats_;
  std::atomic<int64_t> in_flight_{0};
  absl::Mutex mu_;
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
    // GPU backends: open device regions and pin host regions. Null on the CPU daemon (device
    // regions are then UNIMPLEMENTED; host regions stay pageable). Shared: regions still
    // pinned by requests may outlive the registry and the backend.
    std::shared_ptr<DeviceRegionOpener> device_opener;
    std::shared_ptr<HostPinner> host_pinner;
    size_t max_regions = 65536;
    // Regions one owner may have registered at once (0: no cap beyond max_regions);
    // RESOURCE_EXHAUSTED beyond it.
    size_t max_regions_per_owner = 0;
    // Distinct host mappings alive at once (each costs one of the process's vm.max_map_count
    // memory maps; registering the same object and range again shares the mapping). 0: half of
    // vm.max_map_count, so that running out of maps fails a registration cleanly instead of the
    // next allocation of the daemon.
    size_t max_host_mappings = 0;
    // Called with the live count and bytes of a kind whenever they change (metrics). May run on
    // any thread, including the one dropping a request's last pin; must not call the registry.
    std::function<void(RegionKind, int64_t count, int64_t bytes)> on_stats;
    // Called (for logs) when a host region could not be pinned; it is registered unpinned.
    std::function<void(const std::string& name, const absl::Status& why)> on_pin_failure;
  };
  explicit RegionRegistry(Options options);
  ~RegionRegistry();
  RegionRegistry(const RegionRegistry&) = delete;
  RegionRegistry& operator=(const RegionRegistry&) = delete;

  // Registers a host region in spec.owner's namespace: validates name and key, opens the shm object
  // (no symlinks), checks it is a regular file owned by spec.object_uid when set, maps it (or
  // shares the mapping of the same object and range). ALREADY_EXISTS for a name the owner has
  // taken, NOT_FOUND for an unknown shm object or a lease that is not open or not the owner's,
  // PERMISSION_DENIED for an object of another user, FAILED_PRECONDITION when client shared
  // memory is disabled, INVALID_ARGUMENT for bad ranges, RESOURCE_EXHAUSTED beyond
  // max_regions_per_owner, max_regions or max_host_mappings. Thread-safe; does syscalls (open,
  // fstat, mmap) but never waits on other requests.
  absl::Status RegisterHost(const HostRegionSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);
  // Registers a device region: INVALID_ARGUMENT unless the handle is exactly kDeviceHandleBytes,
  // UNIMPLEMENTED without a GPU backend; the backend's opener maps the handle (once per
  // allocation) and checks the range. Thread-safe; the first region of an allocation costs the
  // runtime's IPC open (~100 µs).
  absl::Status RegisterDevice(const DeviceRegionSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes `owner`'s region `name` (or, when empty, every region of `owner`'s `lease`; with both
  // empty every region of `owner` that has no lease) from its namespace at once, so it can be
  // registered again; `done` receives the removed names once no request uses any of them any
  // more (their memory is unmapped by then). `done` runs on this thread when nothing is in flight,
  // else on the thread that drops the last pin. NOT_FOUND (and `done` not called) for a name
  // `owner` has not registered, a name held by another lease, or a lease that is not `owner`'s.
  // Thread-safe; never blocks.
  absl::Status UnregisterAsync(const std::string& owner, const std::string& name,
                               const std::string& lease,
                               std::function<void(std::vector<std::string>)> done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same, waiting for in-flight requests. Blocks; not for reactor threads.
  absl::StatusOr<std::vector<std::string>> Unregister(const std::string& owner,
                                                      const std::string& name,
                                                      const std::string& lease)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Pins `owner`'s region `name` for one request. NOT_FOUND for a name `owner` has not
  // registered (another owner's region of that name is not visible). Thread-safe, non-blocking.
  absl::StatusOr<RegionPin> Acquire(absl::string_view owner, absl::string_view name) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // `owner`'s regions, sorted by name; thread-safe.
  std::vector<RegionDescription> List(absl::string_view owner) const ABSL_LOCKS_EXCLUDED(mu_);

  // Leases: OpenLease returns a fresh id belonging to `owner` (only `owner` can register under it
  // or unregister its regions); CloseLease removes the lease and unregisters its regions
  // (asynchronously: their memory goes once their requests end). Thread-safe.
  std::string OpenLease(const std::string& owner) ABSL_LOCKS_EXCLUDED(mu_);
  void CloseLease(const std::string& lease) ABSL_LOCKS_EXCLUDED(mu_);
  bool LeaseOpen(const std::string& lease) const ABSL_LOCKS_EXCLUDED(mu_);

  // The namespace of callers that name no owner (tests, in-process users): the one-argument
  // forms below act in it.
  absl::Status UnregisterAsync(const std::string& name, const std::string& lease,
                               std::function<void(std::vector<std::string>)> done) {
    return UnregisterAsync("", name, lease, std::move(done));
  }
  absl::StatusOr<std::vector<std::string>> Unregister(const std::string& name,
                                                      const std::string& lease) {
    return Unregister("", name, lease);
  }
  absl::StatusOr<RegionPin> Acquire(absl::string_view name) const { return Acquire("", name); }
  std::vector<RegionDescription> List() const { return List(""); }
  std::string OpenLease() { return OpenLease(""); }

  bool allow_client_shm() const { return options_.allow_client_shm; }
  size_t max_host_mappings() const { return max_host_mappings_; }
  // Live (still mapped, including unregistered ones still in use) count and bytes of a kind.
  void Totals(RegionKind kind, int64_t* count, int64_t* bytes) const;

 private:
  using Names = std::map<std::string, std::shared_ptr<Region>, std::less<>>;
  // The identity of a host mapping: the object (device, inode) and the range mapped.
  struct HostKey {
    uint64_t dev = 0;
    uint64_t ino = 0;
    uint64_t offset = 0;
    uint64_t byte_size = 0;
    bool operator<(const HostKey& o) const {
      return std::tie(dev, ino, offset, byte_size) < std::tie(o.dev, o.ino, o.offset, o.byte_size);
    }
  };

  absl::Status Insert(std::shared_ptr<Region> region) ABSL_LOCKS_EXCLUDED(mu_);
  // OK when `name` is free in `owner`'s namespace, `lease` is empty or open and `owner`'s, and
  // the caps leave room for one more region.
  absl::Status CheckInsert(const std::string& owner, const std::string& name,
                           const std::string& lease) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<SharedHostMapping>> HostMappingFor(const HostRegionSpec& spec)
      ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  size_t max_host_mappings_ = 0;
  std::shared_ptr<Region::Stats> stats_;
  mutable absl::Mutex mu_;
  std::map<std::string, Names, std::less<>> owners_ ABSL_GUARDED_BY(mu_);  // owner -> its names
  size_t region_count_ ABSL_GUARDED_BY(mu_) = 0;                           // over all owners
  std::map<std::string, std::string> leases_ ABSL_GUARDED_BY(mu_);         // lease -> owner
  // Live host mappings by object and range (expired entries are swept as the map grows).
  std::map<HostKey, std::weak_ptr<SharedHostMapping>> host_mappings_ ABSL_GUARDED_BY(mu_);
  size_t host_sweep_at_ ABSL_GUARDED_BY(mu_) = 64;
  uint64_t next_lease_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t lease_salt_ = 0;
};

}  // namespace attnd::server::regions
