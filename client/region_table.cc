#include "client/region_table.h"

namespace attnd::client {

void RegionTable::Add(const std::string& region, const void* base, uint64_t size) {
  absl::MutexLock lock(&mu_);
  by_base_[reinterpret_cast<uintptr_t>(base)] = Entry{region, size};
}

void RegionTable::Remove(const void* base) {
  absl::MutexLock lock(&mu_);
  by_base_.erase(reinterpret_cast<uintptr_t>(base));
}

std::optional<RegionTable::Hit> RegionTable::Find(const void* p, uint64_t bytes) const {
  if (p == nullptr) return std::nullopt;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  absl::ReaderMutexLock lock(&mu_);
  auto it = by_base_.upper_bound(addr);  // first region starting after p
  if (it == by_base_.begin()) return std::nullopt;
  --it;
  const uint64_t offset = addr - it->first;
  if (offset > it->second.size || bytes > it->second.size - offset) return std::nullopt;
  if (offset == it->second.size && bytes > 0) return std::nullopt;
  return Hit{it->second.region, offset};
}

size_t RegionTable::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return by_base_.size();
}

}  // namespace attnd::client
