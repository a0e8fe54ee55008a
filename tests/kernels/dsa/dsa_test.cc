// Fused DSA layer against the three fp64 reference steps: the chosen rows must be a true top-k
// of the fp64 indexer logits over each window (as a set, within the f32 bound of the logits),
// and out / lse must match the fp64 sparse MLA reference on the rows the call chose.
#include "kernels/dsa/dsa.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dsa/cpu.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/indexer_logits/reference.h"
#include "kernels/sparse_mla/reference.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "kernels/topk/topk.h"
#include "tests/harness/fp8_kv.h"
#include "tests/harness/harness.h"
#include "tests/kernels/dsa/dsa_case.h"
#include "tests/kernels/dsa/paged_check.h"

namespace attnd::testing {
namespace {

using kernels::DType;
using kernels::dsa::Params;

// Same bounds as tests/kernels/sparse_mla (bf16 out: 2^-8 rounding + f32 accumulation; f32 lse):
// HIGH's; FAST's adds bf16 P's error (ExpectAttentionOut, harness.h).
constexpr Tolerance kOutTol{4e-3, 2e-5, 4e-3};
constexpr Tolerance kLseTol{1e-5, 1e-4, 0.0};

// The chosen rows of every token must be: ascending, then -1; inside the window; min(k, window)
// of them; and no row left out may beat a chosen one by more than both logits' error bound: the
// f32 bound (D_i + H_i + 4)·2^-24·magnitude (the indexer's own test derives it), or with
// index_precision FAST the FP8 accumulator's (RefLogits::fast_bound; docs/ACCURACY.md).
void ExpectTrueTopk(const Params& p, const HostTensor& indices) {
  const int64_t t_count = p.index_q.dim(0), n = p.index_k.dim(0), k = p.topk;
  HostTensor scratch = HostTensor::Dense(DType::kF32, {t_count, n});
  const kernels::indexer_logits::RefLogits ref = kernels::indexer_logits::Reference(
      kernels::dsa::IndexerStep(p, 0, t_count, scratch.tensor()));
  const double bound =
      static_cast<double>(p.index_q.dim(2) + p.index_q.dim(1) + 4) * std::ldexp(1.0, -24);
  for (int64_t t = 0; t < t_count; ++t) {
    const int64_t begin = std::max<int64_t>(p.ks.ptr<const int32_t>()[t], 0);
    const int64_t end = std::max(begin, std::min<int64_t>(p.ke.ptr<const int32_t>()[t], n));
    std::set<int64_t> chosen;
    int64_t last = -1;
    bool padding = false;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t c = indices.data<int32_t>()[indices.Offset({t, i})];
      if (c == -1) {
        padding = true;
        continue;
      }
      ASSERT_FALSE(padding) << "t=" << t << ": a row after the -1 padding";
      ASSERT_GT(c, last) << "t=" << t << ": rows not ascending (or repeated)";
      ASSERT_TRUE(c >= begin && c < end)
          << "t=" << t << ": row " << c << " outside [" << begin << ", " << end << ")";
      chosen.insert(c);
      last = c;
    }
    ASSERT_EQ(static_cast<int64_t>(chosen.size()), std::min(k, end - begin)) << "t=" << t;
    double lowest_chosen = std::numeric_limits<double>::infinity();
    double highest_other = -std::numeric_limits<double>::infinity();
    for (int64_t col = begin; col < end; ++col) {
      const size_t at = static_cast<size_t>(t * n + col);
      const double tol = p.index_precision == kernels::Precision::kFast ? ref.fast_bound[at]
                                                                        : bound * ref.magnitude[at];
      if (chosen.count(col)) {
        lowest_chosen = std::min(lowest_chosen, ref.value[at] + tol);
      } else {
        highest_other = std::max(highest_other, ref.value[at] - tol);
      }
    }
    EXPECT_GE(lowest_chosen, highest_other) << "t=" << t << ": not a top-" << k;
  }
}

// The sparse MLA step's fp64 reference on the rows chosen. on_rounded_kv: on the bf16-rounded
// copy of the per-tensor FP8 cache (what the GPU kernels compute from a scale that is not a power
// of two; docs/ACCURACY.md), else on the exact decode.
kernels::sparse_mla::Reference StepReference(const Params& p, const HostTensor& indices,
                                             bool on_rounded_kv) {
  kernels::sparse_mla::Params sp = kernels::dsa::SparseMlaStep(p, 0, p.q.dim(0), indices.tensor());
  HostTensor rounded;
  if (on_rounded_kv) {
    rounded = Fp8PerTensorKvAsBf16(sp.kv, sp.kv_scale);
    sp.kv = rounded.tensor();
    sp.kv_scale = 0;
    sp.kv_layout = kernels::CacheLayout::kUnspecified;
  }
  return kernels::sparse_mla::ComputeReference(sp);
}

// Runs every implementation on c in both precisions and checks the selection and the attention
// output: the CPU against the exact-decode reference; the GPU ones too, or, with gpu_on_rounded_kv
// (a per-tensor FP8 cache whose scale is not a power of two), against the reference on the
// bf16-rounded cache. index_precision: the indexer step's (its selection checked against that
// precision's bound).
void ExpectMatchesReferenceSteps(DsaCase& c, bool gpu_on_rounded_kv = false,
                                 kernels::Precision index_precision = kernels::Precision::kHigh) {
  Params p = c.MakeParams();
  p.index_precision = index_precision;
  ASSERT_TRUE(kernels::dsa::Validate(p).ok()) << kernels::dsa::Validate(p);
  for (const kernels::Precision precision : kPrecisions) {
    p.precision = precision;
    const int runs =
        RunEachImpl(kernels::dsa::Implementations(), p, c.Outputs(), [&](const std::string& impl) {
          SCOPED_TRACE(impl + " " + kernels::PrecisionName(precision));
          ExpectTrueTopk(p, c.indices());
          const kernels::sparse_mla::Reference ref =
              StepReference(p, c.indices(), gpu_on_rounded_kv && impl != "cpu");
          ExpectAttentionOut(ToDoubles(c.out()), ref.out, ref.out_abs, precision, kOutTol,
                             impl + " out");
          if (p.lse.present()) ExpectClose(ToDoubles(c.lse()), ref.lse, kLseTol, impl + " lse");
        });
    EXPECT_GE(runs, 1);
  }
}

TEST(Dsa, CausalPrefillMatchesReferenceSteps) {
  std::mt19937_64 rng = MakeRng();
  DsaCase c(DsaSpec{}, rng);  // windows 91..96 rows, top-64
  ExpectMatchesReferenceSteps(c);
}

TEST(Dsa, WindowsShorterThanTopkEmptyAndClamped) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.t = 7;
  spec.prefix = 20;  // causal windows of 21..27 rows < top-64: every window row is chosen
  DsaCase c(spec, rng);
  c.SetWindow(2, 5, 5);        // empty: out 0, lse -inf
  c.SetWindow(3, 10, 26);      // starts past 0 (context parallel)
  c.SetWindow(4, -7, 1000);    // clamped to [0, N)
  c.SetWindow(5, 30, 10);      // ke < ks: empty
  c.SetWindow(6, 1000, 2000);  // past the end: empty
  ExpectMatchesReferenceSteps(c);
  for (int64_t t : {2, 5, 6}) {
    for (int64_t h = 0; h < spec.heads; ++h) {
      EXPECT_EQ(c.lse().At({t, h}), -std::numeric_limits<double>::infinity()) << "t=" << t;
      EXPECT_EQ(c.out().At({t, h, 0}), 0.0) << "t=" << t;
    }
  }
}

