#include "server/regions/registry.h"

#include <fstream>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "kernels/common/status_details.h"
#include "server/regions/shm_key.h"

namespace attnd::server::regions {
namespace {

// NOT_FOUND statuses naming what the caller sent (docs/SERVICE.md "Status codes": ResourceInfo).
absl::Status RegionNotFound(absl::string_view name, absl::string_view message) {
  // A name that could never have been registered is not echoed back (a request may send
  // megabytes of it, past gRPC's metadata limit): the registration rule's bounded message answers.
  if (absl::Status invalid = ValidateRegionName(name); !invalid.ok()) return invalid;
  absl::Status s = absl::NotFoundError(message);
  kernels::SetResource(&s, kernels::kRegionResource, name);
  return s;
}
absl::Status LeaseNotOpen(absl::string_view lease) {
  absl::Status s = absl::NotFoundError(absl::StrCat("lease '", lease, "' is not open"));
  kernels::SetResource(&s, kernels::kLeaseResource, lease);
  return s;
}

}  // namespace

// Live totals per kind, shared by the registry and its regions (a region may outlive the
// registry's map entry while requests still pin it).
struct Region::Stats {
  absl::Mutex mu;
  int64_t count[2] ABSL_GUARDED_BY(mu) = {0, 0};
  int64_t bytes[2] ABSL_GUARDED_BY(mu) = {0, 0};
  std::function<void(RegionKind, int64_t, int64_t)> on_stats;
  // Distinct host mappings alive (SharedHostMapping), for max_host_mappings.
  const std::shared_ptr<std::atomic<int64_t>> live_mappings =
      std::make_shared<std::atomic<int64_t>>(0);

  void Add(RegionKind kind, int64_t dcount, int64_t dbytes) ABSL_LOCKS_EXCLUDED(mu) {
    const int k = static_cast<int>(kind);
    absl::MutexLock lock(&mu);
    count[k] += dcount;
    bytes[k] += dbytes;
    if (on_stats) on_stats(kind, count[k], bytes[k]);
  }
};

// One mapping of a host object's range, shared by every region registered over that object and
// range; unpinned and unmapped with its last region.
struct SharedHostMapping {
  SharedHostMapping(HostMapping m, std::shared_ptr<std::atomic<int64_t>> live)
      : mapping(std::move(m)), live_mappings(std::move(live)) {
    live_mappings->fetch_add(1, std::memory_order_relaxed);
  }
  ~SharedHostMapping() {
    if (pinner == nullptr) {
      mapping.Reset();
      live_mappings->fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    // Unmapped only once unpinned, which the pinner may do later (HostPinner::Release); the
    // mapping still counts against max_host_mappings until then.
    void* base = mapping.map_base();
    auto unmap = std::make_shared<HostMapping>(std::move(mapping));
    auto live = live_mappings;
    pinner->Release(base, [unmap, live]() {
      unmap->Reset();
      live->fetch_sub(1, std::memory_order_relaxed);
    });
    pinner.reset();
  }
  SharedHostMapping(const SharedHostMapping&) = delete;
  SharedHostMapping& operator=(const SharedHostMapping&) = delete;

  HostMapping mapping;
  std::shared_ptr<HostPinner> pinner;  // set while `mapping` is pinned
  const std::shared_ptr<std::atomic<int64_t>> live_mappings;
};

namespace {

// Half of vm.max_map_count (the other half stays for the allocator, thread stacks and
// libraries), or 32768 when it cannot be read.
size_t DefaultMaxHostMappings() {
  std::ifstream in("/proc/sys/vm/max_map_count");
  int64_t n = 0;
  if (in >> n && n > 0) return static_cast<size_t>(n / 2);
  return 32768;
}

}  // namespace

const char* RegionKindName(RegionKind kind) {
  return kind == RegionKind::kHost ? "host" : "device";
}

Region::Region(RegionDescription desc, std::shared_ptr<SharedHostMapping> host,
               std::shared_ptr<Stats> stats)
    : desc_(std::move(desc)), host_(std::move(host)), stats_(std::move(stats)) {
  stats_->Add(desc_.kind, 1, static_cast<int64_t>(desc_.byte_size));
}

Region::Region(RegionDescription desc, std::shared_ptr<DeviceMapping> device,
               std::shared_ptr<Stats> stats)
    : desc_(std::move(desc)), device_(std::move(device)), stats_(std::move(stats)) {
  stats_->Add(desc_.kind, 1, static_cast<int64_t>(desc_.byte_size));
}

char* Region::data() const { return host_ != nullptr ? host_->mapping.data() : nullptr; }
bool Region::pinned() const { return host_ != nullptr && host_->pinner != nullptr; }
bool Region::truncated() const { return host_ != nullptr && host_->mapping.Probe(); }

Region::~Region() {
  host_.reset();    // unmaps when this was the last region of the mapping
  device_.reset();  // closes the IPC mapping when this was its last region
  stats_->Add(desc_.kind, -1, -static_cast<int64_t>(desc_.byte_size));
  std::vector<std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    callbacks.swap(on_release_);
  }
  for (auto& fn : callbacks) fn();
}

void Region::OnRelease(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  on_release_.push_back(std::move(fn));
}

RegionPin::RegionPin(std::shared_ptr<Region> region) : region_(std::move(region)) {
  if (region_) region_->in_flight_.fetch_add(1, std::memory_order_relaxed);
}

RegionPin::~RegionPin() {
  if (region_) region_->in_flight_.fetch_sub(1, std::memory_order_relaxed);
}

RegionPin& RegionPin::operator=(RegionPin&& other) noexcept {
  if (this != &other) {
    if (region_) region_->in_flight_.fetch_sub(1, std::memory_order_relaxed);
    region_ = std::move(other.region_);
  }
  return *this;
}

RegionRegistry::RegionRegistry(Options options)
    : options_(std::move(options)), stats_(std::make_shared<Region::Stats>()) {
  stats_->on_stats = options_.on_stats;
  max_host_mappings_ =
      options_.max_host_mappings > 0 ? options_.max_host_mappings : DefaultMaxHostMappings();
  std::random_device rd;
  lease_salt_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

RegionRegistry::~RegionRegistry() {
  std::map<std::string, Names, std::less<>> owners;
  {
    absl::MutexLock lock(&mu_);
    owners.swap(owners_);
  }
  // Regions still pinned by requests stay mapped until their pins go.
}

absl::Status RegionRegistry::CheckInsert(const std::string& owner, const std::string& name,
                                         const std::string& lease) const {
  if (!lease.empty()) {
    auto it = leases_.find(lease);
    if (it == leases_.end() || it->second != owner) {
      return LeaseNotOpen(lease);
    }
  }
  auto names = owners_.find(owner);
  const size_t owned = names != owners_.end() ? names->second.size() : 0;
  if (owned != 0 && names->second.count(name) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("region '", name, "' is already registered"));
  }
  if (options_.max_regions_per_owner > 0 && owned >= options_.max_regions_per_owner) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this client has ", owned, " regions registered, the most one client may ",
                     "have (--max-regions-per-client=", options_.max_regions_per_owner,
                     "); unregister some first"));
  }
  if (region_count_ >= options_.max_regions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many regions (", options_.max_regions, ")"));
  }
  return absl::OkStatus();
}

