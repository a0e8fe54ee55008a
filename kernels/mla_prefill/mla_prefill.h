// Host entry of the dense MLA prefill: validation, work counts, the implementation list and Run.
//   ATTND_RETURN_IF_ERROR(mla_prefill::Run(params, ctx));
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/mla_prefill/params.h"

namespace attnd::kernels::mla_prefill {

// Checks every dtype, rank, dimension, stride and scalar; INVALID_ARGUMENT names the tensor.
// cu_seqlens contents are data (possibly device-resident): CheckCuSeqlens checks them.
absl::Status Validate(const Params& p);

// The data check the CPU implementation runs before touching anything: both cu_seqlens start
// at 0, never decrease, and end at most at total_q / total_k. Reads host memory.
absl::Status CheckCuSeqlens(const Params& p);

// FLOPs 2·H·(d_qk + d_v) per valid (query, key) pair; bytes = q + k + v + out + lse + both
// cu_seqlens. Reads cu_seqlens (host-readable); tolerates malformed contents (counts what
// CheckCuSeqlens would accept, clamped). p must have passed Validate.
WorkCount Count(const Params& p);

// Fastest first; each with a Supports predicate that never advertises shapes it refuses.
const std::vector<Impl<Params>>& Implementations();

// Validate + Dispatch. *impl receives the chosen implementation's name.
absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl = nullptr);

namespace internal {
// The CPU implementation (cpu.cc): CheckCuSeqlens, then the attention; p validated.
absl::Status RunCpu(const Params& p, const ExecContext& ctx);
// Keys [0, limit) query i of a sequence with lq queries and lk keys sees; 0 <= limit <= lk.
inline int64_t KeyLimit(int64_t i, int64_t lq, int64_t lk, bool causal) {
  if (!causal) return lk;
  const int64_t lim = i + lk - lq + 1;
  return lim < 0 ? 0 : (lim > lk ? lk : lim);
}
}  // namespace internal

}  // namespace attnd::kernels::mla_prefill