// (H_i, D_i, H, d_qk): DeepSeek-V3.2's indexer and attention heads, GLM-5's, a small odd one.
class DsaShapes : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, int64_t>> {
};

TEST_P(DsaShapes, MatchesReferenceSteps) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  std::tie(spec.index_heads, spec.index_dim, spec.heads, spec.d_qk) = GetParam();
  spec.t = 3;
  spec.prefix = 150;
  spec.topk = 128;
  spec.pad = 24;
  DsaCase c(spec, rng);
  ExpectMatchesReferenceSteps(c);
}

INSTANTIATE_TEST_SUITE_P(Models, DsaShapes,
                         ::testing::Values(std::make_tuple(64, 128, 128, 576),
                                           std::make_tuple(32, 128, 16, 512),
                                           std::make_tuple(5, 64, 8, 576)),
                         [](const auto& info) {
                           return "Hi" + std::to_string(std::get<0>(info.param)) + "_Di" +
                                  std::to_string(std::get<1>(info.param)) + "_H" +
                                  std::to_string(std::get<2>(info.param)) + "_d" +
                                  std::to_string(std::get<3>(info.param));
                         });

// DeepSeek-V3.2's FP8 KV cache through the whole layer: the CPU implementation dequantises
// exactly and the GPU ones round code × scale to bf16 once, which the power-of-two scales make
// exact, so the bf16 bounds hold against the fp64 reference on the decoded cache. H 128 runs the
// wgmma kernel on an H200, H 16 the mma.sync one; a padded row stride (672 B) at H 64.
class DsaFp8Kv : public ::testing::TestWithParam<int64_t> {};

