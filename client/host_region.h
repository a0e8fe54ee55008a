// A host region: a POSIX shared-memory object this client creates (unique key), sizes, maps and
// registers with attnd, then carves tensors out of. Tensors allocated in it travel as
// RegionSlices: inputs are read and outputs written in place by the daemon (zero bytes copied).
// Destruction unregisters the region, unmaps it and unlinks the object.
//   HostRegionOptions o;  o.bytes = 64 << 20;
//   ATTND_ASSIGN_OR_RETURN(std::unique_ptr<HostRegion> region, HostRegion::Create(client, o));
//   ATTND_ASSIGN_OR_RETURN(kernels::Tensor kv, region->Allocate(DType::kBF16, {s, 576}));
//   p.kv = kv;  client->SparseMla(p);   // kv is sent as {region, offset}, not as bytes
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnd/v1/attention.pb.h"
#include "client/client.h"
#include "kernels/common/tensor.h"

namespace attnd::client {

struct HostRegionOptions {
  uint64_t bytes = 0;                        // size of the object and the region (> 0)
  std::string name;                          // region name; empty: derived from the key
  std::string key_prefix = "/attnd-client";  // key = prefix + "-<pid>-<n>-<random>"
  std::string lease_id;  // tie the region to a Session's lease (Session::lease_id())
  // Unlink the shm object as soon as the daemon has mapped it: nothing is left in /dev/shm even
  // if this process is killed. false keeps the key visible until destruction.
  bool unlink_after_register = true;
  int mode = 0600;  // of the shm object (0660 when the daemon runs as another user)
  absl::Duration timeout = kDefaultAdminTimeout;  // of the register/unregister RPCs
};

// Not thread-safe for Allocate/Reset; the mapped memory may be used from any thread.
class HostRegion {
 public:
  // Creates, maps and registers; on any failure nothing is left behind (no object, no region).
  static absl::StatusOr<std::unique_ptr<HostRegion>> Create(Client* client,
                                                            HostRegionOptions options);
  ~HostRegion();  // Close(), errors ignored
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;

  // Unregisters (waits for the daemon's in-flight requests on it), unmaps and unlinks. Idempotent.
  absl::Status Close();

  // A tensor carved from the region, 64-byte aligned; dense, or with dim 0's stride padded to
  // `row_stride` elements (0: dense). RESOURCE_EXHAUSTED when the region is full.
  absl::StatusOr<kernels::Tensor> Allocate(kernels::DType dtype, const std::vector<int64_t>& shape,
                                           int64_t row_stride = 0);
  // Forgets every allocation (the memory is reused by the next Allocate calls).
  void Reset() { used_ = 0; }
  uint64_t used() const { return used_; }

  // The RegionSlice tensor for a view inside this region; INVALID_ARGUMENT when it is not.
  absl::StatusOr<v1::Tensor> Slice(const kernels::Tensor& t) const;
  bool Contains(const void* p, uint64_t bytes) const;

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  HostRegion() = default;

  Client* client_ = nullptr;
  std::string name_;
  std::string key_;
  std::string lease_id_;
  absl::Duration timeout_;
  char* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t used_ = 0;
  bool registered_ = false;
  bool linked_ = false;
};

// Bytes a tensor of this layout takes in a region (its span, rounded up to the 64-byte
// alignment Allocate uses); for sizing a region before allocating.
uint64_t RegionBytesFor(kernels::DType dtype, const std::vector<int64_t>& shape,
                        int64_t row_stride = 0);

}  // namespace attnd::client
