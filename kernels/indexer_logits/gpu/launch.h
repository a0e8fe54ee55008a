// Launchers of the prefill indexer-logits GPU kernels (kernels in simt.cuh / mma.cuh /
// wgmma.cuh). Each takes a stream, never allocates and never synchronises (capture-safe); params
// were validated and point at device memory. The Supports rules live beside them so that they
// match the kernels.
//   if (MmaSupports(p, &why)) GPU_RETURN_IF_ERROR(LaunchMma(p, stream));
#pragma once

#include <string>

#include "kernels/common/gpu/vendor.h"
#include "kernels/indexer_logits/params.h"

namespace attnd::kernels::indexer_logits::gpu {

// The portable SIMT kernel: any validated params (H <= 128, D a multiple of 16, any strides and
// alignment). False only when the grid would not fit in one dimension (M beyond ~2^37 rows).
bool SimtSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchSimt(const Params& p, ::attnd::gpu::Stream stream);

#if defined(ATTND_GPU_CUDA)
// The Hopper kernel (TMA, fp8 wgmma): precision kFast only (its accumulator keeps 14 significant
// bits: docs/ACCURACY.md), H in {32, 64}, D = 128, q and k 16-B aligned (pointers and strides,
// bytes), k_scale 4-B aligned, M and N below 2^31 − 64, a device of compute capability exactly
// 9.0 (sm_90a).
bool WgmmaSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchWgmma(const Params& p, ::attnd::gpu::Stream stream);

// The tensor-core kernel (fp8 converted to f16 exactly, f32 accumulation: both precisions): H in
// {32, 64}, D in {64, 128}, q and k 16-B aligned (pointers and strides, bytes), k_scale 4-B
// aligned, a device of compute capability >= 8.0.
bool MmaSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchMma(const Params& p, ::attnd::gpu::Stream stream);
#endif

}  // namespace attnd::kernels::indexer_logits::gpu
