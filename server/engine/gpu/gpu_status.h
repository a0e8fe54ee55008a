// GPU runtime errors as statuses for the daemon's GPU runtime (server/engine/gpu): errors after
// which the device is unusable in this process are UNAVAILABLE (docs/SERVICE.md "Status codes": a
// lost device), out-of-memory is RESOURCE_EXHAUSTED, anything else INTERNAL; the message names the
// vendor, the call and the runtime's description. Clears the runtime's last (non-sticky) error.
//   ATTND_GPU_STATUS(gpu::StreamSynchronize(s), "synchronising the stream");
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/common/gpu/vendor.h"

namespace attnd::server::engine::gpu_rt {

inline absl::Status GpuStatus(gpu::Error e, absl::string_view what) {
  if (e == gpu::kSuccess) return absl::OkStatus();
  (void)gpu::GetLastError();  // a non-sticky error must not fail the next call
  const std::string msg = absl::StrCat(what, ": ", gpu::kVendorName, " error ", static_cast<int>(e),
                                       " (", gpu::ErrorString(e), ")");
  if (gpu::IsDeviceLost(e)) {
    return absl::UnavailableError(absl::StrCat(msg, "; the device is unusable in this process"));
  }
#if defined(ATTND_GPU_CUDA)
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
#else
  if (e == hipErrorOutOfMemory) return absl::ResourceExhaustedError(msg);
#endif
  return absl::InternalError(msg);
}

}  // namespace attnd::server::engine::gpu_rt

#define ATTND_GPU_STATUS(call, what)                                                             \
  do {                                                                                           \
    ::absl::Status attnd_gpu_status_ = ::attnd::server::engine::gpu_rt::GpuStatus((call), what); \
    if (!attnd_gpu_status_.ok()) return attnd_gpu_status_;                                       \
  } while (false)