TEST_P(DsaFp8Kv, MatchesReferenceSteps) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.heads = GetParam();
  spec.d_qk = 576;
  spec.fp8_kv = true;
  spec.t = 5;
  spec.prefix = 300;
  spec.topk = 256;
  spec.pad = spec.heads == 64 ? 4 : 0;
  DsaCase c(spec, rng);
  c.SetWindow(1, 7, 7);      // an empty window: out 0, lse -inf
  c.SetWindow(2, 100, 180);  // fewer rows than topk
  const Params p = c.MakeParams();
  EXPECT_EQ(p.kv.dtype, DType::kU8);
  ExpectMatchesReferenceSteps(c);
  // Count charges 656 bytes per selected row, not 2·d_qk.
  DsaSpec bf16_spec = spec;
  bf16_spec.fp8_kv = false;
  bf16_spec.pad = 0;
  std::mt19937_64 rng2 = MakeRng();
  DsaCase bf16(bf16_spec, rng2);
  bf16.SetWindow(1, 7, 7);
  bf16.SetWindow(2, 100, 180);
  const kernels::WorkCount w8 = kernels::dsa::Count(p);
  const kernels::WorkCount w16 = kernels::dsa::Count(bf16.MakeParams());
  double selections = 0;
  for (int64_t t = 0; t < spec.t; ++t) {
    const int64_t begin = p.ks.ptr<const int32_t>()[t], end = p.ke.ptr<const int32_t>()[t];
    const int64_t rows = std::min<int64_t>(spec.topk, std::max<int64_t>(end - begin, 0));
    selections += static_cast<double>(rows);
  }
  EXPECT_EQ(w8.flops, w16.flops);
  EXPECT_DOUBLE_EQ(w16.bytes - w8.bytes, (2.0 * 576 - 656) * selections);
}

INSTANTIATE_TEST_SUITE_P(Heads, DsaFp8Kv, ::testing::Values(16, 64, 128),
                         [](const auto& info) { return "H" + std::to_string(info.param); });

// vLLM's per-tensor FP8 MLA cache (kv_cache_dtype "fp8"; u8 [N, d_qk] codes × one kv_scale) at
// d_qk 576 (rope included) and 512 (no rope), with a power-of-two scale (2^-5) and one bf16
// cannot hold times every code (0.0371). The CPU dequantises in f32 and is held to the bf16
// bounds against the exact-decode fp64 reference either way; the GPU steps (the portable sparse
// MLA kernel) round code × scale to bf16 once: exact with 2^-5, else held to the same bounds
// against the reference on the bf16-rounded cache (docs/ACCURACY.md). Count charges d_qk bytes
// per selected row.
class DsaPerTensorKv : public ::testing::TestWithParam<std::tuple<int64_t, float>> {};

