#include "client/device_region.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace attnd::client {

absl::StatusOr<std::unique_ptr<DeviceRegion>> DeviceRegion::Register(Client* client,
                                                                     DeviceRegionOptions options) {
  if (client == nullptr) return absl::InvalidArgumentError("DeviceRegion: no client");
  if (options.raw_handle.size() != 64) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceRegion: raw_handle is ",
                                                   options.raw_handle.size(),
                                                   " bytes, want the 64 of an IPC handle"));
  }
  if (options.allocation == nullptr) {
    return absl::InvalidArgumentError("DeviceRegion: no allocation pointer");
  }
  if (options.bytes == 0) return absl::InvalidArgumentError("DeviceRegion: bytes is 0");
  const uintptr_t base = reinterpret_cast<uintptr_t>(options.allocation);
  if (options.offset > UINTPTR_MAX - base || options.bytes > UINTPTR_MAX - base - options.offset) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceRegion: offset ", options.offset,
                                                   " + bytes ", options.bytes,
                                                   " wraps the address space"));
  }
  if (options.name.empty()) {
    static std::atomic<uint64_t> counter{0};
    options.name = absl::StrCat("attnd-cpp-device-", getpid(), "-", counter.fetch_add(1));
  }
  v1::RegisterDeviceRegionRequest request;
  request.set_name(options.name);
  request.set_raw_handle(options.raw_handle);
  request.set_device_uuid(options.device_uuid);
  request.set_offset(options.offset);
  request.set_byte_size(options.bytes);
  request.set_lease_id(options.lease_id);
  if (absl::Status s = client->RegisterDeviceRegion(request, options.timeout); !s.ok()) return s;

  std::unique_ptr<DeviceRegion> r(new DeviceRegion());
  r->client_ = client;
  r->name_ = std::move(options.name);
  r->lease_id_ = std::move(options.lease_id);
  r->timeout_ = options.timeout;
  r->data_ = static_cast<const char*>(options.allocation) + options.offset;
  r->size_ = options.bytes;
  r->registered_ = true;
  client->regions().Add(r->name_, r->data_, r->size_);
  return r;
}

DeviceRegion::~DeviceRegion() { Close().IgnoreError(); }

absl::Status DeviceRegion::Close() {
  if (!registered_) return absl::OkStatus();
  registered_ = false;
  client_->regions().Remove(data_);
  absl::StatusOr<std::vector<std::string>> removed =
      client_->UnregisterRegion(name_, lease_id_, timeout_);
  // A leased region is gone already when its Session ended.
  if (!removed.ok() && !(absl::IsNotFound(removed.status()) && !lease_id_.empty())) {
    return removed.status();
  }
  return absl::OkStatus();
}

bool DeviceRegion::Contains(const void* p, uint64_t bytes) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data_);
  const uintptr_t q = reinterpret_cast<uintptr_t>(p);
  return data_ != nullptr && q >= begin && q - begin <= size_ && bytes <= size_ - (q - begin);
}

}  // namespace attnd::client
