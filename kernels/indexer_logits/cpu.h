// The CPU implementation of the prefill indexer logits (threads from ctx.pool over query blocks
// and key chunks; f32 GEMM on decoded fp8 tiles). Called through Implementations().
#pragma once

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/indexer_logits/params.h"

namespace attnd::kernels::indexer_logits {

// Requires Validate(p).ok().
absl::Status RunCpu(const Params& p, const ExecContext& ctx);

}  // namespace attnd::kernels::indexer_logits
