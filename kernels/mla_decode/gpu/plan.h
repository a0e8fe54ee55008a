// Host-side internals of the MLA decode GPU path shared by plan.cu and the launchers: how a
// kernel instance runs a call (rows per CTA, tile, shared memory, residency) and the kernels'
// argument block. Internal to kernels/mla_decode/gpu.
#pragma once

#include <stdint.h>

#include "kernels/common/gpu/vendor.h"
#include "kernels/mla_decode/balanced_plan.h"
#include "kernels/mla_decode/gpu/common.cuh"
#include "kernels/mla_decode/gpu/launch.h"
#include "kernels/mla_decode/params.h"
#include "kernels/mla_decode/schedule_plan.h"

namespace attnd::kernels::mla_decode::gpu {

struct KernelShape {
  const void* kernel = nullptr;  // the instance a launch would use (null: none fits p)
  int block_m = 0;               // query rows (of s_q · H) per CTA
  int block_n = 0;               // positions per step; splits are whole tiles
  int threads = 0;
  int smem_bytes = 0;
  int blocks_per_sm = 0;  // resident CTAs per SM on the current device (0: cannot run)
};

// simt.cu / mma.cu: the instance for p (alignment decides the SIMT load width; H · s_q the
// tensor-core row block).
KernelShape SimtShape(const Params& p);
#if defined(ATTND_GPU_CUDA)
KernelShape MmaShape(const Params& p);
// wgmma.cu: the sm_90a instance for p (none for the FP8 cache, or for H not a multiple of 64
// unless H < 64 where WgmmaPpRowsShareLimit(p)).
KernelShape WgmmaShape(const Params& p);
// wgmma_pp.cu: the ping-pong instance for p (FAST, bf16 cache, H a multiple of 64, or H < 64
// where WgmmaPpRowsShareLimit(p)).
KernelShape WgmmaPpShape(const Params& p);
// wgmma_sf.cu: the self-fed instance for p (WgmmaPpShape's calls with page size 64), and
// whether its one tensor map of kv_cache encodes (else false with the reason: it has no gather
// path to fall back on).
KernelShape WgmmaSfShape(const Params& p);
bool WgmmaSfMapsKv(const Params& p, std::string* why);
// wgmma.cu / wgmma_sf.cu: their launchers with options (launch.h LaunchMlaDecodeWith).
::attnd::gpu::Error LaunchMlaDecodeWgmmaWith(const Params& p, int splits, void* workspace,
                                             ::attnd::gpu::Stream stream,
                                             const DecodeLaunchOptions& options);
::attnd::gpu::Error LaunchMlaDecodeWgmmaSfWith(const Params& p, int splits, void* workspace,
                                               ::attnd::gpu::Stream stream,
                                               const DecodeLaunchOptions& options);
#endif

// H < 64 on the wgmma kernels (CUDA-only, but GpuSupports asks on every GPU build): every
// row of a block (up to 64 rows of s_q · H, spanning MTP tokens) sees the same positions, i.e.
// s_q is 1 or the call is not causal.
inline bool WgmmaPpRowsShareLimit(const Params& p) { return p.q.dim(1) == 1 || !p.causal; }

// The kernels' view of p, with `block_m` rows per CTA and the split workspace carved as
// DecodeArgs says (ignored when splits == 1).
DecodeArgs MakeDecodeArgs(const Params& p, int block_m, int splits, void* workspace);

// B · ceil(s_q · H / block_m): the (request, row block) work items before splitting.
int64_t WorkItems(const Params& p, int block_m);

// combine.cu: merges the a.splits partials into out and lse.
::attnd::gpu::Error LaunchMlaDecodeCombine(const DecodeArgs& a, ::attnd::gpu::Stream stream);

// The wave-balanced plan of p for `shape` on the current device (ranges 0: none; launch.h
// BalancedSplits).
BalancedShape BalancedPlanFor(const Params& p, const KernelShape& shape);

// The CTA groups the length-aware schedule cuts the work for (SMs x resident CTAs over the
// row blocks of a request), or 0 where it does not apply (groups + B over
// kScheduleMaxLaunched); it launches ScheduleGroupsFor + B groups.
int32_t ScheduleGroupsFor(const Params& p, const KernelShape& shape);
int64_t ScheduleBytes(const Params& p, int32_t groups);

// schedule.cu: the schedule kernel, writing a.sched, a.sched_first and a.sched_pieces;
// even_splits: the even plan's split count (schedule_plan.h ScheduleEvenWidth; 0: never its cut).
::attnd::gpu::Error LaunchMlaDecodeSchedule(const DecodeArgs& a, int32_t groups, int32_t block_n,
                                            int32_t even_splits, ::attnd::gpu::Stream stream);

// Launches `shape.kernel` over B · row blocks · splits CTAs (under options.balanced where the
// plan applies: its groups' CTAs), then the combine when split. `second_arg`: the kernel's
// second parameter when it has one (the TMA kernel's tensor map).
::attnd::gpu::Error LaunchDecode(const Params& p, const KernelShape& shape, int splits,
                                 void* workspace, ::attnd::gpu::Stream stream,
                                 const void* second_arg = nullptr,
                                 const DecodeLaunchOptions& options = {});

}  // namespace attnd::kernels::mla_decode::gpu
