// The CPU implementation of the fused DSA layer (cpu.cc): the three steps' own Run() on blocks
// of tokens, for the implementation list in dsa.cc and the tests.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/dsa/params.h"

namespace attnd::kernels::dsa {

// Internal logits scratch per block of tokens when the caller passes none.
inline constexpr int64_t kScratchBytes = int64_t{64} << 20;
// The most internal logits scratch one block may need when a single request's rows already
// exceed the budget above (a paged call's N is max_blocks · index_block_size, scalars rather than
// data it sends): past it the call is RESOURCE_EXHAUSTED (docs/CONTRACTS.md "dsa_attention").
inline constexpr int64_t kMaxScratchBytes = int64_t{1} << 30;

// Validated params on ctx.pool, tokens in blocks whose logits fit `scratch_bytes` (one block of
// all T tokens when p.logits is given). Each step's error comes back with the step's name.
absl::Status RunCpuWithScratch(const Params& p, const ExecContext& ctx, int64_t scratch_bytes);

inline absl::Status RunCpu(const Params& p, const ExecContext& ctx) {
  return RunCpuWithScratch(p, ctx, kScratchBytes);
}

}  // namespace attnd::kernels::dsa
