// Host-side GPU helpers on top of vendor.h: GPU_RETURN_IF_ERROR turns a runtime error into
// INTERNAL naming the vendor, file, line and call.
//   GPU_RETURN_IF_ERROR(gpu::MemsetAsync(p, 0, n, stream));
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/gpu/vendor.h"

namespace attnd::gpu {

inline absl::Status ToStatus(Error e, const char* call, const char* file, int line) {
  if (e == kSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(kVendorName, " error at ", file, ":", line, ": ", call, ": ", ErrorString(e)));
}

}  // namespace attnd::gpu

#define GPU_RETURN_IF_ERROR(call)                                                           \
  do {                                                                                      \
    ::absl::Status gpu_status_ = ::attnd::gpu::ToStatus((call), #call, __FILE__, __LINE__); \
    if (!gpu_status_.ok()) return gpu_status_;                                              \
  } while (false)
