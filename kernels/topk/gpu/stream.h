// The streaming GPU top-k (stream.cu, CUDA): each window is read once, its candidates kept in
// shared memory; persistent CTAs over many rows, a thread-block cluster per row (sm_90, DSMEM
// histogram merge) when rows are few. Writes exactly the CPU implementation's output. Capture-safe
// launchers: the caller's stream, no allocation, no synchronisation, no device data read on the
// host. Params are device tensors that passed topk::Validate().
//   if (gpu::SupportsStream(p, &why)) GPU_RETURN_IF_ERROR(gpu::LaunchTopkStream(p, stream));
#pragma once

#include <string>

#include "kernels/common/gpu/vendor.h"
#include "kernels/topk/params.h"

namespace attnd::kernels::topk::gpu {

// Launch choices; 0 picks the default for the shape and device. Tests and benchmarks force them.
struct StreamConfig {
  int threads = 0;        // 256 or 512 per CTA
  int cluster = 0;        // CTAs per row: 1, 2, 4 or 8 (2+ needs sm_90)
  bool speculate = true;  // speculative first-chunk threshold (off: admit until the buffer fills)
};

// True when the device can run the kernel (CUDA, enough shared memory per block); every validated
// Params is then supported (any M, N, k <= kMaxK, windows, the KV-slot mapping, strided views).
bool SupportsStream(const Params& p, std::string* why);

::attnd::gpu::Error LaunchTopkStream(const Params& p, ::attnd::gpu::Stream stream);
::attnd::gpu::Error LaunchTopkStreamWith(const Params& p, const StreamConfig& config,
                                         ::attnd::gpu::Stream stream);

}  // namespace attnd::kernels::topk::gpu
