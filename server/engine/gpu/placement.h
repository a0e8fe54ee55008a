// Where one call's tensors live on its GPU (docs/SERVICE.md "GPU backend"): device-region tensors
// in place (zero bytes copied); inline and host-region tensors in blocks of the device pool, filled
// by DMA (inline bytes through the pinned staging pool, host regions straight from their registered
// pages). Inline outputs are zeroed first (elements an op leaves untouched read 0, as on the CPU);
// host-region outputs are copied in first so that such elements keep their bytes. After the op the
// host-resident outputs go back (D2H), and the device-region index tensors the work count reads are
// read back. Not thread-safe: one per call.
//   CallPlacement placement(&device, staging, stream);
//   ATTND_RETURN_IF_ERROR(placement.Place(call.tensors()));  ... launch on placement.data() ...
//   ATTND_RETURN_IF_ERROR(placement.Collect(call.tensors()));  sync;  placement.Finish();
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/common/gpu/vendor.h"
#include "server/engine/gpu/device.h"
#include "server/engine/memory_pool.h"
#include "server/engine/op_call.h"

namespace attnd::server::engine::gpu_rt {

class CallPlacement {
 public:
  // `device` is current on this thread; `staging` (may be null: pageable copies) is the shared
  // pinned pool; both outlive the placement.
  CallPlacement(GpuDevice* device, MemoryPool* staging, gpu::Stream stream);
  // Synchronises the stream before its blocks go back to the pools (also on error paths: work
  // already enqueued must not find its memory reused).
  ~CallPlacement();
  CallPlacement(const CallPlacement&) = delete;
  CallPlacement& operator=(const CallPlacement&) = delete;

  // Places every tensor and enqueues the copies in / zero fills on the stream.
  // RESOURCE_EXHAUSTED when the device pool cannot hold a tensor.
  absl::Status Place(const std::vector<TensorUse>& tensors);
  // One pointer per tensor, valid on the device; after Place.
  const std::vector<void*>& data() const { return data_; }
  // A workspace block of `bytes` from the device pool (null for 0 bytes).
  absl::StatusOr<void*> Workspace(int64_t bytes);
  // After the op's launches: enqueues the copies back of host-resident outputs and of readbacks.
  absl::Status Collect(const std::vector<TensorUse>& tensors);
  // After the stream synchronised: moves bytes that came back through staging to their places.
  void Finish();

  uint64_t h2d_bytes() const { return h2d_; }
  uint64_t d2h_bytes() const { return d2h_; }
  uint64_t readback_bytes() const { return readback_; }

 private:
  absl::Status CopyIn(void* device_dst, const void* host_src, uint64_t n, bool pinned);
  absl::Status CopyOut(void* host_dst, const void* device_src, uint64_t n, bool pinned);

  struct Pending {
    const char* from;  // staging
    void* to;          // final host destination
    uint64_t n;
  };
  GpuDevice* const device_;
  MemoryPool* const staging_;
  const gpu::Stream stream_;
  std::vector<void*> data_;
  std::vector<PoolBlock> blocks_;          // device blocks (tensors, workspace)
  std::vector<PoolBlock> staging_blocks_;  // pinned staging, until Finish
  std::vector<Pending> pending_;
  uint64_t h2d_ = 0;
  uint64_t d2h_ = 0;
  uint64_t readback_ = 0;
};

}  // namespace attnd::server::engine::gpu_rt