absl::Status RegionRegistry::Insert(std::shared_ptr<Region> region) {
  absl::MutexLock lock(&mu_);
  const RegionDescription& d = region->desc_;
  if (absl::Status s = CheckInsert(d.owner, d.name, d.lease); !s.ok()) return s;
  owners_[d.owner].emplace(d.name, std::move(region));
  ++region_count_;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedHostMapping>> RegionRegistry::HostMappingFor(
    const HostRegionSpec& spec) {
  absl::StatusOr<ShmFile> file = ShmFile::Open(spec.key, spec.object_uid);
  if (!file.ok()) return file.status();
  const HostKey key{static_cast<uint64_t>(file->stat().st_dev),
                    static_cast<uint64_t>(file->stat().st_ino), spec.offset, spec.byte_size};
  {
    absl::MutexLock lock(&mu_);
    auto it = host_mappings_.find(key);
    if (it != host_mappings_.end()) {
      // The same pages, unless they were lost to a truncation (then a fresh mapping replaces
      // them); the range is checked against the object's size now.
      std::shared_ptr<SharedHostMapping> shared = it->second.lock();
      if (shared != nullptr && !shared->mapping.faulted()) {
        absl::Status range =
            CheckRange(spec.offset, spec.byte_size, static_cast<uint64_t>(file->stat().st_size),
                       absl::StrCat("shm object '", spec.key, "'"));
        if (!range.ok()) return range;
        return shared;
      }
    }
    if (stats_->live_mappings->load(std::memory_order_relaxed) >=
        static_cast<int64_t>(max_host_mappings_)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("too many host mappings (", max_host_mappings_,
                       ", half of vm.max_map_count); unregister regions or register larger ones"));
    }
  }
  absl::StatusOr<HostMapping> mapping = HostMapping::Map(*file, spec.offset, spec.byte_size);
  if (!mapping.ok()) return mapping.status();
  auto shared = std::make_shared<SharedHostMapping>(*std::move(mapping), stats_->live_mappings);
  if (options_.host_pinner != nullptr) {
    // Pinned so that GPU copies from and to it are DMA. A region that cannot be pinned still
    // works (the runtime stages pageable copies), only slower: not a reason to refuse it.
    absl::Status pinned =
        options_.host_pinner->Pin(shared->mapping.map_base(), shared->mapping.map_len());
    if (pinned.ok()) {
      shared->pinner = options_.host_pinner;
    } else if (options_.on_pin_failure) {
      options_.on_pin_failure(spec.name, pinned);
    }
  }
  absl::MutexLock lock(&mu_);
  std::weak_ptr<SharedHostMapping>& slot = host_mappings_[key];
  if (std::shared_ptr<SharedHostMapping> raced = slot.lock();
      raced != nullptr && !raced->mapping.faulted()) {
    return raced;  // ours goes
  }
  slot = shared;
  if (host_mappings_.size() >= host_sweep_at_) {
    for (auto it = host_mappings_.begin(); it != host_mappings_.end();) {
      it = it->second.expired() ? host_mappings_.erase(it) : std::next(it);
    }
    host_sweep_at_ = std::max<size_t>(64, 2 * host_mappings_.size());
  }
  return shared;
}

