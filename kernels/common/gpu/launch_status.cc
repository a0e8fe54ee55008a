// The vendor half of kernels/common/registry.h's GpuImpl: a launcher's error code as a Status.
#include "absl/strings/str_cat.h"
#include "kernels/common/gpu/runtime.h"
#include "kernels/common/registry.h"

namespace attnd::kernels::gpu_internal {

absl::Status LaunchFailed(int code, absl::string_view impl) {
  const auto e = static_cast<gpu::Error>(code);
  return absl::InternalError(
      absl::StrCat(gpu::kVendorName, " error launching ", impl, ": ", gpu::ErrorString(e)));
}

}  // namespace attnd::kernels::gpu_internal
