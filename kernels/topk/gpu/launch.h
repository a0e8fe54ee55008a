// Launchers of the GPU top-k (kernels/topk/gpu/*.cu). Capture-safe: they take the caller's stream,
// never allocate, never synchronise, and read no device data on the host (windows stay on the
// device). The params' tensors are device pointers and have passed topk::Validate().
//   GPU_RETURN_IF_ERROR(LaunchTopkSimt(p, stream));
#pragma once

#include "kernels/common/gpu/vendor.h"
#include "kernels/topk/params.h"

namespace attnd::kernels::topk::gpu {

// The portable SIMT top-k (simt.cu): one CTA per row, radix select, ordered output. Handles
// every validated Params (plain and KV-slot mapped); needs no workspace. Writes exactly the CPU
// implementation's output (ascending columns, ties to the lowest columns, -1 / -inf padding).
::attnd::gpu::Error LaunchTopkSimt(const Params& p, ::attnd::gpu::Stream stream);

}  // namespace attnd::kernels::topk::gpu
