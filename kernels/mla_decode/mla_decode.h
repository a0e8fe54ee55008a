// Host entry of the dense MLA decode: validation, work counts, the implementation list and Run.
//   ATTND_RETURN_IF_ERROR(mla_decode::Run(params, ctx));
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/mla_decode/params.h"

namespace attnd::kernels::mla_decode {

// Checks every dtype, rank, dimension, stride and scalar; INVALID_ARGUMENT names the tensor.
// Data (block table entries, sequence lengths) is not checked here: kernels mask it.
absl::Status Validate(const Params& p);

// FLOPs 2·H·(d_qk + 512) per visible (row, readable token) pair; bytes = Q + 2·d_qk (bf16) or
// d_qk (per-tensor FP8) per distinct token read + O + LSE + block table + seqlens. Reads
// cache_seqlens and block_table, so both must be host-readable; p must have passed Validate.
WorkCount Count(const Params& p);

// Fastest first; each with a Supports predicate that never advertises shapes it refuses.
const std::vector<Impl<Params>>& Implementations();

// Validate + Dispatch. *impl receives the chosen implementation's name.
absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl = nullptr);

namespace internal {
// The CPU implementation (cpu.cc); p validated.
absl::Status RunCpu(const Params& p, const ExecContext& ctx);
// min(cache_seqlens[b] clamped at 0, max_pages·page_size): the request's readable extent.
int64_t ClampedSeqlen(const Params& p, int64_t b);
// Tokens (from position 0) that query row i of s_q sees, before page masking; >= 0.
inline int64_t VisibleLimit(int64_t seqlen, int64_t s_q, int64_t i, bool causal) {
  if (!causal) return seqlen;
  const int64_t lim = seqlen - s_q + i + 1;
  return lim < 0 ? 0 : lim;
}
}  // namespace internal

}  // namespace attnd::kernels::mla_decode
