#include "server/regions/registry.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "server/regions/shm_key.h"

namespace attnd::server::regions {

// Live totals per kind, shared by the registry and its regions (a region may outlive the
// registry's map entry while requests still pin it).
struct Region::Stats {
  absl::Mutex mu;
  int64_t count[2] ABSL_GUARDED_BY(mu) = {0, 0};
  int64_t bytes[2] ABSL_GUARDED_BY(mu) = {0, 0};
  std::function<void(RegionKind, int64_t, int64_t)> on_stats;

  void Add(RegionKind kind, int64_t dcount, int64_t dbytes) ABSL_LOCKS_EXCLUDED(mu) {
    const int k = static_cast<int>(kind);
    absl::MutexLock lock(&mu);
    count[k] += dcount;
    bytes[k] += dbytes;
    if (on_stats) on_stats(kind, count[k], bytes[k]);
  }
};

const char* RegionKindName(RegionKind kind) {
  return kind == RegionKind::kHost ? "host" : "device";
}

Region::Region(RegionDescription desc, HostMapping mapping, std::shared_ptr<Stats> stats)
    : desc_(std::move(desc)), mapping_(std::move(mapping)), stats_(std::move(stats)) {
  stats_->Add(desc_.kind, 1, static_cast<int64_t>(desc_.byte_size));
}

Region::Region(RegionDescription desc, std::shared_ptr<DeviceMapping> device,
               std::shared_ptr<Stats> stats)
    : desc_(std::move(desc)), device_(std::move(device)), stats_(std::move(stats)) {
  stats_->Add(desc_.kind, 1, static_cast<int64_t>(desc_.byte_size));
}

Region::~Region() {
  if (pinner_ != nullptr) pinner_->Unpin(mapping_.map_base());
  pinner_.reset();
  mapping_.Reset();
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
  std::random_device rd;
  lease_salt_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

RegionRegistry::~RegionRegistry() {
  std::map<std::string, std::shared_ptr<Region>, std::less<>> regions;
  {
    absl::MutexLock lock(&mu_);
    regions.swap(regions_);
  }
  // Regions still pinned by requests stay mapped until their pins go.
}

absl::Status RegionRegistry::CheckLease(const std::string& lease) const {
  if (!lease.empty() && leases_.count(lease) == 0) {
    return absl::NotFoundError(absl::StrCat("lease '", lease, "' is not open"));
  }
  return absl::OkStatus();
}

absl::Status RegionRegistry::Insert(std::shared_ptr<Region> region) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLease(region->desc_.lease); !s.ok()) return s;
  if (regions_.count(region->name()) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("region '", region->name(), "' is already registered"));
  }
  if (regions_.size() >= options_.max_regions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many regions (", options_.max_regions, ")"));
  }
  regions_.emplace(region->name(), std::move(region));
  return absl::OkStatus();
}

