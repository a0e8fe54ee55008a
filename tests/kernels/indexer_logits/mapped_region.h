// Anonymous memory for the indexer tests' address-space cases: reserved, not committed (only
// the pages touched cost memory, so views whose offsets pass 2^31 elements are cheap), with
// pages that can be made inaccessible so any read of them faults (proof of "never read").
//   MappedRegion r(3 * MappedRegion::PageSize());  r.Protect(2);  // page 2 now faults
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

namespace attnd::testing {

class MappedRegion {
 public:
  explicit MappedRegion(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~MappedRegion() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  static int64_t PageSize() { return sysconf(_SC_PAGESIZE); }
  uint8_t* data() const { return data_; }  // null when the mapping failed
  uint8_t* page(int64_t i) const { return data_ + i * PageSize(); }
  // Page i becomes inaccessible: touching it raises SIGSEGV. False on failure.
  bool Protect(int64_t i) { return mprotect(page(i), PageSize(), PROT_NONE) == 0; }

 private:
  size_t bytes_;
  uint8_t* data_;
};

}  // namespace attnd::testing
