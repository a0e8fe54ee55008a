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

}  // namespace attnd::kernels::dsa
