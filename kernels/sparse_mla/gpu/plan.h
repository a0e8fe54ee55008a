// Internal to kernels/sparse_mla/gpu: each kernel's launch shape on the current device (for
// GpuSupports and the split plan) and the kernels' argument block built from Params.
//   const KernelShape s = MmaShape(p);  const KernelArgs a = MakeKernelArgs(p, splits, ws);
#pragma once

#include <stdint.h>

#include <string>

#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/sparse_mla/gpu/common.cuh"
#include "kernels/sparse_mla/params.h"

namespace attnd::kernels::sparse_mla::gpu {

// How a kernel instance runs one call: heads per CTA, dynamic shared memory, resident CTAs per
// SM on the current device (from the occupancy API; 0 when it cannot run there).
struct KernelShape {
  int block_m = 0;
  int smem_bytes = 0;
  int ctas_per_sm = 0;
};
KernelShape SimtShape(const Params& p);
// GpuSplits' heuristic (launch.h) for `items` (> 0) independent CTAs of work and `slots`
// resident CTAs on the device (SMs x CTAs per SM), capped by p's widest row.
int SplitsForItems(const Params& p, int64_t items, int64_t slots);
#if defined(ATTND_GPU_CUDA)
KernelShape MmaShape(const Params& p);
// The low-head kernel's device checks (after GpuSupports' common ones) and split plan.
bool MmaLowhSupports(const Params& p, std::string* why);
int MmaLowhSplits(const Params& p);
// The wgmma kernel's shape and its device checks (after GpuSupports' common ones): compute
// capability 9.0 (sm_90a), H a multiple of 64, either KV format.
KernelShape WgmmaShape(const Params& p);
bool WgmmaSupports(const Params& p, std::string* why);
// The ping-pong wgmma kernel's (wgmma_pp.cu): compute capability 9.0, precision FAST, the
// bf16 cache, H a multiple of 64 or at most 64 (one token's heads padded to a 64-row block).
KernelShape WgmmaPpShape(const Params& p);
bool WgmmaPpSupports(const Params& p, std::string* why);
#endif

// The kernels' view of p (device pointers), with the split workspace carved as KernelArgs says.
KernelArgs MakeKernelArgs(const Params& p, int splits, void* workspace);

}  // namespace attnd::kernels::sparse_mla::gpu
