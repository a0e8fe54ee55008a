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
// strides, alignment and kv_cache layout) with block_size < 2^31.
bool SimtSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchSimt(const Params& p, ::attnd::gpu::Stream stream);

#if defined(ATTND_GPU_CUDA)
// The tensor-core kernel: kv_cache in the blocks layout (not AITER's shuffled one, a ROCm
// layout), H in {32, 64}, D in {64, 128}, q and kv_cache 16-B aligned (pointers and strides,
// bytes), at least one cache block, block_size < 2^31, compute capability >= 8.0.
bool MmaSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchMma(const Params& p, ::attnd::gpu::Stream stream);

// The Hopper fp8 wgmma kernel (docs/KERNELS.md "Paged indexer on Hopper"): precision FAST only,
// kv_cache in the blocks layout with block_size 64, H in {32, 64}, D 128, q and kv_cache 16-B
// aligned (pointers and strides), 1 to 2^31 - 1 cache blocks, compute capability 9.0.
bool WgmmaSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchWgmma(const Params& p, ::attnd::gpu::Stream stream);
// The same kernel with one producer thread per consumer warpgroup (`cuda_wgmma2p`, opt-in until
// measured faster: docs/KERNELS.md "Paged indexer on Hopper"); WgmmaSupports' rules.
::attnd::gpu::Error LaunchWgmma2p(const Params& p, ::attnd::gpu::Stream stream);
// The same kernel with the split from the lengths (`cuda_wgmma_bal`, opt-in until measured:
// docs/KERNELS.md "A split from the lengths"): each query block cut into pieces by its own
// visible length, read on the device; WgmmaSupports' rules and at most
// kPagedBalancedMaxBlocks query blocks.
bool WgmmaBalSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchWgmmaBal(const Params& p, ::attnd::gpu::Stream stream);
#endif

}  // namespace attnd::kernels::indexer_logits_paged::gpu
