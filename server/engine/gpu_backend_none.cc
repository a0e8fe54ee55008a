// MakeGpuBackend for builds without a GPU backend (ATTND_GPU=off).
#include "server/engine/gpu_backend_factory.h"

namespace attnd::server::engine {

const char* GpuBackendName() { return ""; }

int VisibleGpuCount() { return 0; }

absl::StatusOr<std::unique_ptr<Backend>> MakeGpuBackend(const GpuBackendOptions&) {
  return absl::FailedPreconditionError(
      "this attnd is built without GPU backends (ATTND_GPU=off); use --backend=cpu");
}

}  // namespace attnd::server::engine
