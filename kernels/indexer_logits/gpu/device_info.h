// Facts about the current GPU that the indexer launchers and Supports predicates need (SM count,
// compute capability), read once per device with the vendor runtime and cached. Host only.
//   if (CurrentDeviceCapability() < 80) return false;  const int sms = CurrentDeviceSmCount();
#pragma once

#include <atomic>

#include "kernels/common/gpu/vendor.h"

namespace attnd::kernels::indexer_logits::gpu_impl {

// 0 when no device is current or the runtime fails.
inline int CurrentDeviceAttribute(bool capability) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[2][kMaxDevices];  // 0: unknown
  int device = 0;
  if (gpu::GetDevice(&device) != gpu::kSuccess || device < 0 || device >= kMaxDevices) return 0;
  std::atomic<int>& slot = cache[capability ? 1 : 0][device];
  int value = slot.load(std::memory_order_relaxed);
  if (value != 0) return value;
#if defined(ATTND_GPU_CUDA)
  int a = 0, b = 0;
  if (capability) {
    if (cudaDeviceGetAttribute(&a, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&b, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      return 0;
    }
    value = 10 * a + b;
  } else {
    if (cudaDeviceGetAttribute(&a, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    value = a;
  }
#else
  int a = 0;
  if (capability) {
    value = 0;  // no NVIDIA compute capability on HIP
  } else {
    if (hipDeviceGetAttribute(&a, hipDeviceAttributeMultiprocessorCount, device) != hipSuccess) {
      return 0;
    }
    value = a;
  }
#endif
  slot.store(value, std::memory_order_relaxed);
  return value;
}

// 10·major + minor of the current CUDA device (90 on H200); 0 when unknown or on HIP.
inline int CurrentDeviceCapability() { return CurrentDeviceAttribute(/*capability=*/true); }

// Streaming multiprocessors (compute units) of the current device; 1 when unknown.
inline int CurrentDeviceSmCount() {
  const int n = CurrentDeviceAttribute(/*capability=*/false);
  return n > 0 ? n : 1;
}

}  // namespace attnd::kernels::indexer_logits::gpu_impl
