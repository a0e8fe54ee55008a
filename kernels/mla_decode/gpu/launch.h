// MLA decode on the GPU: what each kernel supports, the split-K plan and its workspace, and the
// launchers (capture-safe: they never allocate or synchronise; split partials live in the
// caller's workspace). Params point to device memory and passed Validate.
//   const int splits = SplitsThatFit(p, GpuSplits(p, GpuKernel::kMma), ctx.workspace_bytes);
//   GPU_RETURN_IF_ERROR(LaunchMlaDecodeMma(p, splits, ctx.workspace, stream));
#pragma once

#include <stdint.h>

#include <string>

#include "kernels/common/gpu/vendor.h"
#include "kernels/mla_decode/invariant_plan.h"
#include "kernels/mla_decode/params.h"

namespace attnd::kernels::mla_decode::gpu {

enum class GpuKernel {
  kSimt,     // portable CUDA/HIP: 16 rows per CTA, 32-token tiles, f32 FMA
  kMma,      // CUDA sm_80+: 16, 32 or 64 rows per CTA, 64-token tiles, bf16 mma.sync (bf16 or
             // per-tensor FP8 cache, the latter converted to bf16 in shared memory)
  kWgmma,    // CUDA sm_90a, bf16 cache, H % 64 == 0 (64 rows, one MTP token's 64 heads, per
             // CTA) or H < 64 with s_q 1 or not causal (up to 64 rows of s_q · H, padded):
             // 64-position blocks, the sparse MLA wgmma kernel (three warpgroups) reading the
             // pages through the block table (wgmma.cuh)
  kWgmmaPp,  // CUDA sm_90a, kWgmma's calls at FAST precision: the same CTA with its consumer
             // warpgroups in ping-pong (kernels/sparse_mla/gpu/wgmma_pp.cuh)
  kWgmmaSf,  // CUDA sm_90a, kWgmmaPp's calls with page size 64: the ping-pong math in two
             // warpgroups that load their own stages by TMA, no producer (wgmma_sf.cuh)
};

inline constexpr int kMaxSplits = 128;
static_assert(kInvariantMaxSplits == kMaxSplits, "invariant_plan.h caps splits alike");

// Whether `kernel` can run `p` on the current device; otherwise false with the reason.
// kSimt: any validated call with B · row blocks · splits < 2^31 and s_q · H < 2^31.
// kMma and kWgmma additionally: compute capability >= 8.0 (kWgmma: exactly 9.0, a bf16 cache
// and H a multiple of 64, or below 64 where WgmmaPpRowsShareLimit); q and kv_cache 16-byte aligned
// (base and leading strides multiples of 8 bf16 elements; for the per-tensor FP8 cache, u8,
// multiples of 16 bytes); out 4-byte aligned (base and leading strides even); its shared memory (up
// to ~226 KiB at 64 rows, d_qk 576, the same for both caches) available per block.
bool GpuSupports(GpuKernel kernel, const Params& p, std::string* why);

// Dispatch's preference for kWgmma (registry.h Impl::prefer): every call it takes at H a
// multiple of 64; at H < 64 (rows padded to 64, so a tile costs the MMAs of 64 rows) only where
// each CTA streams at least kWgmmaPaddedMinTiles tiles of the table's capacity under its split
// plan, i.e. where the cache's bytes, not the MMAs or the latency of a short split, bound the
// call (docs/KERNELS.md "MLA decode on Hopper"). False with the reason in *why otherwise.
inline constexpr int64_t kWgmmaPaddedMinTiles = 16;
bool WgmmaPrefers(const Params& p, std::string* why);

// Split-K count for `p` on the current device (shapes only: the lengths are device data, so
// the plan assumes the table's capacity max_pages · page_size). Heuristic: items = B · row
// blocks (ceil(s_q · H / rows per CTA)), slots = SMs x resident CTAs per SM. items >= slots:
// 1. Otherwise s = floor(slots / items) when that fills at least 3/4 of a wave, else
// ceil(slots / items); at most kMaxSplits and at most capacity / (2 tiles) so a split of a full
// context has at least two tiles. Each request's actual tiles are shared evenly on the device;
// splits left without tiles issue no loads and leave LSE -inf for the combine.
// With p.batch_invariant: InvariantGridSplitsFor(capacity, tile) (invariant_plan.h), at least
// 2, whatever B and the device; GpuSupports then also wants B · row blocks · splits < 2^31.
int GpuSplits(const Params& p, GpuKernel kernel);

// Workspace bytes for `splits` (0 when splits == 1): partial O f32 [splits, B, s_q·H, 512] and
// partial LSE f32 [splits, B, s_q·H].
int64_t SplitWorkspaceBytes(const Params& p, int splits);

// The largest split count <= `splits` whose workspace fits in `bytes` (1 always fits).
int SplitsThatFit(const Params& p, int splits, int64_t bytes);

// Launch options of the wgmma kernels' `...With` launchers (the plain launchers run the
// defaults; the bench and the GPU tests force the others).
struct DecodeLaunchOptions {
  // The L2 prefetch of the next pages (DecodeArgs::prefetch_l2): -1 as the plan says (off since
  // 2026-12-08: measured slower, docs/KERNELS.md "Wave-balanced splits"), 0 off, 1 on.
  int prefetch_l2 = -1;
  // The wave-balanced plan (balanced_plan.h; docs/KERNELS.md "Wave-balanced splits") where
  // BalancedSplits(p, kernel) > 0; `splits` must then be that count. Elsewhere even splits.
  bool balanced = false;
  // The length-aware schedule (schedule_plan.h; docs/KERNELS.md "A schedule from the lengths")
  // where ScheduleWorkspaceBytes(p, kernel) > 0: a schedule kernel reads cache_seqlens and
  // places the pieces, `splits` is the even plan's count (GpuSplits; in [1, kMaxSplits], else
  // the launch is refused) whose per-request cut it keeps where its own end-to-end cut would
  // gain too little (equal lengths: schedule_plan.h ScheduleEvenWidth), and the workspace must
  // hold that many bytes.
  // Elsewhere as without it. Takes precedence over `balanced`.
  bool schedule = false;
  // The workspace's bytes when known (>= 0): the schedule's launch is refused when they are
  // fewer than it needs (the even paths keep the launchers' contract: SplitWorkspaceBytes).
  int64_t workspace_bytes = -1;
};

// The workspace bytes of the length-aware schedule for `p` on `kernel` on the current device,
// or 0 where it does not apply (batch_invariant, an empty batch, or more than
// kScheduleMaxLaunched CTA groups and requests together; a group is SMs x resident CTAs over
// the row blocks of a request).
int64_t ScheduleWorkspaceBytes(const Params& p, GpuKernel kernel);

// The schedule kernel alone (its tests): for `groups` groups (groups + B at most
// kScheduleMaxLaunched) of tiles of `block_n` positions and the even plan's `even_splits` (0:
// never its cut), writes the entries of groups + B launched groups (4 int32 each), then each
// request's first slot, then its piece count, into `out` ((4 · (groups + B) + 2 · B) · 4
// bytes of device memory).
::attnd::gpu::Error LaunchMlaDecodeScheduleOnly(const Params& p, int32_t groups, int32_t block_n,
                                                int32_t even_splits, void* out,
                                                ::attnd::gpu::Stream stream);

// The partial slots (the split count to size the workspace with, SplitWorkspaceBytes) of the
// wave-balanced plan for `p` on `kernel` on the current device, or 0 where it does not apply:
// batch_invariant, no range slots left over past one per request (B · row blocks >= SMs x
// resident CTAs), or ranges of fewer than two tiles... (BalancedShapeFor). Shapes only, like
// GpuSplits: every request is assumed to fill its table's capacity, and a shorter one leaves
// its pieces' CTAs with less to do.
int BalancedSplits(const Params& p, GpuKernel kernel);

// Runs the decode with `splits` splits (then the combine when splits > 1) on `stream`.
// `workspace` holds SplitWorkspaceBytes(p, splits) bytes (may be null when splits == 1); its
// contents on entry do not matter. Returns an error for a call GpuSupports refuses or `splits`
// outside [1, kMaxSplits].
::attnd::gpu::Error LaunchMlaDecodeSimt(const Params& p, int splits, void* workspace,
                                        ::attnd::gpu::Stream stream);
#if defined(ATTND_GPU_CUDA)
::attnd::gpu::Error LaunchMlaDecodeMma(const Params& p, int splits, void* workspace,
                                       ::attnd::gpu::Stream stream);
::attnd::gpu::Error LaunchMlaDecodeWgmma(const Params& p, int splits, void* workspace,
                                         ::attnd::gpu::Stream stream);
// kWgmmaPp: the same calls at FAST precision (wgmma_pp.cu).
::attnd::gpu::Error LaunchMlaDecodeWgmmaPp(const Params& p, int splits, void* workspace,
                                           ::attnd::gpu::Stream stream);
// kWgmmaSf (wgmma_sf.cu): also an error where the driver will not map the cache.
::attnd::gpu::Error LaunchMlaDecodeWgmmaSf(const Params& p, int splits, void* workspace,
                                           ::attnd::gpu::Stream stream);
// kWgmma or kWgmmaSf with launch options (the bench's variants and their tests); another
// kernel: kErrorInvalidValue.
::attnd::gpu::Error LaunchMlaDecodeWith(GpuKernel kernel, const Params& p, int splits,
                                        void* workspace, ::attnd::gpu::Stream stream,
                                        const DecodeLaunchOptions& options);
#endif

}  // namespace attnd::kernels::mla_decode::gpu
