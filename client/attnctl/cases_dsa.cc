// The DSA layer case (dsa_attention) and its local three-step reference.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "client/attnctl/builders.h"
#include "client/attnctl/typed_case.h"
#include "kernels/common/status.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "kernels/topk/topk.h"

namespace attnd::attnctl {

absl::Status RunDsaLocally(const client::DsaAttentionParams& p, const kernels::ExecContext& ctx) {
  if (!p.q.present() || !p.index_k.present()) {
    return absl::InvalidArgumentError("dsa_attention: q and index_k are required");
  }
  const int64_t t = p.q.dim(0), n = p.index_k.dim(0);
  client::HostArray logits = client::HostArray::Dense(kernels::DType::kF32, {t, n});
  kernels::indexer_logits::Params ip;
  ip.q = p.index_q;
  ip.k = p.index_k;
  ip.k_scale = p.index_k_scale;
  ip.weights = p.index_weights;
  ip.ks = p.ks;
  ip.ke = p.ke;
  ip.clean_logits = true;
  ip.logits = logits.view();
  ATTND_RETURN_IF_ERROR(kernels::indexer_logits::Run(ip, ctx));

  client::HostArray chosen;
  kernels::Tensor indices = p.indices;
  if (!indices.present()) {
    chosen = client::HostArray::Dense(kernels::DType::kI32, {t, p.topk});
    indices = chosen.view();
  }
  kernels::topk::Params tp;
  tp.logits = logits.view();
  tp.ks = p.ks;
  tp.ke = p.ke;
  tp.k = p.topk;
  tp.indices = indices;
  ATTND_RETURN_IF_ERROR(kernels::topk::Run(tp, ctx));

  kernels::sparse_mla::Params sp;
  sp.q = p.q;
  sp.kv = p.kv;
  sp.indices = indices;
  sp.sm_scale = p.sm_scale;
  sp.precision = p.precision;
  sp.out = p.out;
  sp.lse = p.lse;
  return kernels::sparse_mla::Run(sp, ctx);
}

absl::StatusOr<std::unique_ptr<OpCase>> BuildDsaAttention(const Dims& d, Rng& rng) {
  const int64_t t = d.at("T"), n = d.at("N"), hi = d.at("HI"), di = d.at("DI");
  const int64_t topk = d.at("TOPK"), h = d.at("H"), dqk = d.at("D");
  using kernels::DType;
  if (t < 1 || n < 1 || hi < 1 || di < 1 || topk < 1 || h < 1 || dqk < 1) {
    return absl::InvalidArgumentError("dsa_attention: every dim must be >= 1");
  }
  CaseBuilder<client::DsaAttentionParams> b(
      "dsa_attention", absl::StrCat("T=", t, " N=S=", n, " indexer H=", hi, " D=", di,
                                    " topk=", topk, "; sparse MLA H=", h, " d_qk=", dqk));
  client::DsaAttentionParams& p = b.p;
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
  // Each step's Validate runs in the local run (and in the daemon).
  return MakeTypedCase(std::move(b), RunDsaLocally, {{"indices", CheckKind::kIndexRows}});
}

}  // namespace attnd::attnctl
