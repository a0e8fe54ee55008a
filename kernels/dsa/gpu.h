// The fused DSA layer on a GPU: the steps' own GPU implementations (indexer logits, or the paged
// indexer -> top-k, mapping positions to kv rows in the paged form -> sparse MLA) run in order
// on the caller's stream, in blocks of tokens (whole requests when paged), with the logits,
// indices and (paged) top-k lengths scratch (when the caller does not place them; the lengths
// by one stream-ordered memset) and the steps' workspaces carved from the caller's workspace.
// Capture-safe because its steps are: no allocation, no synchronisation.
//   GpuImpl<Params>("steps", GpuSupports, RunGpu, GpuWorkspaceBytes)   // "cuda_steps"
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/dsa/params.h"

namespace attnd::kernels::dsa {

// Rows of logits scratch per block are capped so that the scratch stays under this.
inline constexpr int64_t kGpuLogitsScratchBytes = int64_t{256} << 20;

// True when every step has a GPU implementation for the call (with scratch as RunGpu lays it
// out); else false naming the step and its refusals.
bool GpuSupports(const Params& p, std::string* why);
// Scratch (logits, indices when absent) plus the largest step workspace.
int64_t GpuWorkspaceBytes(const Params& p);
// Validated params on the device; ctx.workspace holds GpuWorkspaceBytes(p) bytes.
absl::Status RunGpu(const Params& p, const ExecContext& ctx);

#if defined(ATTND_GPU_CUDA)
// The indexer → top-k candidate form ("cuda_fused_topk"; docs/KERNELS.md "Indexer → top-k
// candidates"): the gathered form with index_precision FAST, H_idx 64, no logits asked for. Per
// block of token rows the FP8 wgmma indexer writes each row's top-k candidates instead of its
// logits, one select kernel picks the k from them (the filter's output on the same logits),
// then sparse MLA. Listed after cuda_steps, so it runs only when asked for by name (tests,
// benchmarks) until it is measured faster.
inline constexpr int64_t kGpuCandidateScratchBytes = int64_t{512} << 20;
bool FusedTopkSupports(const Params& p, std::string* why);
int64_t FusedTopkWorkspaceBytes(const Params& p);
absl::Status RunFusedTopk(const Params& p, const ExecContext& ctx);
// The same with the candidate appends on the indexer's helper warps ("cuda_fused_topk_hw";
// indexer_logits::gpu::WgmmaCandidates::helpers), listed after it: by name only until measured.
absl::Status RunFusedTopkHelpers(const Params& p, const ExecContext& ctx);
#endif

}  // namespace attnd::kernels::dsa
