// Fused DSA validation (one row per malformed input: INVALID_ARGUMENT naming the tensor as this
// op calls it) and the FLOP / logical-byte counts.
#include <functional>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "kernels/dsa/dsa.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "tests/harness/harness.h"
#include "tests/kernels/dsa/dsa_case.h"

namespace attnd::testing {
namespace {

using kernels::DType;
using kernels::dsa::Params;
using kernels::dsa::Validate;

struct Mutation {
  const char* what;
  std::function<void(Params&)> apply;
  const char* tensor;  // the message must start with "<tensor>:"
};

float dummy_f32[64];

const std::vector<Mutation>& Mutations() {
  static const auto* rows = new std::vector<Mutation>{
      {"index_q missing", [](Params& p) { p.index_q = {}; }, "index_q"},
      {"index_q dtype bf16", [](Params& p) { p.index_q.dtype = DType::kBF16; }, "index_q"},
      {"index_q rank 2", [](Params& p) { p.index_q.rank = 2; }, "index_q"},
      {"index_q 0 heads", [](Params& p) { p.index_q.shape[1] = 0; }, "index_q"},
      {"index_q D 100", [](Params& p) { p.index_q.shape[2] = 100; }, "index_q"},
      {"index_q negative T", [](Params& p) { p.index_q.shape[0] = -1; }, "index_q"},
      {"index_k missing", [](Params& p) { p.index_k = {}; }, "index_k"},
      {"index_k dtype f32", [](Params& p) { p.index_k.dtype = DType::kF32; }, "index_k"},
      {"index_k D 64 vs 128", [](Params& p) { p.index_k.shape[1] = 64; }, "index_k"},
      {"index_k row stride", [](Params& p) { p.index_k.strides[0] = 3; }, "index_k"},
      {"index_k_scale missing", [](Params& p) { p.index_k_scale = {}; }, "index_k_scale"},
      {"index_k_scale N-1", [](Params& p) { p.index_k_scale.shape[0] -= 1; }, "index_k_scale"},
      {"index_k_scale dtype bf16", [](Params& p) { p.index_k_scale.dtype = DType::kBF16; },
       "index_k_scale"},
      {"index_weights missing", [](Params& p) { p.index_weights = {}; }, "index_weights"},
      {"index_weights H_i+1", [](Params& p) { p.index_weights.shape[1] += 1; }, "index_weights"},
      {"ks missing", [](Params& p) { p.ks = {}; }, "ks"},
      {"ks dtype f32", [](Params& p) { p.ks.dtype = DType::kF32; }, "ks"},
      {"ke T+1", [](Params& p) { p.ke.shape[0] += 1; }, "ke"},
      {"ks T-1", [](Params& p) { p.ks.shape[0] -= 1; }, "ks"},
      {"index_weights T+1", [](Params& p) { p.index_weights.shape[0] += 1; }, "index_weights"},
      {"out T+1", [](Params& p) { p.out.shape[0] += 1; }, "out"},
      {"lse T-1", [](Params& p) { p.lse.shape[0] -= 1; }, "lse"},
      {"index_q T+1 vs q", [](Params& p) { p.index_q.shape[0] += 1; }, "index_weights"},
      {"topk 0", [](Params& p) { p.topk = 0; }, "topk"},
      {"topk 4097", [](Params& p) { p.topk = 4097; }, "topk"},
      {"q missing", [](Params& p) { p.q = {}; }, "q"},
      {"q T+1", [](Params& p) { p.q.shape[0] += 1; }, "q"},
      {"q d_qk 575", [](Params& p) { p.q.shape[2] = 575; }, "q"},
      {"q 129 heads", [](Params& p) { p.q.shape[1] = 129; }, "q"},
      {"q dtype fp8", [](Params& p) { p.q.dtype = DType::kFp8E4M3; }, "q"},
      {"kv missing", [](Params& p) { p.kv = {}; }, "kv"},
      {"kv N-1 rows", [](Params& p) { p.kv.shape[0] -= 1; }, "kv"},
      {"kv d_qk 512 vs 576", [](Params& p) { p.kv.shape[1] = 512; }, "kv"},
      {"kv row stride", [](Params& p) { p.kv.strides[0] = 100; }, "kv"},
      {"kv f32", [](Params& p) { p.kv.dtype = DType::kF32; }, "kv"},
      {"kv u8 576 wide (FP8 rows are 656)", [](Params& p) { p.kv.dtype = DType::kU8; }, "kv"},
      {"sm_scale 0", [](Params& p) { p.sm_scale = 0.0f; }, "sm_scale"},
      {"sm_scale NaN", [](Params& p) { p.sm_scale = std::numeric_limits<float>::quiet_NaN(); },
       "sm_scale"},
      {"logits N+1",
       [](Params& p) {
         p.logits = kernels::MakeTensor(dummy_f32, DType::kF32, {p.q.dim(0), p.kv.dim(0) + 1});
       },
       "logits"},
      {"logits dtype bf16",
       [](Params& p) {
         p.logits = kernels::MakeTensor(dummy_f32, DType::kBF16, {p.q.dim(0), p.kv.dim(0)});
       },
       "logits"},
      {"out missing", [](Params& p) { p.out = {}; }, "out"},
      {"out d_v 576", [](Params& p) { p.out.shape[2] = 576; }, "out"},
      {"out dtype f32", [](Params& p) { p.out.dtype = DType::kF32; }, "out"},
      {"lse H+1", [](Params& p) { p.lse.shape[1] += 1; }, "lse"},
      {"indices k+1", [](Params& p) { p.indices.shape[1] += 1; }, "indices"},
      {"indices dtype f32", [](Params& p) { p.indices.dtype = DType::kF32; }, "indices"},
      {"indices T-1", [](Params& p) { p.indices.shape[0] -= 1; }, "indices"},
  };
  return *rows;
}

TEST(DsaValidate, RejectsEachMalformedInput) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.t = 4;
  DsaCase c(spec, rng);
  ASSERT_TRUE(Validate(c.MakeParams()).ok()) << Validate(c.MakeParams());
  for (const Mutation& m : Mutations()) {
    Params p = c.MakeParams();
    m.apply(p);
    const absl::Status s = Validate(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << m.what << ": " << s;
    EXPECT_EQ(std::string(s.message()).rfind(std::string(m.tensor) + ":", 0), 0u)
        << m.what << ": message does not name " << m.tensor << ": " << s.message();
    kernels::ExecContext ctx;
    ctx.pool = TestPool();
    EXPECT_EQ(kernels::dsa::Run(p, ctx).code(), absl::StatusCode::kInvalidArgument) << m.what;
  }
}

TEST(DsaValidate, OptionalTensorsMayBeAbsent) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.with_indices = false;
  spec.with_lse = false;
  spec.with_logits = false;
  DsaCase c(spec, rng);
  EXPECT_TRUE(Validate(c.MakeParams()).ok()) << Validate(c.MakeParams());
}

TEST(DsaCount, AddsIndexerAndSparseMla) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.t = 3;
  spec.prefix = 70;  // windows 71, 72 and (below) 0 rows; top-64
  DsaCase c(spec, rng);
  c.SetWindow(2, 9, 9);
  const Params p = c.MakeParams();
  const double t = 3, n = 73, hi = 16, di = 128, h = 16, d = 576, k = 64;
  const double pairs = 71 + 72, selections = 64 + 64;
  const kernels::WorkCount w = kernels::dsa::Count(p);
  EXPECT_DOUBLE_EQ(w.flops, 2 * hi * di * pairs + 2 * h * (d + 512) * selections);
  EXPECT_DOUBLE_EQ(w.bytes, t * hi * di + n * di + 4 * n + 4 * t * hi + 8 * t + 2 * t * h * d +
                                2 * d * selections + 2 * t * h * 512 + 4 * t * h + 4 * t * k);
}

}  // namespace
}  // namespace attnd::testing
