// A size-classed sub-allocator over one reserved range of bytes (offsets [0, capacity); the owner
// adds its base pointer): device memory pools and the pinned staging pool (docs/SERVICE.md
// "Memory pools"). Requests round up to a size class, blocks come best-fit from coalescing free
// ranges, and the reserved capacity is a hard limit: a request that does not fit is
// RESOURCE_EXHAUSTED, never a crash.
//   Arena arena(8ull << 30);
//   ATTND_ASSIGN_OR_RETURN(uint64_t offset, arena.Allocate(bytes));  ...  arena.Free(offset);
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace attnd::server::engine {

struct ArenaStats {
  uint64_t reserved = 0;      // capacity
  uint64_t used = 0;          // bytes of live blocks (rounded to their size classes)
  uint64_t peak_used = 0;     // high-water mark of `used`
  uint64_t largest_free = 0;  // the largest block a request could get now
  uint64_t live_blocks = 0;
  uint64_t allocations = 0;  // successful Allocate calls
  uint64_t failures = 0;     // RESOURCE_EXHAUSTED answers
};

class Arena {
 public:
  static constexpr uint64_t kAlignment = 256;  // every block starts on a multiple of this
  static constexpr int kClassesPerOctave = 8;  // size classes waste at most 1/8

  // `capacity` is rounded down to kAlignment. `name` appears in error messages ("GPU-…").
  explicit Arena(uint64_t capacity, std::string name = "pool");
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // The size class of a request: `bytes` (0 counts as 1) rounded up to kAlignment and to one of
  // kClassesPerOctave steps per power of two. Pure.
  static uint64_t SizeClass(uint64_t bytes);

  // The offset of a fresh block of SizeClass(bytes) bytes: the smallest free range that fits
  // (lowest offset among equals), so a block freed and asked for again comes back at the same
  // offset. RESOURCE_EXHAUSTED naming the request, the free bytes and the largest free block when
  // nothing fits. Thread-safe.
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Returns a block from Allocate (coalescing it with free neighbours). An offset that is not a
  // live block is ignored (and reported false). Thread-safe.
  bool Free(uint64_t offset) ABSL_LOCKS_EXCLUDED(mu_);

  ArenaStats stats() const ABSL_LOCKS_EXCLUDED(mu_);  // thread-safe snapshot
  const std::string& name() const { return name_; }

 private:
  void InsertFree(uint64_t offset, uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t capacity_;
  const std::string name_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, uint64_t> free_by_offset_ ABSL_GUARDED_BY(mu_);           // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_ ABSL_GUARDED_BY(mu_);  // (size, offset)
  std::unordered_map<uint64_t, uint64_t> live_ ABSL_GUARDED_BY(mu_);           // offset -> size
  ArenaStats stats_ ABSL_GUARDED_BY(mu_);
};

// "1.50 GiB", "640 KiB", "12 B": for messages and logs.
std::string FormatBytes(uint64_t bytes);

}  // namespace attnd::server::engine
