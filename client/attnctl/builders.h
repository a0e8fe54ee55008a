// The per-op case builders behind MakeOpCase (cases_attention.cc, cases_indexer.cc,
// cases_dsa.cc): each reads its named dims (presets.cc guarantees they are all present), draws
// random inputs and validates the call with the op's own Validate.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "client/attnctl/cases.h"
#include "client/attnctl/fill.h"
#include "kernels/common/registry.h"

namespace attnd::attnctl {

absl::StatusOr<std::unique_ptr<OpCase>> BuildSparseMla(const Dims& d, Rng& rng);
absl::StatusOr<std::unique_ptr<OpCase>> BuildMlaDecode(const Dims& d, Rng& rng);
absl::StatusOr<std::unique_ptr<OpCase>> BuildMlaPrefill(const Dims& d, Rng& rng);
absl::StatusOr<std::unique_ptr<OpCase>> BuildIndexerLogits(const Dims& d, Rng& rng);
absl::StatusOr<std::unique_ptr<OpCase>> BuildIndexerLogitsPaged(const Dims& d, Rng& rng);
absl::StatusOr<std::unique_ptr<OpCase>> BuildTopK(const Dims& d, Rng& rng);
absl::StatusOr<std::unique_ptr<OpCase>> BuildDsaAttention(const Dims& d, Rng& rng);

// A random permutation of [0, n) written into the first n elements of an i32 tensor's storage
// (dense), for block tables.
void FillPermutation(const kernels::Tensor& t, int64_t n, Rng& rng);

}  // namespace attnd::attnctl
