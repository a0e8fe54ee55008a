#include "server/engine/memory_pool.h"

#include <utility>

namespace attnd::server::engine {

PoolBlock& PoolBlock::operator=(PoolBlock&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::exchange(other.pool_, nullptr);
    offset_ = std::exchange(other.offset_, 0);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void PoolBlock::Reset() {
  if (pool_ != nullptr) pool_->arena_.Free(offset_);
  pool_ = nullptr;
  offset_ = 0;
  data_ = nullptr;
  size_ = 0;
}

MemoryPool::MemoryPool(std::string name, char* base, uint64_t capacity,
                       std::function<void(char*)> release)
    : base_(base),
      arena_(base != nullptr ? capacity : 0, std::move(name)),
      release_(std::move(release)) {}

MemoryPool::~MemoryPool() {
  if (release_ && base_ != nullptr) release_(base_);
}

absl::StatusOr<PoolBlock> MemoryPool::Allocate(uint64_t bytes) {
  absl::StatusOr<uint64_t> offset = arena_.Allocate(bytes);
  if (!offset.ok()) return offset.status();
  PoolBlock block;
  block.pool_ = this;
  block.offset_ = *offset;
  block.data_ = base_ + *offset;
  block.size_ = bytes;
  return block;
}

}  // namespace attnd::server::engine
