// Checks of a paged DsaAttention call against the fp64 reference composed from the steps'
// references (shared by the paged tests): the paged indexer's logits give each token's true
// top-k positions, the block table gives the kv row of each position, and sparse MLA's reference
// on those rows gives out and lse.
//   PagedDsaCase c(spec, rng);  c.SetContexts({70, 3});  ExpectMatchesReference(c);
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/dsa/params.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/kernels/dsa/paged_case.h"

namespace attnd::testing {

inline constexpr Tolerance kPagedOutTol{4e-3, 2e-5, 4e-3};
inline constexpr Tolerance kPagedLseTol{1e-5, 1e-4, 0.0};

std::vector<uint8_t> Bits(const HostTensor& t);

// Runs p on the CPU implementation once per index precision (`outputs` poisoned first), calls
// check(p) after each run, and expects the same bytes of `compared` from both: the CPU runs a
// FAST indexer as its exact sums (docs/ACCURACY.md "Indexer logits, FAST"). Both forms.
void ExpectCpuIndexPrecisionsAgree(kernels::dsa::Params p, const std::vector<HostTensor*>& outputs,
                                   const std::vector<const HostTensor*>& compared,
                                   const std::function<void(const kernels::dsa::Params&)>& check);

// Token j of request b's visible positions, from context_lens as the contract states it
// (clamped to [0, N] and to the index table).
int64_t ExpectedLength(const kernels::dsa::Params& p, int64_t b, int64_t j);

// Every token's indices: the kv rows of a true top-k of its eligible positions (visible, and in
// an index block whose id is in range of index_cache; within both logits' f32 bound, or FAST's
// bound with index_precision FAST), min(k, eligible) of them in ascending position order, then
// -1. A visible position the reference masks must sit in a block whose id is out of range.
void ExpectPagedTopk(const kernels::dsa::Params& p, const HostTensor& indices);

// Every implementation in both precisions: selection (ExpectPagedTopk), then out / lse against
// sparse MLA's fp64 reference on the rows chosen; empty windows give out 0 and lse -inf.
// gpu_on_rounded_kv: the GPU implementations against the reference on the bf16-rounded copy of
// a per-tensor FP8 cache (a scale that is not a power of two; docs/ACCURACY.md); the CPU always
// against the exact decode. index_precision: the indexer step's (its selection checked against
// that precision's bound).
void ExpectMatchesReference(PagedDsaCase& c, bool gpu_on_rounded_kv = false,
                            kernels::Precision index_precision = kernels::Precision::kHigh);

}  // namespace attnd::testing
