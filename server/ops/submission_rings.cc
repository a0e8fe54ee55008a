#include "server/ops/submission_rings.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cpu_relax.h"
#include "server/common/log.h"
#include "server/ops/stream_ordered.h"

namespace attnd::server::ops {
namespace {

namespace L = ring_layout;

constexpr size_t kClosedKept = 4096;
thread_local bool in_poller = false;

// Counts a thread that wants the table's locks for its lifetime (Options::spin).
class LockerMark {
 public:
  explicit LockerMark(std::atomic<int>* n) : n_(n) { n_->fetch_add(1); }
  ~LockerMark() { n_->fetch_sub(1); }
  LockerMark(const LockerMark&) = delete;
  LockerMark& operator=(const LockerMark&) = delete;

 private:
  std::atomic<int>* n_;
};

uint64_t LoadAcquire(const char* p) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(p), __ATOMIC_ACQUIRE);
}
uint64_t LoadRelaxed(const char* p) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(p), __ATOMIC_RELAXED);
}
void StoreRelease(char* p, uint64_t v) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(p), v, __ATOMIC_RELEASE);
}

// An entry as copied out of its slot (never read from shared memory again).
struct EntryCopy {
  uint64_t seq, call_id, ready_offset, ready_value, done_offset, done_value, flags;
};

// A u64 word at `offset` of a region of `bytes` bytes starting at `base` is inside and aligned.
bool WordOk(const char* base, uint64_t bytes, uint64_t offset) {
  return offset <= bytes && bytes - offset >= sizeof(uint64_t) &&
         (reinterpret_cast<uintptr_t>(base) + offset) % alignof(uint64_t) == 0;
}

}  // namespace

struct SubmissionRingTable::Ring {
  uint64_t id = 0;
  Spec spec;
  std::string signal_name;
  regions::RegionPin ring_pin;
  regions::RegionPin signal_pin;
  char* base = nullptr;  // the ring's first byte (its head word)
  uint64_t tail = 0;     // entries taken: the daemon's own count, never read back
  // Poller only (under sweep_mu_):
  v1::Signal ready, done;  // reused for every entry (the region name set once)
  absl::Time last_log = absl::InfinitePast();
  absl::Time last_beat = absl::InfinitePast();
  uint64_t beats = 0;
  int64_t unlogged = 0;
  std::string error;  // why Poll errored the ring
  bool shut = false;  // pins released: never touched again
};

SubmissionRingTable::SubmissionRingTable(const regions::RegionRegistry* registry,
                                         metrics::Metrics* metrics, Options options)
    : registry_(registry), metrics_(metrics), options_(options) {
  if (metrics_ != nullptr) metrics_->SetSubmissionRings(0);
  poller_ = std::thread([this] { PollerLoop(); });
}

SubmissionRingTable::~SubmissionRingTable() {
  std::vector<std::shared_ptr<Ring>> all;
  {
    LockerMark mark(&lockers_);
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_.SignalAll();
  }
  poller_.join();
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, r] : rings_) all.push_back(r);
    unshut_ += static_cast<int64_t>(rings_.size());  // Shutdown counts every ring it shuts
    for (auto& r : deferred_) all.push_back(r);
    rings_.clear();
    deferred_.clear();
  }
  Shutdown(all);
}

