#include "server/regions/host_mapping.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace attnd::server::regions {
namespace {

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string msg = absl::StrCat(what, ": ", strerror(err));
  switch (err) {
    case ENOENT: return absl::NotFoundError(msg);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(msg);
    case EINVAL:
    case ENAMETOOLONG: return absl::InvalidArgumentError(msg);
    case EMFILE:
    case ENFILE:
    case ENOMEM: return absl::ResourceExhaustedError(msg);
    default: return absl::InternalError(msg);
  }
}

}  // namespace

absl::Status CheckRange(uint64_t offset, uint64_t byte_size, uint64_t object_size,
                        const std::string& what) {
  if (byte_size == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": byte_size is 0"));
  uint64_t end;
  if (__builtin_add_overflow(offset, byte_size, &end)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": offset ", offset, " + byte_size ", byte_size, " overflows 64 bits"));
  }
  if (offset >= object_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": offset ", offset, " is >= the size ", object_size));
  }
  if (byte_size > object_size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": offset ", offset, " + byte_size ",
                                                   byte_size, " = ", end, " is past the size ",
                                                   object_size));
  }
  return absl::OkStatus();
}

HostMapping::~HostMapping() { Reset(); }

HostMapping::HostMapping(HostMapping&& other) noexcept { *this = std::move(other); }

HostMapping& HostMapping::operator=(HostMapping&& other) noexcept {
  if (this != &other) {
    Reset();
    std::swap(map_base_, other.map_base_);
    std::swap(map_len_, other.map_len_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(guard_, other.guard_);
  }
  return *this;
}

bool HostMapping::Probe() const {
  if (data_ != nullptr && size_ > 0) {
    // A volatile load the compiler keeps; its value is of no interest.
    const volatile char* last = data_ + (size_ - 1);
    static_cast<void>(*last);
  }
  return guard_.faulted();
}

void HostMapping::Reset() {
  guard_.Reset();
  if (map_base_ != nullptr) munmap(map_base_, map_len_);
  map_base_ = nullptr;
  map_len_ = 0;
  data_ = nullptr;
  size_ = 0;
}

ShmFile::~ShmFile() {
  if (fd_ >= 0) close(fd_);
}

ShmFile::ShmFile(ShmFile&& other) noexcept { *this = std::move(other); }

ShmFile& ShmFile::operator=(ShmFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    key_ = std::move(other.key_);
    st_ = other.st_;
  }
  return *this;
}

absl::StatusOr<ShmFile> ShmFile::Open(const std::string& key, std::optional<uid_t> owner_uid) {
  const std::string what = absl::StrCat("shm object '", key, "'");
  // The object's path under /dev/shm (where glibc's shm_open looks), opened without following a
  // symlink (a client could plant one to a file it cannot read) and without blocking on a FIFO.
  const std::string path = absl::StrCat("/dev/shm", key);
  ShmFile f;
  f.key_ = key;
  f.fd_ = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (f.fd_ < 0) {
    const int err = errno;
    if (err == ELOOP) return absl::InvalidArgumentError(absl::StrCat(what, " is a symlink"));
    return ErrnoStatus(err, absl::StrCat("cannot open ", what));
  }
  if (fstat(f.fd_, &f.st_) != 0) return ErrnoStatus(errno, absl::StrCat("cannot stat ", what));
  if (!S_ISREG(f.st_.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a regular shm object"));
  }
  if (owner_uid.has_value() && f.st_.st_uid != *owner_uid) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " does not belong to the caller (uid ", *owner_uid,
                     "): a client registers only shm objects it owns (docs/SERVICE.md \"Trust "
                     "model\")"));
  }
  return f;
}

absl::StatusOr<HostMapping> HostMapping::Map(const std::string& key, uint64_t offset,
                                             uint64_t byte_size) {
  absl::StatusOr<ShmFile> file = ShmFile::Open(key, std::nullopt);
  if (!file.ok()) return file.status();
  return Map(*file, offset, byte_size);
}

absl::StatusOr<HostMapping> HostMapping::Map(const ShmFile& file, uint64_t offset,
                                             uint64_t byte_size) {
  const std::string what = absl::StrCat("shm object '", file.key(), "'");
  // Range checks that need no syscall first (zero size, 2^64 overflow, off_t range).
  if (byte_size == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": byte_size is 0"));
  uint64_t end;
  if (__builtin_add_overflow(offset, byte_size, &end) ||
      end > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": offset ", offset, " + byte_size ", byte_size, " overflows 64 bits"));
  }
  absl::Status range =
      CheckRange(offset, byte_size, static_cast<uint64_t>(file.stat().st_size), what);
  if (!range.ok()) return range;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t page_offset = offset - offset % page;
  const uint64_t delta = offset - page_offset;
  HostMapping m;
  m.map_len_ = static_cast<size_t>(delta + byte_size);
  void* base = mmap(nullptr, m.map_len_, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd(),
                    static_cast<off_t>(page_offset));
  if (base == MAP_FAILED) {
    const int err = errno;
    m.map_len_ = 0;
    return ErrnoStatus(err, absl::StrCat("cannot map ", what));
  }
  m.map_base_ = base;
  m.data_ = static_cast<char*>(base) + delta;
  m.size_ = byte_size;
  absl::StatusOr<GuardedRange> guard = GuardedRange::Add(base, m.map_len_);
  if (!guard.ok()) return guard.status();  // m unmaps itself
  m.guard_ = *std::move(guard);
  return m;
}

}  // namespace attnd::server::regions
