// The DSA layer cases (dsa_attention): the gathered form, and the paged decode form (presets
// with a CTX dim) over an indexer cache and an MLA cache sharing one shuffled block table, as
// vLLM keeps them. The local run is kernels::dsa::Run.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/attnctl/builders.h"
#include "client/attnctl/typed_case.h"
#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"
#include "kernels/dsa/dsa.h"
#include "kernels/sparse_mla/params.h"

namespace attnd::attnctl {
namespace {

using kernels::DType;

// The paged form: B requests of up to CTX tokens (the next_n new ones included; lengths drawn
// in [CTX/2, CTX]) in blocks of BLOCK, indexer H=HI D=DI, sparse MLA H heads of d_qk D, top-TOPK,
// the MLA cache bf16 or (FP8=1) the FP8 656-byte rows.
absl::StatusOr<std::unique_ptr<OpCase>> BuildDsaAttentionPaged(const Dims& d, Rng& rng) {
  const int64_t batch = d.at("B"), next_n = d.at("NEXT"), ctx_len = d.at("CTX");
  const int64_t block = d.at("BLOCK"), hi = d.at("HI"), di = d.at("DI"), topk = d.at("TOPK");
  const int64_t h = d.at("H"), dqk = d.at("D");
  const bool fp8 = d.at("FP8") != 0;
  if (batch < 0 || next_n < 1 || ctx_len < 1 || block < 1 || hi < 1 || di < 1 || topk < 1 ||
      h < 1 || dqk < 1) {
    return absl::InvalidArgumentError(
        "dsa_attention: B >= 0; NEXT, CTX, BLOCK, HI, DI, TOPK, H, D >= 1");
  }
  const int64_t t = batch * next_n, max_blocks = (ctx_len + block - 1) / block;
  const int64_t num_blocks = batch * max_blocks, rows = num_blocks * block;
  CaseBuilder<kernels::dsa::Params> b(
      "dsa_attention",
      absl::StrCat("paged: B=", batch, " next_n=", next_n, " context<=", ctx_len, " block=", block,
                   "; indexer H=", hi, " D=", di, " topk=", topk, "; sparse MLA H=", h,
                   " d_qk=", dqk, fp8 ? " FP8 KV" : " bf16 KV", "; one block table"));
  kernels::dsa::Params& p = b.p;
  p.index_q = b.New(DType::kFp8E4M3, {batch, next_n, hi, di});
  FillNormal(p.index_q, rng, 1.0);
  p.index_weights = b.New(DType::kF32, {t, hi});
  FillNormal(p.index_weights, rng, 1.0 / std::sqrt(static_cast<double>(hi)));
  // The indexer cache: each block's keys, then their f32 scales.
  const int64_t block_bytes = block * (di + 4);
  p.index_cache = b.New(DType::kU8, {num_blocks, block_bytes});
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.5f, 1.5f);
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    uint8_t* row = p.index_cache.ptr<uint8_t>() + blk * block_bytes;
    for (int64_t i = 0; i < block * di; ++i) row[i] = kernels::FloatToFp8E4M3(normal(rng));
    for (int64_t s = 0; s < block; ++s) {
      const float v = scale(rng);
      std::memcpy(row + block * di + 4 * s, &v, sizeof v);
    }
  }
  p.index_block_size = block;
  p.index_block_table = b.New(DType::kI32, {batch, max_blocks});
  FillPermutation(p.index_block_table, num_blocks, rng);
  p.context_lens = b.New(DType::kI32, {batch});
  FillInt(p.context_lens, rng, std::min(ctx_len, std::max<int64_t>(next_n, ctx_len / 2)), ctx_len);
  p.topk = topk;
  p.q = b.New(DType::kBF16, {t, h, dqk});
  FillNormal(p.q, rng, 1.0);
  if (fp8) {  // 512 e4m3 codes, 4 f32 scales, 64 bf16 rope values per row
    namespace sm = kernels::sparse_mla;
    p.kv = b.New(DType::kU8, {rows, sm::kFp8RowBytes});
    std::uniform_real_distribution<float> kv_scale(0.01f, 0.05f);
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* row = p.kv.ptr<uint8_t>() + r * sm::kFp8RowBytes;
      for (int64_t i = 0; i < sm::kDimV; ++i) row[i] = kernels::FloatToFp8E4M3(16 * normal(rng));
      for (int64_t i = 0; i < sm::kDimV / sm::kFp8ScaleCols; ++i) {
        const float v = kv_scale(rng);
        std::memcpy(row + sm::kFp8ScaleOffset + 4 * i, &v, sizeof v);
      }
      for (int64_t i = 0; i < sm::kFp8DimQk - sm::kDimV; ++i) {
        const kernels::bf16_t v = kernels::FloatToBf16(normal(rng));
        std::memcpy(row + sm::kFp8RopeOffset + 2 * i, &v, sizeof v);
      }
    }
  } else {
    p.kv = b.New(DType::kBF16, {rows, dqk});
    FillNormal(p.kv, rng, 1.0);
  }
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dqk)));
  p.out = b.New(DType::kBF16, {t, h, kernels::sparse_mla::kDimV});
  p.lse = b.New(DType::kF32, {t, h});
  p.indices = b.New(DType::kI32, {t, topk});
  if (absl::Status s = kernels::dsa::Validate(p); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("dsa_attention: ", s.message()));
  }
  return MakeTypedCase(std::move(b),
                       [](const kernels::dsa::Params& q, const kernels::ExecContext& ctx) {
                         return kernels::dsa::Run(q, ctx);
                       },
                       {{"indices", CheckKind::kIndexRows}});
}

}  // namespace

absl::StatusOr<std::unique_ptr<OpCase>> BuildDsaAttention(const Dims& d, Rng& rng) {
  if (d.count("CTX") != 0) return BuildDsaAttentionPaged(d, rng);
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