absl::Status RegionRegistry::RegisterHost(const HostRegionSpec& spec) {
  if (absl::Status s = ValidateRegionName(spec.name); !s.ok()) return s;
  if (absl::Status s = ValidateShmKey(spec.key); !s.ok()) return s;
  if (!options_.allow_client_shm) {
    return absl::FailedPreconditionError(
        "client shared memory is disabled on this daemon (start attnd with --allow-client-shm)");
  }
  {
    // Fail fast on a taken name, a closed lease or a full namespace before touching the object.
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckInsert(spec.owner, spec.name, spec.lease); !s.ok()) return s;
  }
  absl::StatusOr<std::shared_ptr<SharedHostMapping>> host = HostMappingFor(spec);
  if (!host.ok()) return host.status();
  RegionDescription desc;
  desc.owner = spec.owner;
  desc.name = spec.name;
  desc.kind = RegionKind::kHost;
  desc.key = spec.key;
  desc.offset = spec.offset;
  desc.byte_size = spec.byte_size;
  desc.lease = spec.lease;
  // A name taken meanwhile makes Insert fail; the mapping then goes with the region.
  return Insert(std::shared_ptr<Region>(new Region(std::move(desc), *std::move(host), stats_)));
}

absl::Status RegionRegistry::RegisterDevice(const DeviceRegionSpec& spec) {
  if (absl::Status s = ValidateRegionName(spec.name); !s.ok()) return s;
  if (spec.raw_handle.size() != kDeviceHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("raw_handle is ", spec.raw_handle.size(),
                                                   " bytes, want exactly ", kDeviceHandleBytes));
  }
  if (spec.byte_size == 0) return absl::InvalidArgumentError("device region: byte_size is 0");
  uint64_t end;
  if (__builtin_add_overflow(spec.offset, spec.byte_size, &end)) {
    return absl::InvalidArgumentError(absl::StrCat("device region: offset ", spec.offset,
                                                   " + byte_size ", spec.byte_size,
                                                   " overflows 64 bits"));
  }
  if (options_.device_opener == nullptr) {
    return absl::UnimplementedError(
        "device regions need a GPU backend (--backend=cuda|hip); this daemon runs the CPU "
        "backend");
  }
  if (!options_.allow_client_shm) {
    return absl::FailedPreconditionError(
        "client shared memory is disabled on this daemon (start attnd with --allow-client-shm)");
  }
  {
    // Fail fast on a taken name, a closed lease or a full namespace before opening the handle.
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckInsert(spec.owner, spec.name, spec.lease); !s.ok()) return s;
  }
  absl::StatusOr<std::shared_ptr<DeviceMapping>> mapping = options_.device_opener->Open(spec);
  if (!mapping.ok()) return mapping.status();
  RegionDescription desc;
  desc.owner = spec.owner;
  desc.name = spec.name;
  desc.kind = RegionKind::kDevice;
  desc.device_uuid = (*mapping)->device_uuid();
  desc.offset = spec.offset;
  desc.byte_size = spec.byte_size;
  desc.lease = spec.lease;
  return Insert(std::shared_ptr<Region>(new Region(std::move(desc), *std::move(mapping), stats_)));
}