TEST_P(DsaPerTensorKv, MatchesReferenceSteps) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  std::tie(spec.d_qk, spec.kv_scale) = GetParam();
  spec.per_tensor_kv = true;
  spec.heads = 16;
  spec.t = 5;
  spec.prefix = 200;
  spec.topk = 128;
  spec.pad = 8;
  DsaCase c(spec, rng);
  c.SetWindow(1, 7, 7);     // an empty window: out 0, lse -inf
  c.SetWindow(2, 50, 120);  // fewer rows than topk
  const Params p = c.MakeParams();
  ASSERT_EQ(p.kv.dtype, DType::kU8);
  ASSERT_EQ(p.kv.dim(1), spec.d_qk);
  const bool pow2 = std::exp2(std::round(std::log2(spec.kv_scale))) == spec.kv_scale;
  ExpectMatchesReferenceSteps(c, /*gpu_on_rounded_kv=*/!pow2);
  for (int64_t h = 0; h < spec.heads; ++h) {
    EXPECT_EQ(c.lse().At({1, h}), -std::numeric_limits<double>::infinity());
    EXPECT_EQ(c.out().At({1, h, 0}), 0.0);
  }

  DsaSpec bf16_spec = spec;
  bf16_spec.per_tensor_kv = false;
  bf16_spec.pad = 0;
  std::mt19937_64 rng2 = MakeRng();
  DsaCase bf16(bf16_spec, rng2);
  bf16.SetWindow(1, 7, 7);
  bf16.SetWindow(2, 50, 120);
  const kernels::WorkCount w8 = kernels::dsa::Count(p);
  const kernels::WorkCount w16 = kernels::dsa::Count(bf16.MakeParams());
  double selections = 0;
  for (int64_t t = 0; t < spec.t; ++t) {
    const int64_t begin = p.ks.ptr<const int32_t>()[t], end = p.ke.ptr<const int32_t>()[t];
    selections +=
        static_cast<double>(std::min<int64_t>(spec.topk, std::max<int64_t>(end - begin, 0)));
  }
  EXPECT_EQ(w8.flops, w16.flops);
  EXPECT_DOUBLE_EQ(w16.bytes - w8.bytes, static_cast<double>(spec.d_qk) * selections);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DsaPerTensorKv,
                         ::testing::Combine(::testing::Values(576, 512),
                                            ::testing::Values(0.03125f, 0.0371f)),
                         [](const auto& info) {
                           return "d" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == 0.03125f ? "_Pow2Scale"
                                                                       : "_OtherScale");
                         });

// In both precisions: the fused call hands its precision to the sparse MLA step.
TEST(Dsa, FusedEqualsTheThreeStepsRunSeparately) {
  for (const kernels::Precision precision : kPrecisions) {
    SCOPED_TRACE(kernels::PrecisionName(precision));
    std::mt19937_64 rng = MakeRng();
    DsaSpec spec;
    spec.with_logits = true;
    DsaCase c(spec, rng);
    Params p = c.MakeParams();
    p.precision = precision;
    kernels::ExecContext ctx;
    ctx.pool = TestPool();
    for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
    ASSERT_TRUE(kernels::dsa::Run(p, ctx).ok());

    const int64_t t = spec.t, n = c.n();
    HostTensor logits = HostTensor::Dense(DType::kF32, {t, n});
    HostTensor indices = HostTensor::Dense(DType::kI32, {t, spec.topk});
    HostTensor out = HostTensor::Dense(DType::kBF16, {t, spec.heads, 512});
    HostTensor lse = HostTensor::Dense(DType::kF32, {t, spec.heads});
    for (HostTensor* o : {&logits, &indices, &out, &lse}) PoisonNaN(*o);
    ASSERT_TRUE(
        kernels::indexer_logits::Run(kernels::dsa::IndexerStep(p, 0, t, logits.tensor()), ctx)
            .ok());
    ASSERT_TRUE(
        kernels::topk::Run(kernels::dsa::TopkStep(p, 0, t, logits.tensor(), indices.tensor()), ctx)
            .ok());
    kernels::sparse_mla::Params sp = kernels::dsa::SparseMlaStep(p, 0, t, indices.tensor());
    sp.out = out.tensor();
    sp.lse = lse.tensor();
    sp.precision = precision;
    ASSERT_TRUE(kernels::sparse_mla::Run(sp, ctx).ok());
    EXPECT_EQ(ToDoubles(c.logits()), ToDoubles(logits));  // -inf == -inf; no NaN expected
    EXPECT_EQ(Bits(c.indices()), Bits(indices));
    EXPECT_EQ(Bits(c.out()), Bits(out));
    EXPECT_EQ(Bits(c.lse()), Bits(lse));
  }
}

