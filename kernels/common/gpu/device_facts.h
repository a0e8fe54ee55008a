// Host-side facts about the current GPU, queried once per device ordinal and cached (cheap
// enough for Supports predicates and launchers), plus the dynamic shared-memory opt-in and an
// occupancy query. Portable CUDA/HIP; include from .cu files (vendor.h has no Abseil).
//   gpu::DeviceFacts d;
//   if (!gpu::CurrentDeviceFacts(&d) || d.cc_major < 8) return Refuse(why, "...");
#pragma once

#include <stdint.h>

#include <map>
#include <mutex>
#include <tuple>

#include "kernels/common/gpu/vendor.h"

namespace attnd::gpu {

struct DeviceFacts {
  int ordinal = 0;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;  // CUDA compute capability (0.0 on HIP)
  int smem_optin = 0;              // the most dynamic shared memory one block may use (bytes)
  int l2_bytes = 0;                // L2 cache size
};

namespace internal {
inline bool QueryDeviceFacts(int ordinal, DeviceFacts* f) {
  f->ordinal = ordinal;
#if defined(ATTND_GPU_CUDA)
  return cudaDeviceGetAttribute(&f->sm_count, cudaDevAttrMultiProcessorCount, ordinal) ==
             cudaSuccess &&
         cudaDeviceGetAttribute(&f->cc_major, cudaDevAttrComputeCapabilityMajor, ordinal) ==
             cudaSuccess &&
         cudaDeviceGetAttribute(&f->cc_minor, cudaDevAttrComputeCapabilityMinor, ordinal) ==
             cudaSuccess &&
         cudaDeviceGetAttribute(&f->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal) ==
             cudaSuccess &&
         cudaDeviceGetAttribute(&f->l2_bytes, cudaDevAttrL2CacheSize, ordinal) == cudaSuccess;
#else
  return hipDeviceGetAttribute(&f->sm_count, hipDeviceAttributeMultiprocessorCount, ordinal) ==
             hipSuccess &&
         hipDeviceGetAttribute(&f->smem_optin, hipDeviceAttributeMaxSharedMemoryPerBlock,
                               ordinal) == hipSuccess &&
         hipDeviceGetAttribute(&f->l2_bytes, hipDeviceAttributeL2CacheSize, ordinal) == hipSuccess;
#endif
}
}  // namespace internal

// Facts of the current device; false (and nothing cached) when there is no usable device.
inline bool CurrentDeviceFacts(DeviceFacts* out) {
  constexpr int kMaxDevices = 64;
  static DeviceFacts facts[kMaxDevices];
  static bool ok[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  int ordinal = -1;
  if (GetDevice(&ordinal) != kSuccess || ordinal < 0 || ordinal >= kMaxDevices) {
    static_cast<void>(GetLastError());  // clear a sticky "no device" error
    return false;
  }
  std::call_once(once[ordinal], [&] {
    ok[ordinal] = internal::QueryDeviceFacts(ordinal, &facts[ordinal]);
    if (!ok[ordinal]) static_cast<void>(GetLastError());
  });
  *out = facts[ordinal];
  return ok[ordinal];
}

// 10·major + minor of the current CUDA device (90 on H200); 0 when unknown or on HIP.
inline int CurrentDeviceCapability() {
  DeviceFacts d;
  return CurrentDeviceFacts(&d) ? 10 * d.cc_major + d.cc_minor : 0;
}

// Streaming multiprocessors (compute units) of the current device; 1 when unknown.
inline int CurrentDeviceSmCount() {
  DeviceFacts d;
  return CurrentDeviceFacts(&d) && d.sm_count > 0 ? d.sm_count : 1;
}

// Lets `kernel` use `bytes` of dynamic shared memory (needed above 48 KiB on CUDA). Not a stream
// operation: safe during graph capture and to repeat.
inline Error AllowDynamicSmem(const void* kernel, int bytes) {
#if defined(ATTND_GPU_CUDA)
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
#else
  return hipFuncSetAttribute(kernel, hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
#endif
}

// Resident blocks per SM of `kernel` with `threads` threads and `smem` dynamic bytes on the
// current device (0 when it cannot run there); cached per (kernel, device, threads, smem).
// Also applies AllowDynamicSmem(kernel, smem).
inline int BlocksPerSm(const void* kernel, int threads, int smem) {
  // std::mutex, not absl::Mutex: this header is compiled by nvcc and hipcc inside .cu files and
  // stays free of Abseil like vendor.h. Both caches are function-local and used only while `mu`
  // is held for the rest of the call, so there is no cross-function contract to annotate (and no
  // .cu file is part of the clang -Wthread-safety check, scripts/thread-safety.sh).
  static std::mutex mu;
  static auto* cache = new std::map<std::tuple<const void*, int, int, int>, int>();
  DeviceFacts d;
  if (!CurrentDeviceFacts(&d) || smem > d.smem_optin) return 0;
  const auto key = std::make_tuple(kernel, d.ordinal, threads, smem);
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  int n = 0;
  // The attribute is a per-kernel maximum: only ever raise it, or a later call for a smaller
  // shape would lower it under what an earlier, cached larger shape launches with.
  static auto* allowed = new std::map<std::pair<const void*, int>, int>();
  int& allowed_smem = (*allowed)[{kernel, d.ordinal}];
  const bool raise = smem > allowed_smem;
  if ((raise && AllowDynamicSmem(kernel, smem) != kSuccess) ||
#if defined(ATTND_GPU_CUDA)
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads,
                                                    static_cast<size_t>(smem)) != cudaSuccess
#else
      hipOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads,
                                                   static_cast<size_t>(smem)) != hipSuccess
#endif
  ) {
    static_cast<void>(GetLastError());
    n = 0;
  }
  if (raise && n > 0) allowed_smem = smem;
  (*cache)[key] = n;
  return n;
}

}  // namespace attnd::gpu