absl::StatusOr<uint64_t> SubmissionRingTable::Open(Spec spec) {
  const uint32_t n = spec.entries;
  if (n == 0 || n > L::kMaxEntries || (n & (n - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("entries: ", n, " is not a power of two from 1 to ", L::kMaxEntries));
  }
  if (spec.offset % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset: ", spec.offset, " is not a multiple of 64"));
  }
  auto ring = std::make_shared<Ring>();
  ring->signal_name = spec.signal_region.empty() ? spec.region : spec.signal_region;
  for (const auto& [field, name, pin] :
       {std::make_tuple("region", spec.region, &ring->ring_pin),
        std::make_tuple("signal_region", ring->signal_name, &ring->signal_pin)}) {
    if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty"));
    absl::StatusOr<regions::RegionPin> p = registry_->Acquire(spec.owner, name);
    if (!p.ok()) {
      return absl::Status(p.status().code(), absl::StrCat(field, ": ", p.status().message()));
    }
    const bool device_ok = options_.device_signals && absl::string_view(field) == "signal_region";
    if ((*p)->kind() != regions::RegionKind::kHost && !device_ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": region '", name, "' is a device region; rings live in host regions"));
    }
    if ((*p)->truncated()) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": region '", name,
                       "' lost pages: its shm object was truncated while registered"));
    }
    *pin = *std::move(p);
  }
  const regions::Region& region = *ring->ring_pin.get();
  const uint64_t bytes = L::Bytes(n);
  if (spec.offset > region.byte_size() || region.byte_size() - spec.offset < bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offset: the ring's ", bytes, " bytes at ", spec.offset, " are past the end of region '",
        spec.region, "' (", region.byte_size(), " bytes)"));
  }
  ring->base = region.data() + spec.offset;
  if (reinterpret_cast<uintptr_t>(ring->base) % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offset: ", spec.offset, " in region '", spec.region,
        "' is not 64-byte aligned in the shm object (the region's own offset is not)"));
  }
  ring->ready.mutable_slice()->set_region(ring->signal_name);
  ring->done.mutable_slice()->set_region(ring->signal_name);
  ring->spec = std::move(spec);
  LockerMark mark(&lockers_);
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("attnd is shutting down");
  size_t& count = per_owner_[ring->spec.owner];
  if (count >= options_.max_per_owner) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this client has ", count, " submission rings open, the most allowed; close some"));
  }
  ++count;
  // A fresh header before the poller can see the ring.
  StoreRelease(ring->base + L::kState, L::kOpen);
  StoreRelease(ring->base + L::kBeat, 0);
  StoreRelease(ring->base + L::kTail, 0);
  StoreRelease(ring->base + L::kHead, 0);
  ring->id = next_id_++;
  rings_[ring->id] = ring;
  ReportLocked();
  wake_.Signal();
  Log(LogLevel::kDebug, "submission ring opened",
      {{"ring", ring->id},
       {"owner", ring->spec.owner},
       {"region", ring->spec.region},
       {"entries", static_cast<uint64_t>(n)},
       {"queue", ring->spec.label}});
  return ring->id;
}

absl::Status SubmissionRingTable::Close(const std::string& owner, uint64_t id) {
  {
    LockerMark mark(&lockers_);
    absl::MutexLock lock(&mu_);
    auto it = rings_.find(id);
    if (it == rings_.end() || it->second->spec.owner != owner) {
      // A ring the daemon closed itself says why (docs/SERVICE.md "Submission rings").
      if (std::string why = ClosedReasonLocked(owner, id); !why.empty()) {
        return absl::NotFoundError(
            absl::StrCat("submission ring ", id, " is closed already: ", why));
      }
      return absl::NotFoundError(absl::StrCat("no submission ring ", id, " (OpenRing gives ids)"));
    }
  }
  CloseMatching([id](const Ring& r) { return r.id == id; }, "by CloseRing", L::kClosed);
  return absl::OkStatus();
}

void SubmissionRingTable::DropLease(const std::string& lease) {
  if (lease.empty()) return;
  CloseMatching([&lease](const Ring& r) { return r.spec.lease == lease; },
                absl::StrCat("its lease ", lease, " ended"), L::kClosed);
  if (in_poller) return;  // the poller shuts its own closed rings down after this
  // A ring the poller closed just before (errored, or closed inside a sweep) is out of rings_
  // but may still pin its regions until the poller shuts it down: wait for that.
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(
                                +[](int64_t* unshut) { return *unshut == 0; }, &unshut_),
                            absl::Seconds(10))) {
    Log(LogLevel::kWarning, "submission rings still shutting down after 10 s",
        {{"lease", lease}, {"rings", unshut_}});
  }
}

void SubmissionRingTable::DropRegions(const std::string& owner,
                                      const std::vector<std::string>& regions) {
  if (regions.empty()) return;
  CloseMatching(
      [&](const Ring& r) {
        return r.spec.owner == owner &&
               (std::find(regions.begin(), regions.end(), r.spec.region) != regions.end() ||
                std::find(regions.begin(), regions.end(), r.signal_name) != regions.end());
      },
      "a region it uses was unregistered", L::kClosed);
}