// index_precision FAST at the FP8 indexer kernel's shape (H_i 64, D_i 128): every
// implementation's selection within FAST's bound and its out / lse within the attention bounds.
// The CPU implementation runs a FAST indexer as the exact sums (docs/ACCURACY.md "Indexer logits,
// FAST"), so its FAST call is bit for bit its HIGH one; the fused op's `precision` is untouched.
TEST(Dsa, IndexPrecisionFastRunsAndValidates) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.index_heads = 64;
  spec.with_logits = true;
  DsaCase c(spec, rng);
  c.SetWindow(2, 30, 30);  // an empty window
  ExpectMatchesReferenceSteps(c, /*gpu_on_rounded_kv=*/false, kernels::Precision::kFast);

  Params p = c.MakeParams();
  p.index_precision = kernels::Precision::kFast;
  ASSERT_TRUE(kernels::dsa::Validate(p).ok()) << kernels::dsa::Validate(p);
  EXPECT_EQ(kernels::dsa::IndexerStep(p, 0, spec.t, p.logits).precision, kernels::Precision::kFast);
  EXPECT_EQ(kernels::dsa::SparseMlaStep(p, 0, spec.t, p.indices).precision, p.precision);
  ExpectCpuIndexPrecisionsAgree(
      p, c.Outputs(), {&c.logits(), &c.indices(), &c.out(), &c.lse()},
      [&](const kernels::dsa::Params& q) { ExpectTrueTopk(q, c.indices()); });
}

TEST(Dsa, SmallScratchBlocksGiveTheSameBits) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.t = 7;
  DsaCase c(spec, rng);
  c.SetWindow(3, 4, 4);  // one empty window inside a block
  const Params p = c.MakeParams();
  kernels::ExecContext ctx;
  ctx.pool = TestPool();
  ASSERT_TRUE(kernels::dsa::RunCpuWithScratch(p, ctx, kernels::dsa::kScratchBytes).ok());
  const std::vector<uint8_t> out = Bits(c.out()), lse = Bits(c.lse()), idx = Bits(c.indices());
  // Logits for 3 tokens per block (7 = 3 + 3 + 1), then 1 token per block.
  for (int64_t rows : {3, 1}) {
    for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
    ASSERT_TRUE(kernels::dsa::RunCpuWithScratch(p, ctx, rows * c.n() * 4).ok());
    EXPECT_EQ(Bits(c.out()), out) << rows << " rows per block";
    EXPECT_EQ(Bits(c.lse()), lse) << rows << " rows per block";
    EXPECT_EQ(Bits(c.indices()), idx) << rows << " rows per block";
  }
  ExpectTrueTopk(p, c.indices());
}

