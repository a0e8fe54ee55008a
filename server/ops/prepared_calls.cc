#include "server/ops/prepared_calls.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnd::server::ops {
namespace {
constexpr size_t kReleasedKept = 4096;
}  // namespace

PreparedCallTable::PreparedCallTable(metrics::Metrics* metrics, Options options)
    : metrics_(metrics), options_(options) {
  if (metrics_ != nullptr) metrics_->SetPreparedCalls(0);
}

absl::StatusOr<uint64_t> PreparedCallTable::Add(PreparedCallEntry entry) {
  absl::MutexLock lock(&mu_);
  size_t& count = per_owner_[entry.owner];
  if (count >= options_.max_per_owner) {
    return absl::ResourceExhaustedError(absl::StrCat("this client has ", count,
                                                     " prepared calls, the most allowed; release "
                                                     "some (ReleaseCall)"));
  }
  ++count;
  entry.id = next_id_++;
  const uint64_t id = entry.id;
  calls_[id] = std::make_shared<const PreparedCallEntry>(std::move(entry));
  ReportLocked();
  return id;
}

absl::StatusOr<std::shared_ptr<const PreparedCallEntry>> PreparedCallTable::Find(
    const std::string& owner, uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(id);
  if (it != calls_.end() && it->second->owner == owner) return it->second;
  auto r = released_.find(id);
  if (r != released_.end() && r->second.first == owner) {
    return absl::NotFoundError(
        absl::StrCat("prepared call ", id, " was released: ", r->second.second));
  }
  // Another owner's call is reported like an unknown one.
  return absl::NotFoundError(absl::StrCat("no prepared call ", id, " (PrepareCall gives ids)"));
}

absl::Status PreparedCallTable::Release(const std::string& owner, uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(id);
  if (it == calls_.end() || it->second->owner != owner) {
    return absl::NotFoundError(absl::StrCat("no prepared call ", id));
  }
  ReleaseLocked(it, "by ReleaseCall");
  ReportLocked();
  return absl::OkStatus();
}

void PreparedCallTable::DropLease(const std::string& lease) {
  if (lease.empty()) return;
  absl::MutexLock lock(&mu_);
  for (auto it = calls_.begin(); it != calls_.end();) {
    auto next = std::next(it);
    if (it->second->lease == lease) ReleaseLocked(it, absl::StrCat("its lease ", lease, " ended"));
    it = next;
  }
  ReportLocked();
}

void PreparedCallTable::DropRegions(const std::string& owner,
                                    const std::vector<std::string>& regions) {
  if (regions.empty()) return;
  absl::MutexLock lock(&mu_);
  for (auto it = calls_.begin(); it != calls_.end();) {
    auto next = std::next(it);
    const PreparedCallEntry& e = *it->second;
    if (e.owner == owner) {
      for (const std::string& r : e.regions) {
        if (std::find(regions.begin(), regions.end(), r) != regions.end()) {
          ReleaseLocked(it, absl::StrCat("region '", r, "' it names was unregistered"));
          break;
        }
      }
    }
    it = next;
  }
  ReportLocked();
}

int64_t PreparedCallTable::live() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(calls_.size());
}

void PreparedCallTable::ReleaseLocked(
    std::map<uint64_t, std::shared_ptr<const PreparedCallEntry>>::iterator it, std::string why) {
  const uint64_t id = it->first;
  const std::string owner = it->second->owner;
  auto c = per_owner_.find(owner);
  if (c != per_owner_.end() && --c->second == 0) per_owner_.erase(c);
  calls_.erase(it);  // runs in flight keep their own reference
  released_[id] = {owner, std::move(why)};
  released_order_.push_back(id);
  while (released_order_.size() > kReleasedKept) {
    released_.erase(released_order_.front());
    released_order_.pop_front();
  }
}

void PreparedCallTable::ReportLocked() {
  if (metrics_ != nullptr) metrics_->SetPreparedCalls(static_cast<int64_t>(calls_.size()));
}

}  // namespace attnd::server::ops
