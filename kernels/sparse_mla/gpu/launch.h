// Sparse MLA on the GPU: launchers (capture-safe: they never allocate or synchronise; split-K
// scratch comes from the caller's workspace) and the split-K plan the host entry and its
// workspace size share. Params point to device memory; the call was validated.
//   const int splits = sparse_mla::GpuSplits(p, GpuKernel::kMma);
//   GPU_RETURN_IF_ERROR(sparse_mla::LaunchSparseMlaMma(p, splits, workspace, stream));
#pragma once

#include <stdint.h>

#include <string>

#include "kernels/common/gpu/vendor.h"
#include "kernels/sparse_mla/invariant_plan.h"
#include "kernels/sparse_mla/params.h"

namespace attnd::kernels::sparse_mla::gpu {

enum class GpuKernel {
  kSimt,     // portable CUDA/HIP: one token x 16 heads per CTA, 32-row KV chunks, f32 FMA
  kMma,      // CUDA sm_80+: one token x up to 64 heads per CTA, 64-row KV tiles, bf16 mma.sync
  kMmaLowH,  // CUDA sm_80+, H <= 32: 64 / H tokens per CTA stacked into 64 rows, their
             // selections gathered once as a union (mma_lowh.cuh), bf16 mma.sync
  kWgmma,    // CUDA sm_90a, H % 64 == 0, either KV format: one token x 64 heads per CTA, three
             // warpgroups (producer, softmax + left P·V, right P·V), wgmma (wgmma.cuh)
  kWgmmaPp,  // CUDA sm_90a, H % 64 == 0 or H < 64 (padded), bf16 cache, FAST only: kWgmma's CTA
             // with the blocks in pairs and both consumers running Q·Kᵀ and softmax in
             // ping-pong (wgmma_pp.cuh)
};

inline constexpr int kMaxSplits = 32;
static_assert(kInvariantMaxSplits == kMaxSplits, "invariant_plan.h caps splits alike");

// Whether `kernel` can run `p` on the current device; otherwise false with the reason.
// Both need q and kv 16-byte aligned (base and leading strides multiples of 8 elements; an FP8
// cache's row stride a multiple of 16 bytes) and out 4-byte aligned (even strides);
// T·ceil(H / heads per CTA) < 2^31. kMmaLowH refuses p.batch_invariant (a token's result
// depends on the neighbours it is stacked with). kMma also needs compute capability >= 8.0 and its
// shared memory (up to 226 KiB at H > 32, d_qk 576) per block. kSimt, kMma and kWgmma read either
// KV format.
bool GpuSupports(GpuKernel kernel, const Params& p, std::string* why);

// Split-K count for `p` on the current device: 1 when the (token, head block) work items
// already fill the machine. Heuristic: items = T·ceil(H / heads per CTA), slots = SMs x CTAs
// per SM; the fewest splits s whose waves are at least 3/4 full (items·s >= 0.75·slots·
// ceil(items·s / slots)), at most kMaxSplits and at most half the 64-slot blocks of the widest
// row (K for a table, nnz for CSR) so every split has at least two blocks of work.
// With p.batch_invariant: InvariantGridSplits(p) (invariant_plan.h), from K alone, for every
// kernel; the device, T and H play no part.
int GpuSplits(const Params& p, GpuKernel kernel);

// Workspace bytes for `splits` (0 when splits == 1): partial O f32 [splits, T, H, 512] and
// partial LSE f32 [splits, T, H].
int64_t SplitWorkspaceBytes(const Params& p, int splits);

// The largest split count <= `splits` whose workspace fits in `bytes` (1 always fits).
int SplitsThatFit(const Params& p, int splits, int64_t bytes);

// Runs sparse MLA with `splits` splits (then the combine when splits > 1) on `stream`.
// `workspace` holds SplitWorkspaceBytes(p, splits) bytes (may be null when splits == 1); its
// contents on entry do not matter. `gate` (kMma, kMmaLowH and the combine; null: always run):
// a device word; every CTA returns at entry unless *gate == gate_open (cuda_mma_auto below).
::attnd::gpu::Error LaunchSparseMlaSimt(const Params& p, int splits, void* workspace,
                                        ::attnd::gpu::Stream stream);
#if defined(ATTND_GPU_CUDA)
::attnd::gpu::Error LaunchSparseMlaMma(const Params& p, int splits, void* workspace,
                                       ::attnd::gpu::Stream stream, const int32_t* gate = nullptr,
                                       int32_t gate_open = 0);
::attnd::gpu::Error LaunchSparseMlaMmaLowh(const Params& p, int splits, void* workspace,
                                           ::attnd::gpu::Stream stream,
                                           const int32_t* gate = nullptr, int32_t gate_open = 0);
// kWgmma: splits from GpuSplits' heuristic (one CTA per SM).
::attnd::gpu::Error LaunchSparseMlaWgmma(const Params& p, int splits, void* workspace,
                                         ::attnd::gpu::Stream stream);
// kWgmmaPp: the same, FAST precision and the bf16 cache only; H a multiple of 64 or below 64
// (padded). `gate` as for kMma (cuda_mma_auto runs it gated where it is the alternative).
::attnd::gpu::Error LaunchSparseMlaWgmmaPp(const Params& p, int splits, void* workspace,
                                           ::attnd::gpu::Stream stream,
                                           const int32_t* gate = nullptr, int32_t gate_open = 0);

// cuda_mma_auto (mma_auto.cu), H <= 32 with a bf16 cache: kMmaLowH where the 64 / H
// neighbouring tokens it stacks share most of their rows, else its alternative
// (MmaAutoAlternative: kWgmmaPp where that runs, else kMma), decided on the device. A memset and
// an estimate kernel sample up to kAutoSampleGroups of those token groups (kAutoBlocksPerGroup
// lockstep blocks each, as kMmaLowH walks them) into an MmaAutoHeader at the start of the
// workspace; then both kernels are launched, gated by header.choice, each with its own split
// count and workspace region. Capture-safe: the host never reads the selection.
// Workspace: header (32 B) | the alternative's split partials | kMmaLowH's, at 16-byte aligned
// offsets.
inline constexpr int kAutoSampleGroups = 32;
inline constexpr int kAutoBlocksPerGroup = 4;
inline constexpr int32_t kAutoChoseMma = 0;
inline constexpr int32_t kAutoChoseLowh = 1;
inline constexpr int32_t kAutoChosePp = 2;
struct MmaAutoHeader {    // test hook: copy it back after a run to see what was chosen
  int32_t choice;         // kAutoChoseLowh, or the alternative's kAutoChoseMma / kAutoChosePp
  int32_t union_rows;     // Σ over the sampled blocks: distinct valid rows
  int32_t valid_entries;  //   entries with 0 <= index < S
  int32_t walked_slots;   //   entries inside their token's row (what kMma walks)
  uint64_t sums;          // internal: the estimate CTAs' packed running sums
  int32_t reserved[2];
};
static_assert(sizeof(MmaAutoHeader) == 32, "the header is two 16-byte units");
// The rule (its measurements in mma_auto.cu): kMmaLowH when x = union_rows / walked_slots is
// below a threshold per group size, else the alternative (also on ties and when nothing was
// walked). Against kMma: x < 1/2 with 2 tokens a group (H 17-32), 9/20 with 4 (H 9-16), 2/5
// with 8 (H <= 8). Against kWgmmaPp (`against_pp`), which costs about 0.69 of kMma at H 16:
// x < 1/8, 7/25, 3/10.
constexpr bool MmaAutoPicksLowh(int64_t union_rows, int64_t walked_slots, int group_tokens,
                                bool against_pp = false) {
  if (walked_slots <= 0) return false;
  if (against_pp) {
    return group_tokens >= 8   ? 10 * union_rows < 3 * walked_slots
           : group_tokens >= 4 ? 25 * union_rows < 7 * walked_slots
                               : 8 * union_rows < walked_slots;
  }
  return group_tokens >= 8   ? 5 * union_rows < 2 * walked_slots
         : group_tokens >= 4 ? 20 * union_rows < 9 * walked_slots
                             : 2 * union_rows < walked_slots;
}
// Both kMmaLowH and kMma support `p`.
bool MmaAutoSupports(const Params& p, std::string* why);
// cuda_mma_auto's kernel where kMmaLowH is not chosen: kWgmmaPp where it supports `p` (sm_90a,
// FAST), else kMma.
GpuKernel MmaAutoAlternative(const Params& p);
// Header + the two kernels' split workspaces (their GpuSplits).
int64_t MmaAutoWorkspaceBytes(const Params& p);
// `workspace` holds `bytes` bytes (16-byte aligned); split counts shrink to fit. With no room
// for the header (null or < 32 bytes) it runs kMma with one split, ungated.
::attnd::gpu::Error LaunchSparseMlaMmaAuto(const Params& p, void* workspace, int64_t bytes,
                                           ::attnd::gpu::Stream stream);
#endif

// Merges the `splits` partials in `workspace` into p.out and p.lse (a block per (token, head)).
::attnd::gpu::Error LaunchSparseMlaCombine(const Params& p, int splits, const void* workspace,
                                           ::attnd::gpu::Stream stream,
                                           const int32_t* gate = nullptr, int32_t gate_open = 0);

}  // namespace attnd::kernels::sparse_mla::gpu
