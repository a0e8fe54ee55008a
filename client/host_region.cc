#include "client/host_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attnd::client {
namespace {

constexpr uint64_t kAlign = 64;

std::string UniqueKey(const std::string& prefix) {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const uint64_t salt = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return absl::StrFormat("%s-%d-%d-%016x", prefix, getpid(), counter.fetch_add(1), salt);
}

absl::Status Errno(const std::string& what) {
  const int e = errno;
  const std::string msg = absl::StrCat(what, ": ", std::strerror(e));
  if (e == ENOMEM || e == ENOSPC || e == EMFILE || e == ENFILE) {
    return absl::ResourceExhaustedError(msg);
  }
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// The layout Allocate gives: dense, or dim 0's stride padded to row_stride elements.
kernels::Tensor Layout(kernels::DType dtype, const std::vector<int64_t>& shape,
                       int64_t row_stride) {
  kernels::Tensor t =
      kernels::MakeTensor(nullptr, dtype, shape.data(), static_cast<int>(shape.size()));
  if (row_stride > 0 && t.rank > 0 && row_stride > t.strides[0]) t.strides[0] = row_stride;
  return t;
}

}  // namespace

uint64_t RegionBytesFor(kernels::DType dtype, const std::vector<int64_t>& shape,
                        int64_t row_stride) {
  if (shape.empty() || shape.size() > kernels::kMaxRank) return 0;
  absl::StatusOr<uint64_t> span = SpanBytesOf(Layout(dtype, shape, row_stride), "tensor");
  if (!span.ok()) return 0;
  return (*span + kAlign - 1) / kAlign * kAlign;
}

absl::StatusOr<std::unique_ptr<HostRegion>> HostRegion::Create(Client* client,
                                                               HostRegionOptions options) {
  if (client == nullptr) return absl::InvalidArgumentError("HostRegion: no client");
  if (options.bytes == 0) return absl::InvalidArgumentError("HostRegion: bytes must be > 0");
  std::unique_ptr<HostRegion> r(new HostRegion());
  r->client_ = client;
  r->key_ = UniqueKey(options.key_prefix);
  r->name_ = options.name.empty() ? r->key_.substr(1) : options.name;
  r->lease_id_ = options.lease_id;
  r->timeout_ = options.timeout;
  const int fd = shm_open(r->key_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
                          static_cast<mode_t>(options.mode));
  if (fd < 0) return Errno(absl::StrCat("shm_open('", r->key_, "')"));
  r->linked_ = true;  // from here on the destructor unlinks it
  if (ftruncate(fd, static_cast<off_t>(options.bytes)) != 0) {
    absl::Status s = Errno(absl::StrCat("ftruncate('", r->key_, "', ", options.bytes, ")"));
    close(fd);
    return s;
  }
  void* p = mmap(nullptr, options.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  absl::Status map_status =
      p == MAP_FAILED ? Errno(absl::StrCat("mmap('", r->key_, "')")) : absl::OkStatus();
  close(fd);
  if (!map_status.ok()) return map_status;
  r->data_ = static_cast<char*>(p);
  r->size_ = options.bytes;

  v1::RegisterHostRegionRequest request;
  request.set_name(r->name_);
  request.set_key(r->key_);
  request.set_offset(0);
  request.set_byte_size(options.bytes);
  request.set_lease_id(options.lease_id);
  if (absl::Status s = client->RegisterHostRegion(request, options.timeout); !s.ok()) return s;
  r->registered_ = true;
  if (options.unlink_after_register) {
    shm_unlink(r->key_.c_str());
    r->linked_ = false;
  }
  client->regions().Add(r->name_, r->data_, r->size_);
  return r;
}

HostRegion::~HostRegion() { Close().IgnoreError(); }

absl::Status HostRegion::Close() {
  absl::Status status;
  if (registered_) {
    client_->regions().Remove(data_);
    absl::StatusOr<std::vector<std::string>> removed =
        client_->UnregisterRegion(name_, lease_id_, timeout_);
    // A leased region is gone already when its Session ended.
    if (!removed.ok() && !(absl::IsNotFound(removed.status()) && !lease_id_.empty())) {
      status = removed.status();
    }
    registered_ = false;
  }
  if (data_ != nullptr) {
    munmap(data_, size_);
    data_ = nullptr;
  }
  if (linked_) {
    shm_unlink(key_.c_str());
    linked_ = false;
  }
  return status;
}

absl::StatusOr<kernels::Tensor> HostRegion::Allocate(kernels::DType dtype,
                                                     const std::vector<int64_t>& shape,
                                                     int64_t row_stride) {
  if (data_ == nullptr) return absl::FailedPreconditionError("HostRegion: closed");
  if (shape.empty() || shape.size() > kernels::kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat("HostRegion: rank ", shape.size()));
  }
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("HostRegion: dim ", d));
  }
  kernels::Tensor t = Layout(dtype, shape, row_stride);
  absl::StatusOr<uint64_t> span = SpanBytesOf(t, "HostRegion tensor");
  if (!span.ok()) return span.status();
  const uint64_t start = (used_ + kAlign - 1) / kAlign * kAlign;
  if (start > size_ || *span > size_ - start) {
    return absl::ResourceExhaustedError(absl::StrCat("HostRegion '", name_, "': ", *span,
                                                     " bytes do not fit (", size_ - used_, " of ",
                                                     size_, " left)"));
  }
  t.data = data_ + start;
  used_ = start + *span;
  return t;
}

bool HostRegion::Contains(const void* p, uint64_t bytes) const {
  const auto* c = static_cast<const char*>(p);
  if (data_ == nullptr || c < data_ || c > data_ + size_) return false;
  return bytes <= static_cast<uint64_t>(data_ + size_ - c);
}

absl::StatusOr<v1::Tensor> HostRegion::Slice(const kernels::Tensor& t) const {
  absl::StatusOr<uint64_t> span = SpanBytesOf(t, "tensor");
  if (!span.ok()) return span.status();
  if (!Contains(t.data, *span)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor is not inside region '", name_, "'"));
  }
  v1::Tensor out;
  EncodeRegion(t, name_, static_cast<uint64_t>(static_cast<const char*>(t.data) - data_), &out);
  return out;
}

}  // namespace attnd::client