absl::Status RegionRegistry::UnregisterAsync(const std::string& owner, const std::string& name,
                                             const std::string& lease,
                                             std::function<void(std::vector<std::string>)> done) {
  std::vector<std::shared_ptr<Region>> removed;
  {
    absl::MutexLock lock(&mu_);
    auto names = owners_.find(owner);
    if (!name.empty()) {
      auto it = names != owners_.end() ? names->second.find(name) : Names::iterator();
      if (names == owners_.end() || it == names->second.end()) {
        return RegionNotFound(name, absl::StrCat("region '", name, "' is not registered"));
      }
      if (!lease.empty() && it->second->desc_.lease != lease) {
        return RegionNotFound(
            name, absl::StrCat("region '", name, "' is not registered under lease '", lease, "'"));
      }
      removed.push_back(std::move(it->second));
      names->second.erase(it);
    } else {
      // A lease only `owner` holds (a closed lease has no regions left: nothing to remove).
      auto l = leases_.find(lease);
      if (!lease.empty() && l != leases_.end() && l->second != owner) {
        return LeaseNotOpen(lease);
      }
      if (names != owners_.end()) {
        for (auto it = names->second.begin(); it != names->second.end();) {
          if (it->second->desc_.lease == lease) {
            removed.push_back(std::move(it->second));
            it = names->second.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    region_count_ -= removed.size();
    if (names != owners_.end() && names->second.empty()) owners_.erase(names);
  }
  // `done` fires when the last removed region is released: a shared countdown, one release
  // callback per region. Our own references are dropped last, outside the lock.
  struct Countdown {
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu) = 0;
    std::vector<std::string> names;
    std::function<void(std::vector<std::string>)> done;
  };
  auto countdown = std::make_shared<Countdown>();
  countdown->done = std::move(done);
  for (const auto& r : removed) countdown->names.push_back(r->name());
  if (removed.empty()) {
    if (countdown->done) countdown->done({});
    return absl::OkStatus();
  }
  {
    absl::MutexLock lock(&countdown->mu);
    countdown->left = removed.size();
  }
  for (const auto& r : removed) {
    r->OnRelease([countdown] {
      bool last;
      {
        absl::MutexLock lock(&countdown->mu);
        last = --countdown->left == 0;
      }
      if (last && countdown->done) countdown->done(std::move(countdown->names));
    });
  }
  removed.clear();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> RegionRegistry::Unregister(const std::string& owner,
                                                                    const std::string& name,
                                                                    const std::string& lease) {
  struct Latch {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    std::vector<std::string> names ABSL_GUARDED_BY(mu);
  };
  auto latch = std::make_shared<Latch>();
  absl::Status s = UnregisterAsync(owner, name, lease, [latch](std::vector<std::string> names) {
    absl::MutexLock lock(&latch->mu);
    latch->done = true;
    latch->names = std::move(names);
  });
  if (!s.ok()) return s;
  absl::MutexLock lock(&latch->mu);
  latch->mu.Await(absl::Condition(&latch->done));
  return std::move(latch->names);
}

absl::StatusOr<RegionPin> RegionRegistry::Acquire(absl::string_view owner,
                                                  absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto names = owners_.find(owner);
  if (names != owners_.end()) {
    auto it = names->second.find(name);
    if (it != names->second.end()) return RegionPin(it->second);
  }
  return RegionNotFound(name, absl::StrCat("region '", name, "' is not registered"));
}

std::vector<RegionDescription> RegionRegistry::List(absl::string_view owner) const {
  std::vector<RegionDescription> out;
  absl::MutexLock lock(&mu_);
  auto names = owners_.find(owner);
  if (names == owners_.end()) return out;
  out.reserve(names->second.size());
  for (const auto& [name, region] : names->second) {
    out.push_back(region->desc_);
    out.back().in_flight = region->in_flight();
  }
  return out;
}

std::string RegionRegistry::OpenLease(const std::string& owner) {
  absl::MutexLock lock(&mu_);
  std::string id = absl::StrFormat("lease-%016x-%d", lease_salt_, next_lease_++);
  leases_.emplace(id, owner);
  return id;
}

void RegionRegistry::CloseLease(const std::string& lease) {
  if (lease.empty()) return;
  std::string owner;
  {
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(lease);
    if (it == leases_.end()) return;
    owner = std::move(it->second);
    leases_.erase(it);
  }
  // Only this lease's regions, in its owner's namespace: with a non-empty lease (closed now) and
  // an empty name this never fails.
  UnregisterAsync(owner, "", lease, nullptr).IgnoreError();
}

bool RegionRegistry::LeaseOpen(const std::string& lease) const {
  absl::MutexLock lock(&mu_);
  return leases_.count(lease) != 0;
}

void RegionRegistry::Totals(RegionKind kind, int64_t* count, int64_t* bytes) const {
  absl::MutexLock lock(&stats_->mu);
  *count = stats_->count[static_cast<int>(kind)];
  *bytes = stats_->bytes[static_cast<int>(kind)];
}

}  // namespace attnd::server::regions