int64_t SubmissionRingTable::open() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(rings_.size());
}

std::string SubmissionRingTable::closed_reason(const std::string& owner, uint64_t id) const {
  absl::MutexLock lock(&mu_);
  return ClosedReasonLocked(owner, id);
}

std::string SubmissionRingTable::ClosedReasonLocked(const std::string& owner, uint64_t id) const {
  auto it = closed_.find(id);
  return it != closed_.end() && it->second.first == owner ? it->second.second : std::string();
}

void SubmissionRingTable::CloseMatching(const std::function<bool(const Ring&)>& match,
                                        const std::string& why, uint64_t state) {
  LockerMark mark(&lockers_);
  std::vector<std::shared_ptr<Ring>> closing;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = rings_.begin(); it != rings_.end();) {
      if (!match(*it->second)) {
        ++it;
        continue;
      }
      Ring& r = *it->second;
      auto c = per_owner_.find(r.spec.owner);
      if (c != per_owner_.end() && --c->second == 0) per_owner_.erase(c);
      closed_[r.id] = {r.spec.owner, state == L::kErrored ? r.error : why};
      while (closed_.size() > kClosedKept) closed_.erase(closed_.begin());
      Log(state == L::kErrored ? LogLevel::kWarning : LogLevel::kDebug, "submission ring closed",
          {{"ring", r.id}, {"owner", r.spec.owner}, {"why", state == L::kErrored ? r.error : why}});
      ++unshut_;
      closing.push_back(it->second);
      it = rings_.erase(it);
    }
    ReportLocked();
    if (in_poller) {  // inside a sweep: shut down once it ends
      deferred_.insert(deferred_.end(), closing.begin(), closing.end());
      return;
    }
  }
  Shutdown(closing);
}

void SubmissionRingTable::Shutdown(const std::vector<std::shared_ptr<Ring>>& rings) {
  if (rings.empty()) return;
  // Dropping a region's last pin may complete an unregistration on this thread, and its callback
  // may close rings (and so come back here): the pins are released after sweep_mu_.
  std::vector<regions::RegionPin> released;
  int64_t shut = 0;  // rings shut down by this call
  {
    absl::MutexLock sweep(&sweep_mu_);
    for (const std::shared_ptr<Ring>& r : rings) {
      if (r->shut) continue;
      StoreRelease(r->base + L::kState, r->error.empty() ? L::kClosed : L::kErrored);
      r->shut = true;
      r->base = nullptr;
      released.push_back(std::move(r->ring_pin));
      released.push_back(std::move(r->signal_pin));
      r->ring_pin = regions::RegionPin();
      r->signal_pin = regions::RegionPin();
      ++shut;
    }
  }
  released.clear();
  absl::MutexLock lock(&mu_);
  unshut_ -= shut;
}

void SubmissionRingTable::ReportLocked() {
  if (metrics_ != nullptr) metrics_->SetSubmissionRings(static_cast<int64_t>(rings_.size()));
}

void SubmissionRingTable::Reject(Ring& ring, uint64_t seq, const char* result, const uint64_t* done,
                                 const absl::Status& why) {
  if (metrics_ != nullptr) metrics_->RecordRingEntry(result);
  // done = {offset, value}: the failure bit goes there when the word is a valid one.
  // A device-region done word cannot be written from the host: the refusal then shows only in
  // the metrics and the log.
  if (done != nullptr && ring.signal_pin->kind() == regions::RegionKind::kHost &&
      WordOk(ring.signal_pin->data(), ring.signal_pin->byte_size(), done[0])) {
    ring.done.mutable_slice()->set_offset(done[0]);
    ring.done.set_value(0);  // the word only: done[1] may be a value Resolve refuses (>= 2^62)
    absl::StatusOr<SignalWord> w =
        SignalWord::Resolve(registry_, ring.spec.owner, "done", ring.done);
    if (w.ok()) w->Store(done[1] | kSignalFailureBit);
  }
  const absl::Time now = absl::Now();
  if (now - ring.last_log < options_.log_interval) {
    ++ring.unlogged;
    return;
  }
  Log(LogLevel::kWarning, "submission ring entry refused",
      {{"ring", ring.id},
       {"owner", ring.spec.owner},
       {"seq", seq},
       {"result", result},
       {"code", metrics::CodeLabel(why.code())},
       {"error", why.message()},
       {"not_logged_since_last", ring.unlogged}});
  ring.last_log = now;
  ring.unlogged = 0;
}

