// MLA prefill on the GPU: what each kernel supports, the workspace it needs (the query-tile
// schedule), and the launchers (capture-safe: they never allocate or synchronise). Params point
// to device memory and passed Validate; cu_seqlens are read only on the device.
//   GPU_RETURN_IF_ERROR(LaunchMlaPrefillMma(p, ctx.workspace, stream));
#pragma once

#include <stdint.h>

#include <string>

#include "kernels/common/gpu/vendor.h"
#include "kernels/mla_prefill/params.h"

namespace attnd::kernels::mla_prefill::gpu {

enum class GpuKernel {
  kSimt,   // portable CUDA/HIP: 16 queries x 1 head per CTA, 32-key tiles, f32 FMA; any d <= 256
  kMma,    // CUDA sm_80+: 128 queries x 1 head per CTA, 64-key tiles, bf16 mma.sync
  kWgmma,  // CUDA sm_90a: 128 queries x 1 head per CTA, 128-key tiles by TMA, bf16 wgmma
};

// Whether `kernel` can run `p` on the current device; otherwise false with the reason.
// Both: (ceil(total_q / rows per CTA) + B) · H < 2^31 CTAs, B < 2^31.
// kMma additionally: compute capability >= 8.0; (d_qk, d_v) one of (192, 128), (128, 128),
// (64, 64); q, k, v 16-byte aligned (base and leading strides multiples of 8
// elements); out 4-byte aligned (base and leading strides even); its shared memory per block.
// kWgmma: compute capability 9.0; (d_qk, d_v) = (192, 128); the kMma alignment; q and k at most
// 2^31 - 1 tokens, k at least one; tensor maps of q, k and v that the driver accepts.
bool GpuSupports(GpuKernel kernel, const Params& p, std::string* why);

// Workspace bytes: the per-sequence query-tile offsets (8 · (B + 1)) and a work counter (8),
// 16-byte aligned.
int64_t WorkspaceBytes(const Params& p);

// Runs the prefill on `stream`: a schedule kernel (tile offsets from cu_seqlens_q, and out 0 /
// lse -inf for the rows past cu_seqlens_q[B]), then the attention kernel. `workspace` holds
// WorkspaceBytes(p) bytes; its contents on entry do not matter. Errors for calls GpuSupports
// refuses.
::attnd::gpu::Error LaunchMlaPrefillSimt(const Params& p, void* workspace,
                                         ::attnd::gpu::Stream stream);
#if defined(ATTND_GPU_CUDA)
::attnd::gpu::Error LaunchMlaPrefillMma(const Params& p, void* workspace,
                                        ::attnd::gpu::Stream stream);
::attnd::gpu::Error LaunchMlaPrefillWgmma(const Params& p, void* workspace,
                                          ::attnd::gpu::Stream stream);
// The wgmma kernel with its items' heads interleaved in groups of `head_group` (clamped to
// [1, H]; 1: heads in order, what LaunchMlaPrefillWgmma runs until the grouped order is
// measured) or of WgmmaHeadGroup(p)'s size (head_group <= 0). The same output bytes at every
// group size; for the tests and the benchmark's forced variants.
::attnd::gpu::Error LaunchMlaPrefillWgmmaWith(const Params& p, int32_t head_group, void* workspace,
                                              ::attnd::gpu::Stream stream);
// The candidate group size: as many query heads as keep their kv heads' K and V within 12 MiB
// of L2 (docs/KERNELS.md "MLA prefill on Hopper", "Work"), at least 1, at most H.
int32_t WgmmaHeadGroup(const Params& p);
#endif

}  // namespace attnd::kernels::mla_prefill::gpu
