// Cases of the indexer ops and top-k: indexer_logits, indexer_logits_paged, topk.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/attnctl/builders.h"
#include "client/attnctl/typed_case.h"
#include "kernels/common/fp8.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"
#include "kernels/topk/topk.h"

namespace attnd::attnctl {
namespace {

using kernels::DType;

absl::Status Refused(const std::string& op, const absl::Status& s) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": the preset's dims are refused: ", s.message()));
}

// Causal windows of a chunk of `rows` new tokens at the end of `n` positions:
// row m sees [0, n − rows + m + 1).
void FillCausalWindows(const kernels::Tensor& ks, const kernels::Tensor& ke, int64_t rows,
                       int64_t n) {
  for (int64_t m = 0; m < rows; ++m) {
    ks.ptr<int32_t>()[m] = 0;
    ke.ptr<int32_t>()[m] = static_cast<int32_t>(std::max<int64_t>(0, n - rows + m + 1));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<OpCase>> BuildIndexerLogits(const Dims& d, Rng& rng) {
  namespace op = kernels::indexer_logits;
  const int64_t m = d.at("M"), h = d.at("H"), dim = d.at("D"), n = d.at("N");
  CaseBuilder<op::Params> b(
      "indexer_logits", absl::StrCat("M=", m, " H=", h, " D=", dim, " N=", n, " causal windows"));
  op::Params& p = b.p;
  p.q = b.New(DType::kFp8E4M3, {m, h, dim});
  FillNormal(p.q, rng, 1.0);
  p.k = b.New(DType::kFp8E4M3, {n, dim});
  FillNormal(p.k, rng, 1.0);
  p.k_scale = b.New(DType::kF32, {n});
  FillUniform(p.k_scale, rng, 0.5, 1.5);
  p.weights = b.New(DType::kF32, {m, h});
  FillNormal(p.weights, rng, 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(h, 1))));
  p.ks = b.New(DType::kI32, {m});
  p.ke = b.New(DType::kI32, {m});
  FillCausalWindows(p.ks, p.ke, m, n);
  p.clean_logits = true;
  p.logits = b.New(DType::kF32, {m, n});
  if (absl::Status s = op::Validate(p); !s.ok()) return Refused("indexer_logits", s);
  // FAST (FP8 tensor-core accumulation) against the local CPU run: FAST's statistical L2 bound
  // ceil(D/32)·2^-13 (docs/ACCURACY.md "Indexer logits"); per element bf16-like slack, since the
  // contract's per-element bound scales with Σ|terms|, which this check does not compute.
  b.fast_tolerances["logits"] = {static_cast<double>((dim + 31) / 32) * std::ldexp(1.0, -13), 1e-2,
                                 1e-2};
  return MakeTypedCase(std::move(b), [](const op::Params& q, const kernels::ExecContext& ctx) {
    return op::Run(q, ctx);
  });
}

absl::StatusOr<std::unique_ptr<OpCase>> BuildIndexerLogitsPaged(const Dims& d, Rng& rng) {
  namespace op = kernels::indexer_logits_paged;
  const int64_t batch = d.at("B"), next_n = d.at("NEXT"), h = d.at("H"), dim = d.at("D");
  const int64_t ctx_len = d.at("CTX"), block = d.at("BLOCK");
  if (block < 1 || ctx_len < 1 || dim < 1) {
    return absl::InvalidArgumentError("indexer_logits_paged: BLOCK, CTX, D >= 1");
  }
  const int64_t max_blocks = (ctx_len + block - 1) / block;
  const int64_t num_blocks = batch * max_blocks;
  const int64_t row_bytes = block * (dim + 4);
  CaseBuilder<op::Params> b("indexer_logits_paged",
                            absl::StrCat("B=", batch, " next_n=", next_n, " H=", h, " D=", dim,
                                         " context<=", ctx_len, " block=", block));
  op::Params& p = b.p;
  p.q = b.New(DType::kFp8E4M3, {batch, next_n, h, dim});
  FillNormal(p.q, rng, 1.0);
  p.kv_cache = b.New(DType::kU8, {num_blocks, row_bytes});
  std::normal_distribution<float> key(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.5f, 1.5f);
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    uint8_t* row = p.kv_cache.ptr<uint8_t>() + blk * row_bytes;
    for (int64_t i = 0; i < block * dim; ++i) row[i] = kernels::FloatToFp8E4M3(key(rng));
    for (int64_t t = 0; t < block; ++t) {
      const float s = scale(rng);
      std::memcpy(row + block * dim + 4 * t, &s, sizeof s);
    }
  }
  p.block_size = block;
  p.block_table = b.New(DType::kI32, {batch, max_blocks});
  FillPermutation(p.block_table, num_blocks, rng);
  p.context_lens = b.New(DType::kI32, {batch});
  FillInt(p.context_lens, rng, std::min(ctx_len, std::max<int64_t>(next_n, ctx_len / 2)), ctx_len);
  p.weights = b.New(DType::kF32, {batch * next_n, h});
  FillNormal(p.weights, rng, 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(h, 1))));
  p.logits = b.New(DType::kF32, {batch * next_n, max_blocks * block});
  if (absl::Status s = op::Validate(p); !s.ok()) return Refused("indexer_logits_paged", s);
  // FAST: as indexer_logits' (the same FP8 accumulation and bound; docs/ACCURACY.md).
  b.fast_tolerances["logits"] = {static_cast<double>((dim + 31) / 32) * std::ldexp(1.0, -13), 1e-2,
                                 1e-2};
  return MakeTypedCase(std::move(b), [](const op::Params& q, const kernels::ExecContext& ctx) {
    return op::Run(q, ctx);
  });
}

absl::StatusOr<std::unique_ptr<OpCase>> BuildTopK(const Dims& d, Rng& rng) {
  namespace op = kernels::topk;
  const int64_t m = d.at("M"), n = d.at("N"), k = d.at("K"), page = d.at("PAGE");
  const bool windows = d.at("WINDOWS") != 0;
  CaseBuilder<op::Params> b(
      "topk", absl::StrCat("M=", m, " N=", n, " k=", k, windows ? " causal ks/ke" : " lengths",
                           page > 0 ? absl::StrCat(" page=", page) : ""));
  op::Params& p = b.p;
  p.logits = b.New(DType::kF32, {m, n});
  FillNormal(p.logits, rng, 1.0);
  if (windows) {
    p.ks = b.New(DType::kI32, {m});
    p.ke = b.New(DType::kI32, {m});
    FillCausalWindows(p.ks, p.ke, m, n);
  } else {
    p.lengths = b.New(DType::kI32, {m});
    FillInt(p.lengths, rng, std::min(n, k / 2), n);  // some rows shorter than k: -1 padding
  }
  p.k = k;
  if (page > 0) {
    const int64_t max_blocks = (n + page - 1) / page;
    p.block_table = b.New(DType::kI32, {m, max_blocks});
    FillPermutation(p.block_table, m * max_blocks, rng);
    p.page_size = page;
    p.rows_per_request = 1;
  }
  p.indices = b.New(DType::kI32, {m, k});
  p.values = b.New(DType::kF32, {m, k});
  if (absl::Status s = op::Validate(p); !s.ok()) return Refused("topk", s);
  // Values are compared as per-row sets too: they follow the indices' (free) order.
  return MakeTypedCase(
      std::move(b),
      [](const op::Params& q, const kernels::ExecContext& ctx) { return op::Run(q, ctx); },
      {{"indices", CheckKind::kIndexRows}, {"values", CheckKind::kFloatRows}});
}

}  // namespace attnd::attnctl
