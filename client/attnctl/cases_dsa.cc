// The DSA layer case (dsa_attention); the local run is kernels::dsa::Run.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "client/attnctl/builders.h"
#include "client/attnctl/typed_case.h"
#include "kernels/dsa/dsa.h"
#include "kernels/sparse_mla/params.h"

namespace attnd::attnctl {

absl::StatusOr<std::unique_ptr<OpCase>> BuildDsaAttention(const Dims& d, Rng& rng) {
  const int64_t t = d.at("T"), n = d.at("N"), hi = d.at("HI"), di = d.at("DI");
  const int64_t topk = d.at("TOPK"), h = d.at("H"), dqk = d.at("D");
  using kernels::DType;
  if (t < 1 || n < 1 || hi < 1 || di < 1 || topk < 1 || h < 1 || dqk < 1) {
    return absl::InvalidArgumentError("dsa_attention: every dim must be >= 1");
  }
  CaseBuilder<kernels::dsa::Params> b(
      "dsa_attention", absl::StrCat("T=", t, " N=S=", n, " indexer H=", hi, " D=", di,
                                    " topk=", topk, "; sparse MLA H=", h, " d_qk=", dqk));
  kernels::dsa::Params& p = b.p;
  p.index_q = b.New(DType::kFp8E4M3, {t, hi, di});
  FillNormal(p.index_q, rng, 1.0);
  p.index_k = b.New(DType::kFp8E4M3, {n, di});
  FillNormal(p.index_k, rng, 1.0);
  p.index_k_scale = b.New(DType::kF32, {n});
  FillUniform(p.index_k_scale, rng, 0.5, 1.5);
  p.index_weights = b.New(DType::kF32, {t, hi});
  FillNormal(p.index_weights, rng, 1.0 / std::sqrt(static_cast<double>(hi > 0 ? hi : 1)));
  // Causal windows: the T new tokens are the last T of the N cached positions.
  p.ks = b.New(DType::kI32, {t});
  p.ke = b.New(DType::kI32, {t});
  for (int64_t i = 0; i < t; ++i) {
    p.ks.ptr<int32_t>()[i] = 0;
    p.ke.ptr<int32_t>()[i] = static_cast<int32_t>(std::max<int64_t>(0, n - t + i + 1));
  }
  p.topk = topk;
  p.q = b.New(DType::kBF16, {t, h, dqk});
  FillNormal(p.q, rng, 1.0);
  p.kv = b.New(DType::kBF16, {n, dqk});
  FillNormal(p.kv, rng, 1.0);
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dqk > 0 ? dqk : 1)));
  p.out = b.New(DType::kBF16, {t, h, kernels::sparse_mla::kDimV});
  p.lse = b.New(DType::kF32, {t, h});
  p.indices = b.New(DType::kI32, {t, topk});
  // dsa::Validate runs in the local run (and in the daemon).
  return MakeTypedCase(std::move(b),
                       [](const kernels::dsa::Params& q, const kernels::ExecContext& ctx) {
                         return kernels::dsa::Run(q, ctx);
                       },
                       {{"indices", CheckKind::kIndexRows}});
}

}  // namespace attnd::attnctl