bool SubmissionRingTable::Poll(Ring& ring, absl::Time now) {
  if (ring.ring_pin->truncated() || ring.signal_pin->truncated()) {
    ring.error = "a region it uses lost pages: its shm object was truncated while registered";
    return false;
  }
  if (now - ring.last_beat >= L::kBeatPeriod) {
    StoreRelease(ring.base + L::kBeat, ++ring.beats);
    ring.last_beat = now;
  }
  const uint64_t entries = ring.spec.entries;
  const uint64_t head = LoadAcquire(ring.base + L::kHead);
  const uint64_t avail = head - ring.tail;  // wraps huge when head went backwards
  if (avail == 0) return true;
  if (avail > entries) {
    if (metrics_ != nullptr) metrics_->RecordRingEntry("overrun");
    ring.error = absl::StrCat("head ", head, " is more than ", entries, " entries past tail ",
                              ring.tail, " (or behind it): the ring errored");
    return false;
  }
  const char* signal_base = ring.signal_pin->kind() == regions::RegionKind::kDevice
                                ? ring.signal_pin->device_data()
                                : ring.signal_pin->data();
  const uint64_t signal_bytes = ring.signal_pin->byte_size();
  for (uint64_t n = ring.tail; n != head; ++n) {
    const char* slot = ring.base + L::kHeaderBytes + (n & (entries - 1)) * L::kEntryBytes;
    // One copy; the client may rewrite the slot meanwhile, so only the copy is checked and used.
    EntryCopy e;
    e.seq = LoadAcquire(slot + L::kSeq);
    e.call_id = LoadRelaxed(slot + L::kCallId);
    e.ready_offset = LoadRelaxed(slot + L::kReadyOffset);
    e.ready_value = LoadRelaxed(slot + L::kReadyValue);
    e.done_offset = LoadRelaxed(slot + L::kDoneOffset);
    e.done_value = LoadRelaxed(slot + L::kDoneValue);
    e.flags = LoadRelaxed(slot + L::kFlags);
    ring.tail = n + 1;
    // The slot is free for the client again, before the entry's call can end: a client that
    // sees its done word finds the tail past the entry.
    StoreRelease(ring.base + L::kTail, ring.tail);
    const uint64_t done[2] = {e.done_offset, e.done_value};
    absl::Status bad;
    if (e.seq != n + 1) {
      bad = absl::InvalidArgumentError(absl::StrCat("entry ", n, ": seq is ", e.seq, ", want ",
                                                    n + 1, " (written last, after the entry)"));
    } else if ((e.flags & ~L::kFlagReady) != 0) {
      bad = absl::InvalidArgumentError(absl::StrCat("entry ", n, ": unknown flags ", e.flags));
    } else if (!WordOk(signal_base, signal_bytes, e.done_offset)) {
      bad = absl::InvalidArgumentError(
          absl::StrCat("entry ", n, ": done offset ", e.done_offset,
                       " is not an 8-byte aligned word inside region '", ring.signal_name, "'"));
    } else if ((e.flags & L::kFlagReady) != 0 &&
               !WordOk(signal_base, signal_bytes, e.ready_offset)) {
      bad = absl::InvalidArgumentError(
          absl::StrCat("entry ", n, ": ready offset ", e.ready_offset,
                       " is not an 8-byte aligned word inside region '", ring.signal_name, "'"));
    } else if (e.done_value >= kSignalFailureBit) {
      bad = absl::InvalidArgumentError(absl::StrCat("entry ", n, ": done value ", e.done_value,
                                                    " is >= 2^62 (the failure bit)"));
    } else if ((e.flags & L::kFlagReady) != 0 && e.ready_value >= kSignalFailureBit) {
      bad = absl::InvalidArgumentError(absl::StrCat("entry ", n, ": ready value ", e.ready_value,
                                                    " is >= 2^62 (the failure bit)"));
    }
    if (!bad.ok()) {
      Reject(ring, n + 1, "invalid", done, bad);
    } else {
      ring.done.mutable_slice()->set_offset(e.done_offset);
      ring.done.set_value(e.done_value);
      const bool has_ready = (e.flags & L::kFlagReady) != 0;
      if (has_ready) {
        ring.ready.mutable_slice()->set_offset(e.ready_offset);
        ring.ready.set_value(e.ready_value);
      }
      absl::Status s = ring.spec.submit(e.call_id, has_ready ? &ring.ready : nullptr, ring.done);
      if (s.ok()) {
        if (metrics_ != nullptr) metrics_->RecordRingEntry("submitted");
      } else {
        const bool invalid = s.code() == absl::StatusCode::kNotFound ||
                             s.code() == absl::StatusCode::kInvalidArgument;
        Reject(ring, n + 1, invalid ? "invalid" : "rejected", done, s);
      }
    }
  }
  return true;
}