TEST(Dsa, CallerLogitsScratchIsUsedAndCleaned) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.with_logits = true;
  spec.pad = 8;
  DsaCase c(spec, rng);
  c.SetWindow(1, 10, 50);
  ExpectMatchesReferenceSteps(c);
  for (int64_t t = 0; t < spec.t; ++t) {
    const int64_t begin = t == 1 ? 10 : 0, end = t == 1 ? 50 : spec.prefix + t + 1;
    for (int64_t col = 0; col < c.n(); ++col) {
      const double v = c.logits().At({t, col});
      if (col >= begin && col < end) {
        ASSERT_TRUE(std::isfinite(v)) << "t=" << t << " col=" << col;
      } else {
        ASSERT_EQ(v, -std::numeric_limits<double>::infinity()) << "t=" << t << " col=" << col;
      }
    }
  }
}

TEST(Dsa, IndicesAndLseOutputsOptional) {
  std::mt19937_64 rng = MakeRng();
  std::mt19937_64 rng_copy = rng;
  DsaSpec spec;
  DsaCase full(spec, rng);
  spec.with_indices = false;
  spec.with_lse = false;
  DsaCase bare(spec, rng_copy);  // the same inputs
  ExpectMatchesReferenceSteps(full);
  // Each implementation against its own run with every output requested.
  std::map<std::string, std::vector<uint8_t>> full_out;
  RunEachImpl(kernels::dsa::Implementations(), full.MakeParams(), full.Outputs(),
              [&](const std::string& impl) { full_out[impl] = Bits(full.out()); });
  const int runs = RunEachImpl(
      kernels::dsa::Implementations(), bare.MakeParams(), bare.Outputs(),
      [&](const std::string& impl) { EXPECT_EQ(Bits(bare.out()), full_out[impl]) << impl; });
  EXPECT_GE(runs, 1);
}

// cuda_fused_topk (the indexer writes each row's top-k candidates, one select picks from them;
// docs/KERNELS.md "Indexer → top-k candidates") against cuda_steps on the same call: both run
// the FP8 wgmma indexer (index_precision FAST), so the logits the steps' top-k reads are the
// values the candidates come from, and the selection, out and lse must be the same bytes.
// `edit` changes the call's host inputs first (ties, specials); without it the fused selection
// is also checked against the fp64 reference logits. Skips without a CUDA device or when the
// fused form does not take the call.
void ExpectFusedTopkEqualsSteps(DsaCase& c, const std::function<void(Params&)>& edit = {}) {
  Params p = c.MakeParams();
  p.index_precision = kernels::Precision::kFast;
  if (edit) edit(p);
  ASSERT_TRUE(kernels::dsa::Validate(p).ok()) << kernels::dsa::Validate(p);
  // Both forms of the candidate epilogue: on the consumers and on the helper warps.
  const std::string steps = "cuda_steps";  // CUDA builds only
  const std::vector<std::string> fused_forms = {"cuda_fused_topk", "cuda_fused_topk_hw"};
  for (const kernels::Precision precision : kPrecisions) {
    SCOPED_TRACE(kernels::PrecisionName(precision));
    p.precision = precision;
    std::map<std::string, std::vector<std::vector<uint8_t>>> got;
    RunEachImpl(kernels::dsa::Implementations(), p, c.Outputs(), [&](const std::string& impl) {
      got[impl] = {Bits(c.indices()), Bits(c.out()), Bits(c.lse())};
      const bool fused = impl == fused_forms[0] || impl == fused_forms[1];
      if (fused && !edit) ExpectTrueTopk(p, c.indices());
    });
    for (const std::string& fused : fused_forms) {
      SCOPED_TRACE(fused);
      if (got.count(fused) == 0) {
        std::string why;
        for (const auto& impl : kernels::dsa::Implementations()) {
          if (impl.name == fused && impl.supports) impl.supports(p, &why);
        }
        GTEST_SKIP() << fused << " did not run (no CUDA device, or: " << why << ")";
      }
      ASSERT_EQ(got.count(steps), 1u);
      EXPECT_EQ(got[fused][0], got[steps][0]) << "indices";
      EXPECT_EQ(got[fused][1], got[steps][1]) << "out";
      EXPECT_EQ(got[fused][2], got[steps][2]) << "lse";
    }
  }
}