absl::Status RegionRegistry::RegisterHost(const HostRegionSpec& spec) {
  if (absl::Status s = ValidateRegionName(spec.name); !s.ok()) return s;
  if (absl::Status s = ValidateShmKey(spec.key); !s.ok()) return s;
  if (!options_.allow_client_shm) {
    return absl::FailedPreconditionError(
        "client shared memory is disabled on this daemon (start attnd with --allow-client-shm)");
  }
  {
    // Fail fast on a taken name or a closed lease before touching the shm object.
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckLease(spec.lease); !s.ok()) return s;
    if (regions_.count(spec.name) != 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("region '", spec.name, "' is already registered"));
    }
  }
  absl::StatusOr<HostMapping> mapping = HostMapping::Map(spec.key, spec.offset, spec.byte_size);
  if (!mapping.ok()) return mapping.status();
  RegionDescription desc;
  desc.name = spec.name;
  desc.kind = RegionKind::kHost;
  desc.key = spec.key;
  desc.offset = spec.offset;
  desc.byte_size = spec.byte_size;
  desc.lease = spec.lease;
  auto region = std::shared_ptr<Region>(new Region(std::move(desc), *std::move(mapping), stats_));
  if (options_.host_pinner != nullptr) {
    // Pinned so that GPU copies from and to it are DMA. A region that cannot be pinned still
    // works (the runtime stages pageable copies), only slower: not a reason to refuse it.
    absl::Status pinned =
        options_.host_pinner->Pin(region->mapping_.map_base(), region->mapping_.map_len());
    if (pinned.ok()) {
      region->pinner_ = options_.host_pinner;
    } else if (options_.on_pin_failure) {
      options_.on_pin_failure(spec.name, pinned);
    }
  }
  // A name taken meanwhile makes Insert fail; the mapping then goes with the region.
  return Insert(std::move(region));
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
    // Fail fast on a taken name or a closed lease before opening the handle.
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckLease(spec.lease); !s.ok()) return s;
    if (regions_.count(spec.name) != 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("region '", spec.name, "' is already registered"));
    }
  }
  absl::StatusOr<std::shared_ptr<DeviceMapping>> mapping = options_.device_opener->Open(spec);
  if (!mapping.ok()) return mapping.status();
  RegionDescription desc;
  desc.name = spec.name;
  desc.kind = RegionKind::kDevice;
  desc.device_uuid = (*mapping)->device_uuid();
  desc.offset = spec.offset;
  desc.byte_size = spec.byte_size;
  desc.lease = spec.lease;
  return Insert(std::shared_ptr<Region>(new Region(std::move(desc), *std::move(mapping), stats_)));
}

absl::Status RegionRegistry::UnregisterAsync(const std::string& name, const std::string& lease,
                                             std::function<void(std::vector<std::string>)> done) {
  std::vector<std::shared_ptr<Region>> removed;
  {
    absl::MutexLock lock(&mu_);
    if (!name.empty()) {
      auto it = regions_.find(name);
      if (it == regions_.end()) {
        return absl::NotFoundError(absl::StrCat("region '", name, "' is not registered"));
      }
      if (!lease.empty() && it->second->desc_.lease != lease) {
        return absl::NotFoundError(
            absl::StrCat("region '", name, "' is not registered under lease '", lease, "'"));
      }
      removed.push_back(std::move(it->second));
      regions_.erase(it);
    } else {
      for (auto it = regions_.begin(); it != regions_.end();) {
        if (it->second->desc_.lease == lease) {
          removed.push_back(std::move(it->second));
          it = regions_.erase(it);
        } else {
          ++it;
        }
      }
    }
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

absl::StatusOr<std::vector<std::string>> RegionRegistry::Unregister(const std::string& name,
                                                                    const std::string& lease) {
  struct Latch {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    std::vector<std::string> names ABSL_GUARDED_BY(mu);
  };
  auto latch = std::make_shared<Latch>();
  absl::Status s = UnregisterAsync(name, lease, [latch](std::vector<std::string> names) {
    absl::MutexLock lock(&latch->mu);
    latch->done = true;
    latch->names = std::move(names);
  });
  if (!s.ok()) return s;
  absl::MutexLock lock(&latch->mu);
  latch->mu.Await(absl::Condition(&latch->done));
  return std::move(latch->names);
}

absl::StatusOr<RegionPin> RegionRegistry::Acquire(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("region '", name, "' is not registered"));
  }
  return RegionPin(it->second);
}

std::vector<RegionDescription> RegionRegistry::List() const {
  std::vector<RegionDescription> out;
  absl::MutexLock lock(&mu_);
  out.reserve(regions_.size());
  for (const auto& [name, region] : regions_) {
    out.push_back(region->desc_);
    out.back().in_flight = region->in_flight();
  }
  return out;
}

std::string RegionRegistry::OpenLease() {
  absl::MutexLock lock(&mu_);
  std::string id = absl::StrFormat("lease-%016x-%d", lease_salt_, next_lease_++);
  leases_.insert(id);
  return id;
}

void RegionRegistry::CloseLease(const std::string& lease) {
  if (lease.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    leases_.erase(lease);
  }
  // Only this lease's regions: with a non-empty lease and an empty name this never fails.
  UnregisterAsync("", lease, nullptr).IgnoreError();
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