void SubmissionRingTable::PollerLoop() {
  in_poller = true;
  absl::Duration interval = options_.poll;
  const absl::Duration max_interval = std::max(options_.poll, absl::Microseconds(500));
  const bool spins = options_.spin > absl::ZeroDuration();
  absl::Time spin_until = absl::InfinitePast();
  absl::Time spin_started = absl::InfinitePast();  // the current stretch of spinning
  auto spin_ended = [&](absl::Time now) {
    if (spin_started == absl::InfinitePast()) return;
    if (metrics_ != nullptr)
      metrics_->AddPollSpin("ring", absl::ToDoubleSeconds(now - spin_started));
    spin_started = absl::InfinitePast();
  };
  std::vector<std::shared_ptr<Ring>> sweep;
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (rings_.empty() && deferred_.empty()) {
      wake_.Wait(&mu_);
      interval = options_.poll;
      continue;
    }
    sweep.reserve(rings_.size());
    for (auto& [id, r] : rings_) sweep.push_back(r);
    mu_.Unlock();
    bool progress = false;
    std::set<uint64_t> errored;
    {
      absl::MutexLock s(&sweep_mu_);
      const absl::Time now = absl::Now();
      for (const std::shared_ptr<Ring>& r : sweep) {
        if (r->shut) continue;  // closed since the snapshot: its memory may be gone
        const uint64_t before = r->tail;
        if (!Poll(*r, now)) {
          errored.insert(r->id);
        } else if (r->tail != before) {
          progress = true;
        }
      }
    }
    sweep.clear();
    if (!errored.empty()) {
      in_poller = false;  // shut down at once (not inside a sweep now)
      CloseMatching([&errored](const Ring& r) { return errored.count(r.id) != 0; }, "errored",
                    L::kErrored);
      in_poller = true;
    }
    std::vector<std::shared_ptr<Ring>> deferred;
    mu_.Lock();
    deferred.swap(deferred_);
    if (!deferred.empty()) {
      mu_.Unlock();
      Shutdown(deferred);
      deferred.clear();
      mu_.Lock();
    }
    if (stop_) break;
    interval = progress ? options_.poll : std::min(interval * 2, max_interval);
    if (spins) {
      const absl::Time now = absl::Now();
      if (progress) spin_until = now + options_.spin;
      if (now < spin_until && lockers_.load(std::memory_order_relaxed) == 0) {
        // Spinning: the next sweep at once, the locks left free for a moment in between.
        if (spin_started == absl::InfinitePast()) spin_started = now;
        mu_.Unlock();
        for (int i = 0; i < 32; ++i) attnd::CpuRelax();
        mu_.Lock();
        continue;
      }
    }
    spin_ended(absl::Now());
    wake_.WaitWithTimeout(&mu_, interval);
  }
  spin_ended(absl::Now());
}

}  // namespace attnd::server::ops
