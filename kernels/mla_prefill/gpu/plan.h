// Host-side internals of the MLA prefill GPU path shared by plan.cu and the launchers: how a
// kernel instance runs a call and the kernels' argument block. Internal to
// kernels/mla_prefill/gpu.
#pragma once

#include <stdint.h>

#include <string>

#include "kernels/common/gpu/vendor.h"
#include "kernels/mla_prefill/gpu/common.cuh"
#include "kernels/mla_prefill/params.h"

namespace attnd::kernels::mla_prefill::gpu {

struct KernelShape {
  const void* kernel = nullptr;  // the instance a launch would use (null: none fits p)
  int block_m = 0;               // query rows per CTA
  int threads = 0;
  int smem_bytes = 0;
  int blocks_per_sm = 0;  // resident CTAs per SM on the current device (0: cannot run)
};

// The shape of `kernel` with `block_m` query rows and `threads` threads per CTA and `smem_bytes`
// of dynamic shared memory, its residency queried on the current device.
KernelShape MakeKernelShape(const void* kernel, int block_m, int threads, int smem_bytes);

// Whether q, k and v rows start 16-byte aligned and out's 4-byte aligned, the tensor-core
// kernels' condition (cp.async and TMA rows, bf16x2 stores); else false with the reason.
bool TensorCoreOperandsAligned(const Params& p, std::string* why);

// simt.cu / mma.cu: the instance for p.
KernelShape SimtShape(const Params& p);
#if defined(ATTND_GPU_CUDA)
KernelShape MmaShape(const Params& p);
// wgmma.cu: the instance for p, and the checks of GpuSupports(kWgmma) past the common ones.
KernelShape WgmmaShape(const Params& p);
bool WgmmaSupports(const Params& p, std::string* why);
#endif

// CTAs per head: ceil(total_q / block_m) + B, an upper bound of Σ_b ceil(Lq_b / block_m).
int64_t SlotsPerHead(const Params& p, int block_m);

// The kernels' view of p with `block_m` query rows per CTA and the schedule in `workspace`.
PrefillArgs MakePrefillArgs(const Params& p, int block_m, void* workspace);

// schedule.cu: fills a.tile_start and writes the rows past cu_seqlens_q[B].
::attnd::gpu::Error LaunchPrefillSchedule(const PrefillArgs& a, ::attnd::gpu::Stream stream);

// The schedule, then `shape.kernel` over slots · H CTAs.
::attnd::gpu::Error LaunchPrefill(const Params& p, const KernelShape& shape, void* workspace,
                                  ::attnd::gpu::Stream stream);

}  // namespace attnd::kernels::mla_prefill::gpu
