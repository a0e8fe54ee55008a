// A device region: GPU memory this process allocated (cudaMalloc / hipMalloc), registered with
// attnd through its IPC handle. Tensors whose data lies inside it travel as RegionSlices: the
// daemon reads inputs and writes outputs in place on the device, nothing is copied and nothing
// crosses the host. The client never touches the memory (it needs no GPU runtime): the caller
// takes the handle (cudaIpcGetMemHandle on the allocation's base pointer) and names the device
// by the UUID GetInfo reports. Destruction unregisters the region.
//   cudaIpcMemHandle_t h;  cudaIpcGetMemHandle(&h, base);
//   DeviceRegionOptions o;
//   o.raw_handle.assign(reinterpret_cast<const char*>(&h), sizeof h);
//   o.device_uuid = info.devices(0).uuid();  o.allocation = base;  o.bytes = size;
//   ATTND_ASSIGN_OR_RETURN(std::unique_ptr<DeviceRegion> r, DeviceRegion::Register(client, o));
//   p.kv = kernels::Tensor{...data = device pointer inside [base, base + size)...};
//   client->SparseMla(p);  // kv and out are sent as {region, offset}
// A device pointer that lies in no registered region cannot be sent (the client would read it
// as host memory): every device tensor of a call must lie in a DeviceRegion.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace attnd::client {

struct DeviceRegionOptions {
  // cudaIpcMemHandle_t / hipIpcMemHandle_t bytes of the allocation (exactly 64).
  std::string raw_handle;
  // The device the allocation is on, as GetInfo names it ("GPU-…").
  std::string device_uuid;
  // The allocation's base pointer in this process: the address the handle names.
  const void* allocation = nullptr;
  // The region: `bytes` from `offset` past the allocation's base (within the allocation).
  uint64_t offset = 0;
  uint64_t bytes = 0;
  std::string name;      // region name; empty: "attnd-cpp-device-<pid>-<n>"
  std::string lease_id;  // tie the region to a Session's lease (Session::lease_id())
  absl::Duration timeout = kDefaultAdminTimeout;  // of the register/unregister RPCs
};

class DeviceRegion {
 public:
  // Registers; on failure nothing is left registered. INVALID_ARGUMENT for options that cannot
  // name a region (a handle of another size, no allocation, no bytes, a range that wraps);
  // otherwise the daemon's status (FAILED_PRECONDITION from a daemon without a GPU backend).
  static absl::StatusOr<std::unique_ptr<DeviceRegion>> Register(Client* client,
                                                                DeviceRegionOptions options);
  ~DeviceRegion();  // Close(), errors ignored
  DeviceRegion(const DeviceRegion&) = delete;
  DeviceRegion& operator=(const DeviceRegion&) = delete;

  // Unregisters (the daemon waits for its in-flight calls on the region). Idempotent; the memory
  // stays the caller's to free afterwards.
  absl::Status Close();

  const std::string& name() const { return name_; }
  // The region's first byte in this process's address space (allocation + offset).
  const void* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Whether [p, p + bytes) lies inside the region.
  bool Contains(const void* p, uint64_t bytes) const;

 private:
  DeviceRegion() = default;

  Client* client_ = nullptr;
  std::string name_;
  std::string lease_id_;
  absl::Duration timeout_;
  const char* data_ = nullptr;
  uint64_t size_ = 0;
  bool registered_ = false;
};

}  // namespace attnd::client