// Rows long enough for the running floors to rise (over 8 tiles of 64 keys), a partial query
// block (37 rows), and every window shape: causal, empty, shorter than k, clamped at both ends,
// reversed, starting inside the row.
TEST(Dsa, FusedTopkEqualsStepsOnEveryWindowShape) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.t = 37;
  spec.prefix = 3000;
  spec.index_heads = 64;
  spec.topk = 256;
  spec.heads = 16;
  DsaCase c(spec, rng);
  c.SetWindow(1, 40, 40);                                 // empty
  c.SetWindow(2, 100, 150);                               // shorter than k
  c.SetWindow(3, -5, static_cast<int32_t>(c.n()) + 100);  // clamped
  c.SetWindow(4, 2500, 1000);                             // reversed: empty
  c.SetWindow(5, 1000, 2500);                             // inside the row
  c.SetWindow(36, 0, static_cast<int32_t>(c.n()));        // the whole row
  ExpectFusedTopkEqualsSteps(c);
}

// Ties and specials from the key scales: a run of zero scales (logits ±0, many equal), a NaN
// scale and infinite ones (logits NaN or ±inf: NaN and -inf never selected).
TEST(Dsa, FusedTopkEqualsStepsWithTiesAndSpecials) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.t = 16;
  spec.prefix = 2000;
  spec.index_heads = 64;
  spec.topk = 512;
  DsaCase c(spec, rng);
  ExpectFusedTopkEqualsSteps(c, [](Params& p) {
    float* scale = p.index_k_scale.ptr<float>();
    for (int64_t n = 200; n < 1400; ++n) scale[n] = 0.0f;
    scale[1500] = std::numeric_limits<float>::quiet_NaN();
    scale[1501] = std::numeric_limits<float>::infinity();
    scale[1502] = -std::numeric_limits<float>::infinity();
  });
}

// k past 2048: the select takes its 512-thread CTAs (the 8192-entry buffer); k near the window.
TEST(Dsa, FusedTopkEqualsStepsWithTheWideSelect) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.t = 11;
  spec.prefix = 5000;
  spec.index_heads = 64;
  spec.topk = 3000;
  DsaCase c(spec, rng);
  c.SetWindow(3, 0, 2999);    // one shorter than k
  c.SetWindow(4, 100, 3100);  // exactly k
  ExpectFusedTopkEqualsSteps(c);
}

// Every key the same (each row's logits all equal): no floor ever leaves fewer candidates than
// the window, so rows longer than the select's 8192-entry buffer take its exact path over the
// candidate list.
TEST(Dsa, FusedTopkEqualsStepsWhenCandidatesOverflowTheBuffer) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.t = 9;
  spec.prefix = 9000;
  spec.index_heads = 64;
  spec.topk = 2048;
  DsaCase c(spec, rng);
  ExpectFusedTopkEqualsSteps(c, [](Params& p) {
    uint8_t* k = p.index_k.ptr<uint8_t>();
    const int64_t stride = p.index_k.stride(0), dim = p.index_k.dim(1);
    float* scale = p.index_k_scale.ptr<float>();
    for (int64_t n = 1; n < p.index_k.dim(0); ++n) {
      std::memcpy(k + n * stride, k, static_cast<size_t>(dim));
      scale[n] = scale[0];
    }
  });
}

TEST(Dsa, ZeroTokensIsANoOp) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.t = 0;
  DsaCase c(spec, rng);
  const Params p = c.MakeParams();
  EXPECT_TRUE(kernels::dsa::Validate(p).ok()) << kernels::dsa::Validate(p);
  // Every implementation that runs here (the CPU one, and the GPU ones with a device).
  EXPECT_GE(RunEachImpl(kernels::dsa::Implementations(), p, c.Outputs(), [](const std::string&) {}),
            1);
}

}  // namespace
}  // namespace attnd::testing
