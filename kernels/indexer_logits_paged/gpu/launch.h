// Launchers of the paged (decode) indexer-logits GPU kernels, which share the prefill operator's
// kernel templates (kernels/indexer_logits/gpu/simt.cuh, mma.cuh). Each takes a stream, never
// allocates and never synchronises (capture-safe); params were validated and point at device
// memory. The Supports rules live beside them so that they match the kernels.
//   if (MmaSupports(p, &why)) GPU_RETURN_IF_ERROR(LaunchMma(p, stream));
#pragma once

#include <string>

#include "kernels/common/gpu/vendor.h"
#include "kernels/indexer_logits_paged/params.h"

namespace attnd::kernels::indexer_logits_paged::gpu {

// The portable SIMT kernel: any validated params (any H <= 128, D a multiple of 16, block size,
// strides and alignment) with block_size < 2^31.
bool SimtSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchSimt(const Params& p, ::attnd::gpu::Stream stream);

#if defined(ATTND_GPU_CUDA)
// The tensor-core kernel: H in {32, 64}, D in {64, 128}, q and kv_cache 16-B aligned (pointers
// and strides, bytes), at least one cache block, block_size < 2^31, compute capability >= 8.0.
bool MmaSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchMma(const Params& p, ::attnd::gpu::Stream stream);

// The Hopper kernel (wgmma.cu): D = 128, block_size 64, any H <= 128 with next_n · H' <= 512
// (H' = H rounded up to 32, 64 or 128), q and kv_cache 16-B aligned (pointers and row strides,
// bytes), at least one cache block, compute capability 9.0 (sm_90a code). Not in
// Implementations() until its device check (tests/kernels/indexer_logits_paged/gpu_test.cc
// "WgmmaMatchesReference") has passed on an sm_90 card; the tests and the benchmark call it
// directly.
bool WgmmaSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchWgmma(const Params& p, ::attnd::gpu::Stream stream);
#endif

}  // namespace attnd::kernels::indexer_logits_paged::gpu
