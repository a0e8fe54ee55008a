// A large anonymous mapping backed only where it is written (MAP_NORESERVE), for tests whose
// strided views put elements past 2^31 without allocating gigabytes.
//   SparseBuffer buf(int64_t{5} << 30);
//   if (buf.data() == nullptr) GTEST_SKIP() << "no 5 GiB of address space";
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace attnd::testing {

class SparseBuffer {
 public:
  explicit SparseBuffer(int64_t bytes) : bytes_(static_cast<size_t>(bytes)) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : p;
  }
  ~SparseBuffer() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  SparseBuffer(const SparseBuffer&) = delete;
  SparseBuffer& operator=(const SparseBuffer&) = delete;

  void* data() const { return data_; }  // null when the mapping failed

 private:
  size_t bytes_;
  void* data_ = nullptr;
};

}  // namespace attnd::testing
