// A memory pool: one range reserved at start (device memory from the GPU runtime, pinned host
// memory for staging, or any buffer in tests) handed out in size-classed blocks by an Arena.
// Blocks are RAII handles that return themselves on destruction. The pool never grows: its
// reserved size is the hard limit (RESOURCE_EXHAUSTED past it).
//   MemoryPool pool("GPU-…", base, bytes, [](char* p) { gpu::Free(p); });
//   ATTND_ASSIGN_OR_RETURN(PoolBlock block, pool.Allocate(n));  // block.data() ...
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "server/engine/arena.h"

namespace attnd::server::engine {

class MemoryPool;

// A block of a MemoryPool; returned to the pool when destroyed. Movable, not copyable.
class PoolBlock {
 public:
  PoolBlock() = default;
  ~PoolBlock() { Reset(); }
  PoolBlock(PoolBlock&& other) noexcept { *this = std::move(other); }
  PoolBlock& operator=(PoolBlock&& other) noexcept;
  PoolBlock(const PoolBlock&) = delete;
  PoolBlock& operator=(const PoolBlock&) = delete;

  char* data() const { return data_; }
  uint64_t size() const { return size_; }  // the requested bytes (the class may be larger)
  explicit operator bool() const { return pool_ != nullptr; }
  void Reset();  // returns the block now

 private:
  friend class MemoryPool;
  MemoryPool* pool_ = nullptr;
  uint64_t offset_ = 0;
  char* data_ = nullptr;
  uint64_t size_ = 0;
};

class MemoryPool {
 public:
  // Manages [base, base + capacity); `release` (may be empty) frees `base` when the pool goes.
  // `name` labels messages and metrics (a device UUID, "pinned-staging").
  MemoryPool(std::string name, char* base, uint64_t capacity, std::function<void(char*)> release);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // A block of at least `bytes` bytes, Arena::kAlignment aligned. RESOURCE_EXHAUSTED when the
  // pool has no free range that fits (the message names the pool and its figures). Thread-safe.
  absl::StatusOr<PoolBlock> Allocate(uint64_t bytes);

  ArenaStats stats() const { return arena_.stats(); }
  const std::string& name() const { return arena_.name(); }
  char* base() const { return base_; }

 private:
  friend class PoolBlock;
  char* const base_;
  Arena arena_;
  std::function<void(char*)> release_;
};

}  // namespace attnd::server::engine
