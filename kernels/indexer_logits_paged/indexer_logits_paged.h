// Host entry of the paged (decode) indexer-logits operator: validation, work counts, the
// implementations (fastest first) and Run = Validate + Dispatch.
//   ATTND_RETURN_IF_ERROR(indexer_logits_paged::Run(params, ctx));
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/indexer_logits_paged/params.h"

namespace attnd::kernels::indexer_logits_paged {

// Checks every dtype, rank, dimension, stride and block_size; INVALID_ARGUMENT names the tensor
// (or scalar) and the dimension with both values. Reads no tensor data: block_table and
// context_lens are untrusted and masked or clamped by the kernels.
absl::Status Validate(const Params& p);

// The visible length of output row b·next_n + j (the clamp of params.h), for either form of
// context_lens. Reads context_lens.
int64_t VisibleLength(const Params& p, int64_t b, int64_t j);

// FLOPs = 2·H·D·Σ_rows L; bytes = q + Σ_b L_b·(D+4) (keys and scales read) + the block-table
// entries read + context_lens (B or B·next_n entries) + weights + 4·(logits written: every column
// of every row), with L_b the longest row of request b (any of its rows with per-token lengths).
// Reads context_lens (host-visible). Requires Validate(p).ok().
WorkCount Count(const Params& p);

const std::vector<Impl<Params>>& Implementations();

// Validate, then run the first implementation for ctx.backend that supports p; *impl receives its
// name. Thread-safe for distinct outputs.
absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl = nullptr);

}  // namespace attnd::kernels::indexer_logits_paged
