// The CPU implementation of the paged indexer logits (threads from ctx.pool over requests, query
// blocks and key chunks; f32 GEMM on decoded fp8 pages). Called through Implementations().
#pragma once

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/indexer_logits_paged/params.h"

namespace attnd::kernels::indexer_logits_paged {

// Requires Validate(p).ok().
absl::Status RunCpu(const Params& p, const ExecContext& ctx);

}  // namespace attnd::kernels::indexer_logits_paged
