// Test helper: a POSIX shm object with a unique name, unlinked when the helper goes away.
//   ScopedShm shm(4096);  // shm.key() == "/attnd-test-<pid>-<n>"
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace attnd::testing {

class ScopedShm {
 public:
  explicit ScopedShm(int64_t size) {
    static std::atomic<int> counter{0};
    // A name of this pid may be left over from an earlier process that died holding it (pids are
    // reused): take the next name instead of failing on it.
    int fd = -1;
    for (int attempt = 0; attempt < 1000 && fd < 0; ++attempt) {
      key_ = absl::StrCat("/attnd-test-", getpid(), "-", counter.fetch_add(1));
      fd = shm_open(key_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
      if (fd < 0 && errno != EEXIST) break;
    }
    ok_ = fd >= 0 && ftruncate(fd, size) == 0;
    if (ok_) {
      void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ok_ = p != MAP_FAILED;
      if (ok_) {
        data_ = static_cast<char*>(p);
        size_ = size;
      }
    }
    if (fd >= 0) close(fd);
  }
  ~ScopedShm() {
    if (data_ != nullptr) munmap(data_, size_);
    shm_unlink(key_.c_str());
  }
  ScopedShm(const ScopedShm&) = delete;
  ScopedShm& operator=(const ScopedShm&) = delete;

  bool ok() const { return ok_; }
  const std::string& key() const { return key_; }
  char* data() const { return data_; }  // the client's own mapping of the whole object
  int64_t size() const { return size_; }

 private:
  std::string key_;
  bool ok_ = false;
  char* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace attnd::testing
