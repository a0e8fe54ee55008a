// A DeviceRegionOpener for tests without a GPU: each distinct handle names one "allocation" of
// host memory, shared by the regions registered on it (as the GPU opener shares IPC mappings) and
// released with the last of them. Kernels run on the CPU can read and write it in place.
//   auto opener = std::make_shared<FakeDeviceOpener>(1 << 20);
//   options.device_opener = opener;
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/regions/registry.h"

namespace attnd::server::testing {

class FakeDeviceOpener : public regions::DeviceRegionOpener {
 public:
  static constexpr const char* kUuid = "GPU-00000000-0000-0000-0000-000000000003";
  static constexpr int kOrdinal = 3;

  explicit FakeDeviceOpener(size_t allocation_bytes) : allocation_bytes_(allocation_bytes) {}

  class Mapping : public regions::DeviceMapping {
   public:
    Mapping(FakeDeviceOpener* owner, size_t bytes)
        : owner_(owner), memory_(bytes + 256, 0), uuid_(kUuid) {}
    ~Mapping() override { owner_->closed.fetch_add(1); }
    char* base() const override {
      // 256-byte aligned, like device allocations.
      const auto p = reinterpret_cast<uintptr_t>(memory_.data());
      return reinterpret_cast<char*>((p + 255) / 256 * 256);
    }
    uint64_t size() const override { return memory_.size() - 256; }
    int device() const override { return kOrdinal; }
    const std::string& device_uuid() const override { return uuid_; }

   private:
    FakeDeviceOpener* owner_;
    std::vector<char> memory_;
    std::string uuid_;
  };

  absl::StatusOr<std::shared_ptr<regions::DeviceMapping>> Open(
      const regions::DeviceRegionSpec& spec) override ABSL_LOCKS_EXCLUDED(mu_) {
    if (spec.offset + spec.byte_size > allocation_bytes_) {
      return absl::InvalidArgumentError("device region: past the end of the allocation");
    }
    absl::MutexLock lock(&mu_);
    std::shared_ptr<regions::DeviceMapping> m = open_[spec.raw_handle].lock();
    if (m == nullptr) {
      m = std::make_shared<Mapping>(this, allocation_bytes_);
      open_[spec.raw_handle] = m;
      opened.fetch_add(1);
    }
    return m;
  }

  std::atomic<int> opened{0};
  std::atomic<int> closed{0};

 private:
  const size_t allocation_bytes_;
  absl::Mutex mu_;
  std::map<std::string, std::weak_ptr<regions::DeviceMapping>> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnd::server::testing
