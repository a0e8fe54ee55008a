// Host entry of the prefill indexer-logits operator: validation, work counts, the
// implementations (fastest first) and Run = Validate + Dispatch.
//   ATTND_RETURN_IF_ERROR(indexer_logits::Run(params, ctx));
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/indexer_logits/params.h"

namespace attnd::kernels::indexer_logits {

// Checks the heads (dim `heads_dim`) and head dim (the next one) of an already checked q:
// H in [1, kMaxHeads], D a multiple of kHeadDimAlign in [kHeadDimAlign, kMaxHeadDim]. Shared with
// indexer_logits_paged.
absl::Status CheckHeadShape(const Tensor& q, int heads_dim);

// Checks every dtype, rank, dimension and stride; INVALID_ARGUMENT names the tensor and the
// dimension with both values. Reads no tensor data (ks/ke are untrusted and clamped by kernels).
absl::Status Validate(const Params& p);

// FLOPs = 2·H·D·(valid pairs); bytes = q + k·(D+4) + weights + ks/ke + 4·(logits written).
// Reads ks and ke, so they must be host-visible. Requires Validate(p).ok().
WorkCount Count(const Params& p);

const std::vector<Impl<Params>>& Implementations();

// Validate, then run the first implementation for ctx.backend that supports p; *impl receives its
// name. Thread-safe for distinct outputs.
absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl = nullptr);

}  // namespace attnd::kernels::indexer_logits
