// A mapping of part of a POSIX shm object into the daemon: opened (ShmFile: no symlinks, a regular
// file, optionally owned by a given uid), size-checked against the object (fstat), mmapped once
// and the descriptor closed at once, so regions never hold fds. The
// mapping is guarded (sigbus_guard.h): if its object is truncated later, accesses past the new end
// read and write zero pages instead of killing the daemon, and faulted() turns true.
//   ATTND_ASSIGN_OR_RETURN(HostMapping m, HostMapping::Map("/my-shm", 0, 1 << 20));
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/regions/sigbus_guard.h"

namespace attnd::server::regions {

// Checks that [offset, offset + byte_size) is a non-empty range inside an object of
// `object_size` bytes without overflowing 64 bits; INVALID_ARGUMENT naming the values.
absl::Status CheckRange(uint64_t offset, uint64_t byte_size, uint64_t object_size,
                        const std::string& what);

// An open POSIX shm object, checked: a regular file and, when `owner_uid` is given, owned by that
// uid. Closes its descriptor when destroyed. Movable.
class ShmFile {
 public:
  // Opens shm object `key` (already validated) read-write without following a symlink. NOT_FOUND
  // when it does not exist, PERMISSION_DENIED when the daemon cannot open it read-write or it
  // belongs to a uid other than `owner_uid`, INVALID_ARGUMENT when it is not a regular file.
  static absl::StatusOr<ShmFile> Open(const std::string& key, std::optional<uid_t> owner_uid);
  ShmFile() = default;
  ~ShmFile();
  ShmFile(ShmFile&& other) noexcept;
  ShmFile& operator=(ShmFile&& other) noexcept;
  ShmFile(const ShmFile&) = delete;
  ShmFile& operator=(const ShmFile&) = delete;

  int fd() const { return fd_; }
  const std::string& key() const { return key_; }
  const struct stat& stat() const { return st_; }

 private:
  int fd_ = -1;
  std::string key_;
  struct stat st_ = {};
};

class HostMapping {
 public:
  HostMapping() = default;
  ~HostMapping();
  HostMapping(HostMapping&& other) noexcept;
  HostMapping& operator=(HostMapping&& other) noexcept;
  HostMapping(const HostMapping&) = delete;
  HostMapping& operator=(const HostMapping&) = delete;

  // Maps bytes [offset, offset + byte_size) of shm object `key` (already validated) read-write.
  // NOT_FOUND when the object does not exist, PERMISSION_DENIED when it cannot be opened
  // read-write, INVALID_ARGUMENT when the range is empty or past the object's end.
  static absl::StatusOr<HostMapping> Map(const std::string& key, uint64_t offset,
                                         uint64_t byte_size);
  // The same for an object opened (and checked) already.
  static absl::StatusOr<HostMapping> Map(const ShmFile& file, uint64_t offset, uint64_t byte_size);

  char* data() const { return data_; }  // the byte at `offset` of the object
  uint64_t size() const { return size_; }
  // The whole page-aligned mapping (covers [data(), data() + size())).
  void* map_base() const { return map_base_; }
  size_t map_len() const { return map_len_; }
  // Whether the mapping lost pages because its object was truncated after Map (an access faulted
  // and was given zero pages instead). Sticky; thread-safe.
  bool faulted() const { return guard_.faulted(); }
  // Reads the mapping's last byte, so that a truncation nothing has touched yet is seen: a pinned
  // mapping's pages stay alive for the GPU's copies after the object shrinks, but the CPU access
  // faults (the guard gives a zero page and faulted() turns true). Returns faulted().
  bool Probe() const;
  void Reset();  // unmaps now

 private:
  GuardedRange guard_;
  void* map_base_ = nullptr;
  size_t map_len_ = 0;
  char* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace attnd::server::regions
