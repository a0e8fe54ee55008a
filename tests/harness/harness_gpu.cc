// DeviceMirror and GPU discovery for the harness. Built with ATTND_GPU_CUDA / ATTND_GPU_HIP;
// without a GPU backend every GPU path reports "unavailable".
#include "tests/harness/harness.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/common/gpu/runtime.h"
#endif

namespace attnd::testing {

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)

kernels::Backend GpuBackend() {
#if defined(ATTND_GPU_CUDA)
  return kernels::Backend::kCuda;
#else
  return kernels::Backend::kHip;
#endif
}

bool GpuAvailable() {
  static const bool available = [] {
    int n = 0;
    return gpu::GetDeviceCount(&n) == gpu::kSuccess && n > 0;
  }();
  return available;
}

DeviceMirror::DeviceMirror() {
  gpu::Stream s = nullptr;
  if (GpuAvailable() && gpu::StreamCreate(&s) == gpu::kSuccess) stream_ = s;
}

DeviceMirror::~DeviceMirror() {
  if (stream_ != nullptr) {
    gpu::StreamSynchronize(static_cast<gpu::Stream>(stream_));
    gpu::StreamDestroy(static_cast<gpu::Stream>(stream_));
  }
  for (void* p : allocations_) gpu::Free(p);
}

absl::Status DeviceMirror::Mirror(kernels::Tensor& t) {
  int64_t bytes = 0;
  if (!kernels::SpanBytes(t, &bytes).ok()) return absl::InternalError("span overflow");
  void* d = nullptr;
  GPU_RETURN_IF_ERROR(gpu::Malloc(&d, static_cast<size_t>(bytes) + 256));
  allocations_.push_back(d);
  if (bytes > 0) {
    GPU_RETURN_IF_ERROR(gpu::MemcpyH2DAsync(d, t.data, static_cast<size_t>(bytes),
                                            static_cast<gpu::Stream>(stream_)));
  }
  t.data = d;
  return absl::OkStatus();
}

absl::Status DeviceMirror::CopyBack(const kernels::Tensor& device, const kernels::Tensor& host) {
  int64_t bytes = 0;
  if (!kernels::SpanBytes(device, &bytes).ok()) return absl::InternalError("span overflow");
  if (bytes == 0) return absl::OkStatus();
  GPU_RETURN_IF_ERROR(gpu::MemcpyD2HAsync(host.data, device.data, static_cast<size_t>(bytes),
                                          static_cast<gpu::Stream>(stream_)));
  return absl::OkStatus();
}

absl::Status DeviceMirror::Allocate(int64_t bytes, void** out) {
  void* d = nullptr;
  GPU_RETURN_IF_ERROR(gpu::Malloc(&d, static_cast<size_t>(bytes) + 256));
  allocations_.push_back(d);
  GPU_RETURN_IF_ERROR(gpu::MemsetAsync(d, 0xff, static_cast<size_t>(bytes) + 256,
                                       static_cast<gpu::Stream>(stream_)));
  *out = d;
  return absl::OkStatus();
}

absl::Status DeviceMirror::Synchronize() {
  GPU_RETURN_IF_ERROR(gpu::StreamSynchronize(static_cast<gpu::Stream>(stream_)));
  GPU_RETURN_IF_ERROR(gpu::GetLastError());
  return absl::OkStatus();
}

#else  // no GPU backend in this build

kernels::Backend GpuBackend() { return kernels::Backend::kCpu; }
bool GpuAvailable() { return false; }
DeviceMirror::DeviceMirror() = default;
DeviceMirror::~DeviceMirror() = default;
absl::Status DeviceMirror::Mirror(kernels::Tensor&) {
  return absl::UnimplementedError("no GPU backend in this build");
}
absl::Status DeviceMirror::CopyBack(const kernels::Tensor&, const kernels::Tensor&) {
  return absl::UnimplementedError("no GPU backend in this build");
}
absl::Status DeviceMirror::Synchronize() { return absl::OkStatus(); }
absl::Status DeviceMirror::Allocate(int64_t, void**) {
  return absl::UnimplementedError("no GPU backend in this build");
}

#endif

}  // namespace attnd::testing
