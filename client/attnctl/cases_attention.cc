// Cases of the attention ops: sparse_mla, mla_decode, mla_prefill.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "client/attnctl/builders.h"
#include "client/attnctl/typed_case.h"
#include "kernels/mla_decode/mla_decode.h"
#include "kernels/mla_prefill/mla_prefill.h"
#include "kernels/sparse_mla/sparse_mla.h"

namespace attnd::attnctl {
namespace {

using kernels::DType;

absl::Status Refused(const std::string& op, const absl::Status& s) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": the preset's dims are refused: ", s.message()));
}

}  // namespace

void FillPermutation(const kernels::Tensor& t, int64_t n, Rng& rng) {
  std::vector<int32_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::copy(perm.begin(), perm.end(), t.ptr<int32_t>());
}

absl::StatusOr<std::unique_ptr<OpCase>> BuildSparseMla(const Dims& d, Rng& rng) {
  namespace op = kernels::sparse_mla;
  const int64_t t = d.at("T"), h = d.at("H"), dqk = d.at("D"), s = d.at("S"), k = d.at("K");
  const int64_t mask_pct = d.at("MASK_PCT");
  CaseBuilder<op::Params> b("sparse_mla", absl::StrCat("T=", t, " H=", h, " d_qk=", dqk, " S=", s,
                                                       " K=", k, " masked=", mask_pct, "%"));
  op::Params& p = b.p;
  p.q = b.New(DType::kBF16, {t, h, dqk});
  FillNormal(p.q, rng, 1.0);
  p.kv = b.New(DType::kBF16, {s, dqk});
  FillNormal(p.kv, rng, 1.0);
  p.indices = b.New(DType::kI32, {t, k});
  FillInt(p.indices, rng, 0, std::max<int64_t>(s - 1, 0));
  std::uniform_int_distribution<int64_t> pct(0, 99);
  for (int64_t i = 0; i < t * k; ++i) {
    if (pct(rng) < mask_pct) p.indices.ptr<int32_t>()[i] = -1;  // masked slot
  }
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dqk)));
  p.out = b.New(DType::kBF16, {t, h, op::kDimV});
  p.lse = b.New(DType::kF32, {t, h});
  if (absl::Status s2 = op::Validate(p); !s2.ok()) return Refused("sparse_mla", s2);
  return MakeTypedCase(std::move(b), [](const op::Params& q, const kernels::ExecContext& ctx) {
    return op::Run(q, ctx);
  });
}

absl::StatusOr<std::unique_ptr<OpCase>> BuildMlaDecode(const Dims& d, Rng& rng) {
  namespace op = kernels::mla_decode;
  const int64_t batch = d.at("B"), sq = d.at("SQ"), h = d.at("H"), dqk = d.at("D");
  const int64_t ctx_len = d.at("CTX"), page = d.at("PAGE");
  const bool causal = d.at("CAUSAL") != 0;
  if (page < 1 || ctx_len < 1) return absl::InvalidArgumentError("mla_decode: PAGE, CTX >= 1");
  const int64_t max_pages = (ctx_len + page - 1) / page;
  const int64_t num_pages = batch * max_pages;
  CaseBuilder<op::Params> b(
      "mla_decode", absl::StrCat("B=", batch, " s_q=", sq, " H=", h, " d_qk=", dqk,
                                 " context<=", ctx_len, " page=", page, causal ? " causal" : ""));
  op::Params& p = b.p;
  p.q = b.New(DType::kBF16, {batch, sq, h, dqk});
  FillNormal(p.q, rng, 1.0);
  p.kv_cache = b.New(DType::kBF16, {num_pages, page, dqk});
  FillNormal(p.kv_cache, rng, 1.0);
  p.block_table = b.New(DType::kI32, {batch, max_pages});
  FillPermutation(p.block_table, num_pages, rng);
  p.cache_seqlens = b.New(DType::kI32, {batch});
  FillInt(p.cache_seqlens, rng, std::min(ctx_len, std::max<int64_t>(sq, ctx_len / 2)), ctx_len);
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dqk)));
  p.causal = causal;
  p.out = b.New(DType::kBF16, {batch, sq, h, op::kDv});
  p.lse = b.New(DType::kF32, {batch, sq, h});
  if (absl::Status s = op::Validate(p); !s.ok()) return Refused("mla_decode", s);
  return MakeTypedCase(std::move(b), [](const op::Params& q, const kernels::ExecContext& ctx) {
    return op::Run(q, ctx);
  });
}

absl::StatusOr<std::unique_ptr<OpCase>> BuildMlaPrefill(const Dims& d, Rng& rng) {
  namespace op = kernels::mla_prefill;
  const int64_t batch = d.at("B"), lq = d.at("LQ"), lk = d.at("LK"), h = d.at("H");
  const int64_t hkv = d.at("HKV"), dqk = d.at("DQK"), dv = d.at("DV");
  const bool causal = d.at("CAUSAL") != 0;
  if (batch < 1 || lq < 1 || lk < lq) {
    return absl::InvalidArgumentError("mla_prefill: want B >= 1, LQ >= 1, LK >= LQ");
  }
  // Sequence i is shorter than the first by i·LQ/(2B) queries; its keys exceed its queries by
  // LK − LQ (a chunk after a cached prefix: bottom-right aligned causal mask).
  std::vector<int32_t> cu_q = {0}, cu_k = {0};
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t q = std::max<int64_t>(1, lq - i * lq / (2 * batch));
    cu_q.push_back(static_cast<int32_t>(cu_q.back() + q));
    cu_k.push_back(static_cast<int32_t>(cu_k.back() + q + (lk - lq)));
  }
  const int64_t total_q = cu_q.back(), total_k = cu_k.back();
  CaseBuilder<op::Params> b(
      "mla_prefill", absl::StrCat("B=", batch, " q<=", lq, " k<=", lk, " H=", h, " H_kv=", hkv,
                                  " d_qk=", dqk, " d_v=", dv, causal ? " causal" : ""));
  op::Params& p = b.p;
  p.q = b.New(DType::kBF16, {total_q, h, dqk});
  FillNormal(p.q, rng, 1.0);
  p.k = b.New(DType::kBF16, {total_k, hkv, dqk});
  FillNormal(p.k, rng, 1.0);
  p.v = b.New(DType::kBF16, {total_k, hkv, dv});
  FillNormal(p.v, rng, 1.0);
  p.cu_seqlens_q = b.New(DType::kI32, {batch + 1});
  std::copy(cu_q.begin(), cu_q.end(), p.cu_seqlens_q.ptr<int32_t>());
  p.cu_seqlens_k = b.New(DType::kI32, {batch + 1});
  std::copy(cu_k.begin(), cu_k.end(), p.cu_seqlens_k.ptr<int32_t>());
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dqk)));
  p.causal = causal;
  p.out = b.New(DType::kBF16, {total_q, h, dv});
  p.lse = b.New(DType::kF32, {total_q, h});
  if (absl::Status s = op::Validate(p); !s.ok()) return Refused("mla_prefill", s);
  return MakeTypedCase(std::move(b), [](const op::Params& q, const kernels::ExecContext& ctx) {
    return op::Run(q, ctx);
  });
}

}  // namespace attnd::attnctl
