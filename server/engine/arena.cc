#include "server/engine/arena.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attnd::server::engine {

Arena::Arena(uint64_t capacity, std::string name)
    : capacity_(capacity / kAlignment * kAlignment), name_(std::move(name)) {
  absl::MutexLock lock(&mu_);
  stats_.reserved = capacity_;
  if (capacity_ > 0) InsertFree(0, capacity_);
  stats_.largest_free = capacity_;
}

uint64_t Arena::SizeClass(uint64_t bytes) {
  if (bytes <= kAlignment) return kAlignment;
  // Step = 2^(floor(log2(bytes)) - 3), at least kAlignment: 8 classes per octave.
  const int msb = 63 - __builtin_clzll(bytes);
  const int shift = std::max(msb - 3, 8);  // 2^8 = kAlignment
  const uint64_t step = uint64_t{1} << shift;
  if (bytes > std::numeric_limits<uint64_t>::max() - (step - 1)) {
    return std::numeric_limits<uint64_t>::max() / step * step;  // cannot fit anywhere anyway
  }
  return (bytes + step - 1) / step * step;
}

void Arena::InsertFree(uint64_t offset, uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void Arena::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

absl::StatusOr<uint64_t> Arena::Allocate(uint64_t bytes) {
  const uint64_t size = SizeClass(bytes);
  absl::MutexLock lock(&mu_);
  auto fit = free_by_size_.lower_bound({size, 0});
  if (fit == free_by_size_.end()) {
    ++stats_.failures;
    const uint64_t largest = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
    return absl::ResourceExhaustedError(absl::StrCat(
        name_, ": memory pool exhausted: ", FormatBytes(bytes), " requested (size class ",
        FormatBytes(size), "), ", FormatBytes(capacity_ - stats_.used), " free of ",
        FormatBytes(capacity_), " reserved, largest free block ", FormatBytes(largest)));
  }
  const uint64_t offset = fit->second;
  const uint64_t free_size = fit->first;
  EraseFree(free_by_offset_.find(offset));
  if (free_size > size) InsertFree(offset + size, free_size - size);
  live_.emplace(offset, size);
  stats_.used += size;
  stats_.peak_used = std::max(stats_.peak_used, stats_.used);
  ++stats_.live_blocks;
  ++stats_.allocations;
  return offset;
}

bool Arena::Free(uint64_t offset) {
  absl::MutexLock lock(&mu_);
  auto live = live_.find(offset);
  if (live == live_.end()) return false;
  uint64_t begin = offset;
  uint64_t size = live->second;
  live_.erase(live);
  stats_.used -= size;
  --stats_.live_blocks;
  // Coalesce with the free range after, then the one before.
  auto next = free_by_offset_.find(begin + size);
  if (next != free_by_offset_.end()) {
    size += next->second;
    EraseFree(next);
  }
  auto after = free_by_offset_.lower_bound(begin);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      size += prev->second;
      EraseFree(prev);
    }
  }
  InsertFree(begin, size);
  return true;
}

ArenaStats Arena::stats() const {
  absl::MutexLock lock(&mu_);
  ArenaStats s = stats_;
  s.largest_free = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  return s;
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 6) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", v, kUnits[unit]);
}

}  // namespace attnd::server::engine
