#include "server/engine/gpu/placement.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/engine/gpu/gpu_status.h"

namespace attnd::server::engine::gpu_rt {

CallPlacement::CallPlacement(GpuDevice* device, MemoryPool* staging, gpu::Stream stream)
    : device_(device), staging_(staging), stream_(stream) {}

CallPlacement::~CallPlacement() {
  (void)gpu::StreamSynchronize(stream_);
  (void)gpu::GetLastError();
}

absl::Status CallPlacement::CopyIn(void* device_dst, const void* host_src, uint64_t n,
                                   bool pinned) {
  h2d_ += n;
  if (!pinned && staging_ != nullptr) {
    absl::StatusOr<PoolBlock> block = staging_->Allocate(n);
    if (block.ok()) {
      std::memcpy(block->data(), host_src, n);
      host_src = block->data();
      staging_blocks_.push_back(*std::move(block));
    }
    // Staging full: the runtime copies from pageable memory itself (slower, still correct).
  }
  ATTND_GPU_STATUS(gpu::MemcpyH2DAsync(device_dst, host_src, n, stream_),
                   "copying a tensor to the device");
  return absl::OkStatus();
}

absl::Status CallPlacement::CopyOut(void* host_dst, const void* device_src, uint64_t n,
                                    bool pinned) {
  void* dst = host_dst;
  if (!pinned && staging_ != nullptr) {
    absl::StatusOr<PoolBlock> block = staging_->Allocate(n);
    if (block.ok()) {
      dst = block->data();
      pending_.push_back({block->data(), host_dst, n});
      staging_blocks_.push_back(*std::move(block));
    }
  }
  ATTND_GPU_STATUS(gpu::MemcpyD2HAsync(dst, device_src, n, stream_),
                   "copying a tensor to the host");
  return absl::OkStatus();
}

absl::Status CallPlacement::Place(const std::vector<TensorUse>& tensors) {
  data_.assign(tensors.size(), nullptr);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorUse& t = tensors[i];
    if (t.residence == Residence::kDeviceRegion) {
      data_[i] = t.device;
      continue;
    }
    if (t.span_bytes == 0) {
      data_[i] = device_->empty_block();
      continue;
    }
    absl::StatusOr<PoolBlock> block = device_->pool().Allocate(t.span_bytes);
    if (!block.ok()) {
      return absl::Status(block.status().code(),
                          absl::StrCat(t.name, ": ", block.status().message()));
    }
    data_[i] = block->data();
    const bool pinned = t.residence == Residence::kHostRegion && t.pinned;
    if (t.role == kernels::Role::kInput || !t.zero_fill) {
      // Inputs, and outputs in host regions (elements the op leaves untouched keep their bytes).
      absl::Status s = CopyIn(block->data(), t.host, t.span_bytes, pinned);
      if (!s.ok()) return s;
    } else {
      ATTND_GPU_STATUS(gpu::MemsetAsync(block->data(), 0, t.span_bytes, stream_),
                       absl::StrCat(t.name, ": zeroing the output"));
    }
    blocks_.push_back(*std::move(block));
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> CallPlacement::Workspace(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  absl::StatusOr<PoolBlock> block = device_->pool().Allocate(static_cast<uint64_t>(bytes));
  if (!block.ok()) {
    return absl::Status(block.status().code(),
                        absl::StrCat("kernel workspace: ", block.status().message()));
  }
  void* p = block->data();
  blocks_.push_back(*std::move(block));
  return p;
}

absl::Status CallPlacement::Collect(const std::vector<TensorUse>& tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorUse& t = tensors[i];
    if (t.span_bytes == 0) continue;
    if (t.residence == Residence::kDeviceRegion) {
      if (t.readback != nullptr) {
        readback_ += t.span_bytes;
        absl::Status s = CopyOut(t.readback, t.device, t.span_bytes, /*pinned=*/false);
        if (!s.ok()) return s;
      }
      continue;
    }
    if (t.role != kernels::Role::kOutput) continue;
    d2h_ += t.span_bytes;
    const bool pinned = t.residence == Residence::kHostRegion && t.pinned;
    absl::Status s = CopyOut(t.host, data_[i], t.span_bytes, pinned);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void CallPlacement::Finish() {
  for (const Pending& p : pending_) std::memcpy(p.to, p.from, p.n);
  pending_.clear();
  staging_blocks_.clear();
}

}  // namespace attnd::server::engine::gpu_rt
