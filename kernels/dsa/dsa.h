// Fused DSA attention layer: the host entry. Validate checks the whole call (each step's
// constraints, with messages naming this op's tensors), Count gives FLOPs and logical bytes,
// Run validates and dispatches.
//   ATTND_RETURN_IF_ERROR(dsa::Run(params, ctx));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/dsa/params.h"
#include "kernels/indexer_logits/params.h"
#include "kernels/sparse_mla/params.h"
#include "kernels/topk/params.h"

namespace attnd::kernels::dsa {

inline constexpr int64_t kMaxTopk = 4096;

// Every shape, dtype, stride and scalar of the three steps plus their agreement (T, N, topk).
// INVALID_ARGUMENT names the tensor as this op calls it (index_q, index_k, …). Reads no data.
absl::Status Validate(const Params& p);

// FLOPs: the indexer's 2·H_i·D_i per in-window (token, row) pair plus sparse MLA's
// 2·H·(d_qk + 512)·E, E = Σ_t min(topk, window_t). Logical bytes: each input read once (kv: one
// row per selection: 2·d_qk bytes bf16, 656 FP8), each output written once; the logits are
// internal and not counted.
// Reads ks / ke (host-resident calls only).
WorkCount Count(const Params& p);

// The three steps' params for tokens [t0, t0 + count) of p, with the given logits scratch and
// indices (each [count, …]); the building blocks of the CPU implementation and the tests.
indexer_logits::Params IndexerStep(const Params& p, int64_t t0, int64_t count,
                                   const Tensor& logits);
topk::Params TopkStep(const Params& p, int64_t t0, int64_t count, const Tensor& logits,
                      const Tensor& indices);
sparse_mla::Params SparseMlaStep(const Params& p, int64_t t0, int64_t count, const Tensor& indices);

const std::vector<Impl<Params>>& Implementations();

// Validate + Dispatch. *impl (optional) receives the implementation's name.
absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl = nullptr);

}  // namespace attnd::kernels::dsa
