// The CPU implementation of top-k (the daemon's default backend): rows spread over ctx.pool, each
// row selected by RowSelector, then mapped to KV slots and written out.
#pragma once

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/topk/params.h"

namespace attnd::kernels::topk {

// Runs top-k on the CPU. `p` must have passed Validate(); thread-safe for distinct outputs.
absl::Status RunCpu(const Params& p, const ExecContext& ctx);

}  // namespace attnd::kernels::topk
