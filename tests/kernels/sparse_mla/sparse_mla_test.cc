// Sparse MLA: every implementation against the fp64 reference on fresh random data, one named
// case per edge case of docs/CONTRACTS.md "sparse_mla", each with a bf16 KV cache and with the
// FP8 cache (params.h; the reference decodes its bytes exactly). FP8 cases use power-of-two
// scales, as real quantisers write, so every implementation sees exactly the reference's values
// and the bounds below hold unchanged; Fp8NonPowerOfTwoScales covers any other scale.
#include "kernels/sparse_mla/sparse_mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"
#include "kernels/sparse_mla/reference.h"
#include "tests/harness/harness.h"
#include "tests/kernels/sparse_mla/case.h"

namespace attnd::testing {
namespace {

using kernels::sparse_mla::ComputeReference;
using kernels::sparse_mla::Implementations;
using kernels::sparse_mla::kDimV;
using kernels::sparse_mla::Params;
using kernels::sparse_mla::Reference;

// Runs every implementation on `c` (table or CSR form) in both precisions and checks out and
// lse.
void ExpectMatchesReference(SparseMlaCase& c, bool csr) {
  Params p = c.MakeParams(csr);
  ASSERT_TRUE(kernels::sparse_mla::Validate(p).ok()) << kernels::sparse_mla::Validate(p);
  const Reference ref = ComputeReference(p);
  for (const kernels::Precision precision : kPrecisions) {
    p.precision = precision;
    const int runs = RunEachImpl(Implementations(), p, c.Outputs(), [&](const std::string& impl) {
      ExpectOutputs(c, p, ref, impl + (csr ? " csr" : " table"));
    });
    EXPECT_GE(runs, 1);
  }
}

void ExpectBothForms(SparseMlaCase& c) {
  ExpectMatchesReference(c, /*csr=*/false);
  ExpectMatchesReference(c, /*csr=*/true);
}

// Every edge case runs once per KV cache format.
class SparseMlaKv : public ::testing::TestWithParam<KvFormat> {
 protected:
  SparseMlaSpec Spec() const {
    SparseMlaSpec spec;
    spec.kv_format = GetParam();
    return spec;
  }
  bool fp8() const { return GetParam() == KvFormat::kFp8; }
};

std::string FormatName(const ::testing::TestParamInfo<KvFormat>& info) {
  return KvFormatName(info.param);
}

TEST_P(SparseMlaKv, MasksNegativeAndOutOfRangeIndices) {
  // Half the slots are -1, -2, S, S+1 (the NaN guard rows: a read poisons the output) or
  // INT32_MIN / INT32_MAX (a read would leave the allocation).
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec = Spec();
  spec.t = 4;
  spec.s = 300;
  spec.k = 200;
  spec.masked_fraction = 0.5;
  SparseMlaCase c(spec, rng);
  ExpectBothForms(c);
}

TEST_P(SparseMlaKv, RowsWithNoValidIndexGiveZeroOutAndNegInfLse) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec = Spec();
  spec.t = 5;
  spec.h = 8;
  spec.s = 100;
  spec.k = 70;
  std::vector<std::vector<int32_t>> slots = RandomSlots(spec, rng);
  for (auto& x : slots[0]) x = -1;                            // every slot masked
  for (auto& x : slots[3]) x = static_cast<int32_t>(spec.s);  // every slot past the cache
  for (auto& x : slots[2]) x = 7;                             // valid, but topk_length 0 hides them
  const std::vector<int32_t> lengths = {70, 70, 0, 70, -3};   // row 4: negative length
  SparseMlaCase c(spec, rng, slots, lengths);
  ExpectBothForms(c);
  for (bool csr : {false, true}) {
    const Params p = c.MakeParams(csr);
    RunEachImpl(Implementations(), p, c.Outputs(), [&](const std::string& impl) {
      for (int64_t t : {0, 2, 3, 4}) {
        for (int64_t h = 0; h < spec.h; ++h) {
          EXPECT_EQ(c.lse().At({t, h}), -std::numeric_limits<double>::infinity()) << impl;
          for (int64_t d = 0; d < kDimV; ++d) {
            ASSERT_EQ(c.out().data<uint16_t>()[c.out().Offset({t, h, d})], 0u)
                << impl << " t=" << t << " h=" << h << " d=" << d << ": want +0.0";
          }
        }
      }
      EXPECT_TRUE(std::isfinite(c.lse().At({1, 0}))) << impl << ": row 1 has valid slots";
    });
  }
}

TEST_P(SparseMlaKv, EmptyCacheMasksEverySlot) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec = Spec();
  spec.t = 2;
  spec.h = 8;
  spec.s = 0;
  spec.k = 9;
  SparseMlaCase c(spec, rng);
  ExpectBothForms(c);
}

TEST_P(SparseMlaKv, ZeroTokensIsANoOp) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec = Spec();
  spec.t = 0;
  SparseMlaCase c(spec, rng);
  for (bool csr : {false, true}) {
    const Params p = c.MakeParams(csr);
    EXPECT_TRUE(kernels::sparse_mla::Validate(p).ok()) << kernels::sparse_mla::Validate(p);
    // Every implementation that runs here (the CPU one, and the GPU ones with a device).
    EXPECT_GE(RunEachImpl(Implementations(), p, c.Outputs(), [](const std::string&) {}), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, SparseMlaKv,
                         ::testing::Values(KvFormat::kBf16, KvFormat::kFp8,
                                           KvFormat::kFp8PerTensor),
                         FormatName);

// Table widths around the 64-row chunk and the seed's 2051 tail; every slot valid so the
// number of valid rows is exactly K.
class SparseMlaWidth : public ::testing::TestWithParam<std::tuple<int64_t, KvFormat>> {};

TEST_P(SparseMlaWidth, MatchesReference) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  std::tie(spec.k, spec.kv_format) = GetParam();
  spec.t = 2;
  spec.s = 4000;
  spec.masked_fraction = 0.0;
  SparseMlaCase c(spec, rng);
  ExpectBothForms(c);
}

INSTANTIATE_TEST_SUITE_P(Chunks, SparseMlaWidth,
                         ::testing::Combine(::testing::Values(1, 63, 64, 65, 2051),
                                            ::testing::Values(KvFormat::kBf16, KvFormat::kFp8,
                                                              KvFormat::kFp8PerTensor)),
                         [](const auto& info) {
                           return "K" + std::to_string(std::get<0>(info.param)) + "_" +
                                  KvFormatName(std::get<1>(info.param));
                         });

TEST_P(SparseMlaKv, TailK2051WithMaskedSlots) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec = Spec();
  spec.t = 2;
  spec.h = 16;
  spec.d_qk = 512;
  spec.s = 32768;
  spec.k = 2051;
  spec.masked_fraction = 0.1;
  SparseMlaCase c(spec, rng);
  ExpectBothForms(c);
}

TEST_P(SparseMlaKv, CsrAndTableGiveIdenticalBits) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec = Spec();
  spec.t = 6;
  spec.h = 16;
  spec.s = 500;
  spec.k = 150;
  spec.masked_fraction = 0.2;
  spec.with_topk_length = true;
  SparseMlaCase c(spec, rng);
  for (const auto& impl : Implementations()) {
    if (impl.backend != kernels::Backend::kCpu) continue;
    kernels::ExecContext ctx;
    ctx.pool = TestPool();
    std::vector<uint8_t> out_bits[2], lse_bits[2];
    for (int form = 0; form < 2; ++form) {
      for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
      const Params p = c.MakeParams(/*csr=*/form == 1);
      ASSERT_TRUE(impl.run(p, ctx).ok()) << impl.name;
      out_bits[form].assign(c.out().raw(), c.out().raw() + c.out().bytes());
      lse_bits[form].assign(c.lse().raw(), c.lse().raw() + c.lse().bytes());
    }
    EXPECT_EQ(out_bits[0], out_bits[1]) << impl.name << ": out differs between table and CSR";
    EXPECT_EQ(lse_bits[0], lse_bits[1]) << impl.name << ": lse differs between table and CSR";
  }
  ExpectBothForms(c);
}

TEST_P(SparseMlaKv, TopkLengthLimitsEachRow) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec = Spec();
  spec.t = 8;
  spec.s = 900;
  spec.k = 140;
  spec.masked_fraction = 0.0;  // slots past the length are valid rows: using them would show
  const std::vector<int32_t> lengths = {-2, 0, 1, 63, 64, 70, 140, 200};
  SparseMlaCase c(spec, rng, RandomSlots(spec, rng), lengths);
  ExpectBothForms(c);
}

// (H, d_qk, T, KV format): the native head counts, odd ones (validated range 1..128), both
// d_qk; T = 1 splits heads across work items. FP8 (d_qk 576): decode shapes, T = B × next_n
// from 1 to 8.
class SparseMlaHeads
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, KvFormat>> {};

TEST_P(SparseMlaHeads, MatchesReference) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  std::tie(spec.h, spec.d_qk, spec.t, spec.kv_format) = GetParam();
  spec.s = 1000;
  spec.k = spec.h >= 64 ? 90 : 150;
  SparseMlaCase c(spec, rng);
  ExpectBothForms(c);
}

constexpr KvFormat kBf16 = KvFormat::kBf16, kFp8 = KvFormat::kFp8, kPt = KvFormat::kFp8PerTensor;

INSTANTIATE_TEST_SUITE_P(
    Shapes, SparseMlaHeads,
    ::testing::Values(std::make_tuple(8, 512, 3, kBf16), std::make_tuple(8, 576, 3, kBf16),
                      std::make_tuple(16, 512, 3, kBf16), std::make_tuple(16, 576, 3, kBf16),
                      std::make_tuple(32, 576, 2, kBf16), std::make_tuple(64, 512, 2, kBf16),
                      std::make_tuple(64, 576, 2, kBf16), std::make_tuple(128, 512, 2, kBf16),
                      std::make_tuple(128, 576, 2, kBf16), std::make_tuple(128, 576, 1, kBf16),
                      std::make_tuple(16, 576, 1, kBf16), std::make_tuple(1, 576, 2, kBf16),
                      std::make_tuple(5, 512, 1, kBf16), std::make_tuple(100, 576, 1, kBf16),
                      std::make_tuple(8, 576, 3, kFp8), std::make_tuple(16, 576, 1, kFp8),
                      std::make_tuple(16, 576, 8, kFp8), std::make_tuple(32, 576, 2, kFp8),
                      std::make_tuple(64, 576, 1, kFp8), std::make_tuple(64, 576, 4, kFp8),
                      std::make_tuple(128, 576, 1, kFp8), std::make_tuple(128, 576, 2, kFp8),
                      std::make_tuple(128, 576, 8, kFp8), std::make_tuple(1, 576, 2, kFp8),
                      std::make_tuple(100, 576, 1, kFp8), std::make_tuple(8, 512, 3, kPt),
                      std::make_tuple(16, 576, 2, kPt), std::make_tuple(32, 512, 1, kPt),
                      std::make_tuple(64, 576, 2, kPt), std::make_tuple(64, 512, 1, kPt),
                      std::make_tuple(128, 576, 1, kPt), std::make_tuple(128, 512, 2, kPt),
                      std::make_tuple(5, 576, 1, kPt)),
    [](const auto& info) {
      return "H" + std::to_string(std::get<0>(info.param)) + "_d" +
             std::to_string(std::get<1>(info.param)) + "_T" +
             std::to_string(std::get<2>(info.param)) + "_" + KvFormatName(std::get<3>(info.param));
    });

TEST_P(SparseMlaKv, StridedKvAndQ) {
  for (int64_t d_qk : {512, 576}) {
    if (fp8() && d_qk != 576) continue;  // the FP8 cache serves d_qk 576 only
    SCOPED_TRACE("d_qk " + std::to_string(d_qk));
    std::mt19937_64 rng = MakeRng();
    SparseMlaSpec spec = Spec();
    spec.d_qk = d_qk;
    spec.t = 3;
    // A cache row with other data after the latent vector (elements; FP8: bytes, 16-aligned).
    spec.kv_row_stride = fp8() ? 720 : 656;
    spec.q_pad = 40;           // q heads padded (dim 1 stride d_qk + 40)
    spec.indices_row_pad = 5;  // table rows padded; the padding holds junk
    SparseMlaCase c(spec, rng);
    ExpectBothForms(c);
  }
}

TEST_P(SparseMlaKv, DuplicateIndicesCountTwice) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec = Spec();
  spec.t = 1;
  spec.s = 50;
  spec.k = 2;
  // [a, -1] and [a, a] on identical data: softmax over equal scores gives out = v_a exactly in
  // both, and the duplicate doubles Σ exp, so lse grows by ln 2.
  std::mt19937_64 rng_copy = rng;
  SparseMlaCase once(spec, rng, {{11, -1}}, {});
  SparseMlaCase twice(spec, rng_copy, {{11, 11}}, {});
  // Each implementation against its own run of `once`.
  std::map<std::string, std::vector<double>> lse_once, out_once;
  RunEachImpl(Implementations(), once.MakeParams(false), once.Outputs(),
              [&](const std::string& impl) {
                lse_once[impl] = ToDoubles(once.lse());
                out_once[impl] = ToDoubles(once.out());
              });
  RunEachImpl(Implementations(), twice.MakeParams(false), twice.Outputs(),
              [&](const std::string& impl) {
                const std::vector<double> lse_twice = ToDoubles(twice.lse());
                ASSERT_EQ(lse_once[impl].size(), lse_twice.size());
                for (size_t h = 0; h < lse_twice.size(); ++h) {
                  EXPECT_NEAR(lse_twice[h] - lse_once[impl][h], std::log(2.0), 1e-5) << impl;
                }
                EXPECT_EQ(ToDoubles(twice.out()), out_once[impl]) << impl;
              });
  ExpectMatchesReference(twice, false);

  // Mixed duplicates against the reference: each row repeats a few rows many times.
  spec.t = 4;
  spec.k = 120;
  std::vector<std::vector<int32_t>> slots(spec.t, std::vector<int32_t>(spec.k));
  std::uniform_int_distribution<int32_t> few(0, 3);
  for (auto& row : slots) {
    for (auto& x : row) x = 5 + 7 * few(rng);
  }
  SparseMlaCase mixed(spec, rng, slots, {});
  ExpectBothForms(mixed);
}

// lse in the caller's layout (docs/CONTRACTS.md "Strided lse"): a transposed view of vLLM's
// [H, T] merge buffer (strides (1, T)), the same with padding between head rows, and [T, H] with
// padded token rows. The gaps hold poison that must survive; token 1 has no valid slot (lse
// -inf through the strides). Heads 8 (the low-head kernels) and 64 (wgmma on sm_90a).
TEST_P(SparseMlaKv, LseInCallersLayout) {
  struct Layout {
    bool head_major;
    int64_t pad;
  };
  for (const Layout layout : {Layout{true, 0}, Layout{true, 3}, Layout{false, 5}}) {
    for (int64_t h : {8, 64}) {
      SCOPED_TRACE(std::string(layout.head_major ? "[H, T]" : "[T, H]") + " pad " +
                   std::to_string(layout.pad) + " H " + std::to_string(h));
      std::mt19937_64 rng = MakeRng();
      SparseMlaSpec spec = Spec();
      spec.t = 5;
      spec.h = h;
      spec.s = 300;
      spec.k = 70;
      spec.lse_head_major = layout.head_major;
      spec.lse_pad = layout.pad;
      std::vector<std::vector<int32_t>> slots = RandomSlots(spec, rng);
      for (auto& x : slots[1]) x = -1;
      SparseMlaCase c(spec, rng, slots, {});
      const kernels::Tensor& lse = c.lse().tensor();
      ASSERT_EQ(lse.stride(layout.head_major ? 0 : 1), 1);
      ExpectBothForms(c);  // checks the gaps too (ExpectOutputs)
      RunEachImpl(
          Implementations(), c.MakeParams(false), c.Outputs(), [&](const std::string& impl) {
            for (int64_t hh = 0; hh < h; ++hh) {
              EXPECT_EQ(c.lse().At({1, hh}), -std::numeric_limits<double>::infinity()) << impl;
            }
            ExpectLseGapsPoisoned(c.lse(), impl + " empty row");
          });
    }
  }
}

TEST_P(SparseMlaKv, LseOptionalAbsent) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec = Spec();
  spec.with_lse = false;
  std::mt19937_64 rng_copy = rng;
  SparseMlaCase without(spec, rng);
  ExpectBothForms(without);
  // The same call with lse requested writes the same out bits.
  spec.with_lse = true;
  SparseMlaCase with(spec, rng_copy);
  // Each implementation against its own run without lse.
  std::map<std::string, std::vector<uint8_t>> out_without;
  RunEachImpl(Implementations(), without.MakeParams(false), without.Outputs(),
              [&](const std::string& impl) {
                out_without[impl].assign(without.out().raw(),
                                         without.out().raw() + without.out().bytes());
              });
  RunEachImpl(
      Implementations(), with.MakeParams(false), with.Outputs(), [&](const std::string& impl) {
        ASSERT_EQ(out_without[impl].size(), static_cast<size_t>(with.out().bytes()));
        EXPECT_EQ(0,
                  std::memcmp(with.out().raw(), out_without[impl].data(), out_without[impl].size()))
            << impl;
      });
}

// FP8 scales that are not powers of two. The CPU implementation dequantises in f32 (relative
// 2^-24) and meets the bounds above against the exact reference. The GPU kernels round each
// e4m3 × scale to bf16 once in shared memory (fp8_kv.cuh): they meet the same bounds against the
// fp64 reference of those bf16 values (k̂, v̂), and, against the exact reference, bounds that
// follow from the data (BoundsOfBf16Rounding): if every score of row (t, h) moves by at most
// B = max_i |sm_scale·q·(k̂_i − k_i)| over its selected slots i, its lse moves by at most B and
// each weight p_i = exp(s_i − lse) by a factor within [e^-2B, e^2B], so out column c moves by at
// most (e^2B − 1)·Σ p_i |v̂_ic| + Σ p_i |v̂_ic − v_ic| (the weights from the exact fp64 scores).
// A wrong tile or scale moves out by the order of |v|, far above these bounds.
struct RoundingBounds {
  std::vector<double> lse;  // B per (t, h)
  std::vector<double> out;  // per (t, h, c < 512)
};

// The exact value of cache element (row r, column c) the bounds compare against.
using ExactKv = std::function<double(int64_t r, int64_t c)>;

RoundingBounds BoundsOfBf16Rounding(const Params& table_p, const kernels::Tensor& rounded_kv,
                                    const Reference& exact, const ExactKv& exact_kv) {
  const Params& p = table_p;
  const int64_t t_n = p.q.dim(0), h_n = p.q.dim(1), s_n = p.kv.dim(0), k_n = p.indices.dim(1);
  const int64_t kD = p.q.dim(2);
  auto rounded_at = [&](int64_t r, int64_t c) -> double {
    return kernels::Bf16ToFloat(static_cast<const kernels::bf16_t*>(rounded_kv.data)[r * kD + c]);
  };
  auto exact_at = [&](int64_t r, int64_t c) -> double { return exact_kv(r, c); };
  RoundingBounds b;
  b.lse.assign(t_n * h_n, 0.0);
  b.out.assign(t_n * h_n * kDimV, 0.0);
  std::vector<double> q(kD), s, w_hat(kDimV), w_err(kDimV);
  for (int64_t t = 0; t < t_n; ++t) {
    std::vector<int64_t> rows;  // the valid selected slots (duplicates count twice, as served)
    for (int64_t j = 0; j < k_n; ++j) {
      const int64_t r = p.indices.ptr<const int32_t>()[t * p.indices.stride(0) + j];
      if (r >= 0 && r < s_n) rows.push_back(r);
    }
    for (int64_t h = 0; h < h_n; ++h) {
      const auto* qh = p.q.ptr<const kernels::bf16_t>() + t * p.q.stride(0) + h * p.q.stride(1);
      for (int64_t c = 0; c < kD; ++c) q[c] = kernels::Bf16ToFloat(qh[c]);
      const int64_t row = t * h_n + h;
      double bound = 0;
      s.assign(rows.size(), 0.0);
      for (size_t i = 0; i < rows.size(); ++i) {
        double score = 0, shift = 0;
        for (int64_t c = 0; c < kD; ++c) {
          const double k = exact_at(rows[i], c);
          score += q[c] * k;
          shift += q[c] * (rounded_at(rows[i], c) - k);
        }
        s[i] = p.sm_scale * score;
        bound = std::max(bound, std::fabs(p.sm_scale * shift));
      }
      b.lse[row] = bound;
      std::fill(w_hat.begin(), w_hat.end(), 0.0);
      std::fill(w_err.begin(), w_err.end(), 0.0);
      for (size_t i = 0; i < rows.size(); ++i) {
        const double w = std::exp(s[i] - exact.lse[row]);
        for (int64_t c = 0; c < kDimV; ++c) {
          const double v_hat = rounded_at(rows[i], c);
          w_hat[c] += w * std::fabs(v_hat);
          w_err[c] += w * std::fabs(v_hat - exact_at(rows[i], c));
        }
      }
      for (int64_t c = 0; c < kDimV; ++c) {
        b.out[row * kDimV + c] = std::expm1(2 * bound) * w_hat[c] + w_err[c];
      }
    }
  }
  return b;
}

// Every element of got within bound(i) of ref (infinities and NaN must match exactly).
template <class Bound>
void ExpectWithin(const std::vector<double>& got, const std::vector<double>& ref, Bound bound,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isfinite(ref[i])
                        ? std::fabs(got[i] - ref[i]) <= bound(i)
                        : (got[i] == ref[i] || (std::isnan(got[i]) && std::isnan(ref[i])));
    if (!ok && bad++ < 3) {
      first << " [" << i << "] got " << got[i] << " want " << ref[i] << " bound " << bound(i)
            << ";";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size()
                    << " out of bounds:" << first.str();
}

// Every implementation on the FP8 case `c` whose scales are not powers of two (the comment
// above): the CPU one against the exact reference, the GPU ones against the reference of the
// bf16-rounded cache and, within `bounds`, against the exact one.
void ExpectWithinRoundingBounds(SparseMlaCase& c, const HostTensor& rounded_kv,
                                const RoundingBounds& bounds) {
  for (bool csr : {false, true}) {
    const Params p = c.MakeParams(csr);
    const Reference exact = ComputeReference(p);
    Params rounded_p = p;
    rounded_p.kv = rounded_kv.tensor();
    rounded_p.kv_scale = 0;
    const Reference rounded = ComputeReference(rounded_p);
    // out element i = (t·H + h)·512 + c; lse element i = t·H + h. FAST adds its bound on bf16
    // P (harness.h) around the exact result for the bf16-rounded kv.
    auto out_bound = [&](kernels::Precision precision, size_t i) {
      if (precision == kernels::Precision::kFast) {
        return bounds.out[i] + kFastOutAtol + kFastOutRel * std::fabs(rounded.out[i]) +
               kFastOutWeighted * rounded.out_abs[i];
      }
      return bounds.out[i] + kOutTol.atol + kOutTol.rtol * std::fabs(exact.out[i]);
    };
    auto lse_bound = [&](size_t i) { return bounds.lse[i] + kLseTol.atol; };
    for (const kernels::Precision precision : kPrecisions) {
      Params pp = p;
      pp.precision = precision;
      const std::string form =
          std::string(csr ? " csr" : " table") + " " + kernels::PrecisionName(precision);
      const int runs =
          RunEachImpl(Implementations(), pp, c.Outputs(), [&](const std::string& impl) {
            const std::vector<double> out = ToDoubles(c.out()), lse = ToDoubles(c.lse());
            if (impl == "cpu") {
              ExpectOutputs(c, pp, exact, impl + form);
              return;
            }
            ExpectOutputs(c, pp, rounded, impl + form + " vs bf16-rounded kv");
            ExpectWithin(
                out, exact.out, [&](size_t i) { return out_bound(precision, i); },
                impl + form + " out vs exact kv");
            ExpectWithin(lse, exact.lse, lse_bound, impl + form + " lse vs exact kv");
          });
      EXPECT_GE(runs, 1);
    }
  }
}

TEST(SparseMlaFp8, NonPowerOfTwoScales) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.kv_format = KvFormat::kFp8;
  spec.pow2_scales = false;
  spec.t = 4;
  spec.h = 64;
  spec.s = 3000;
  spec.k = 300;
  spec.masked_fraction = 0.1;
  SparseMlaCase c(spec, rng);
  const Params table_p = c.MakeParams(false);
  HostTensor rounded_kv = Fp8KvAsBf16(table_p.kv);
  auto exact_kv = [&](int64_t r, int64_t col) -> double {  // e4m3 × tile scale; rope: bf16
    const uint8_t* row = static_cast<const uint8_t*>(table_p.kv.data) + r * table_p.kv.stride(0);
    if (col >= kDimV) {
      kernels::bf16_t b;
      std::memcpy(&b, row + kernels::sparse_mla::kFp8RopeOffset + 2 * (col - kDimV), sizeof b);
      return kernels::Bf16ToFloat(b);
    }
    float scale;
    std::memcpy(
        &scale,
        row + kernels::sparse_mla::kFp8ScaleOffset + 4 * (col / kernels::sparse_mla::kFp8ScaleCols),
        sizeof scale);
    return static_cast<double>(kernels::Fp8E4M3ToFloat(row[col])) * scale;
  };
  const RoundingBounds bounds =
      BoundsOfBf16Rounding(table_p, rounded_kv.tensor(), ComputeReference(table_p), exact_kv);
  ExpectWithinRoundingBounds(c, rounded_kv, bounds);
}

// The per-tensor FP8 cache (vLLM's "fp8" MLA cache, built by its writer's rules) with a scale
// bf16 cannot hold times every code (0.0371), at both d_qk: the same bounds as above.
TEST(SparseMlaFp8PerTensor, NonPowerOfTwoScaleAtBothWidths) {
  for (int64_t d_qk : {576, 512}) {
    SCOPED_TRACE("d_qk " + std::to_string(d_qk));
    std::mt19937_64 rng = MakeRng();
    SparseMlaSpec spec;
    spec.kv_format = KvFormat::kFp8PerTensor;
    spec.pow2_scales = false;
    spec.d_qk = d_qk;
    spec.t = 4;
    spec.h = 64;
    spec.s = 3000;
    spec.k = 300;
    spec.masked_fraction = 0.1;
    SparseMlaCase c(spec, rng);
    const Params table_p = c.MakeParams(false);
    HostTensor rounded_kv = Fp8PerTensorKvAsBf16(table_p.kv, c.kv_scale());
    auto exact_kv = [&](int64_t r, int64_t col) -> double {
      const uint8_t* row = static_cast<const uint8_t*>(table_p.kv.data) + r * table_p.kv.stride(0);
      return static_cast<double>(kernels::Fp8E4M3ToFloat(row[col])) * c.kv_scale();
    };
    const RoundingBounds bounds =
        BoundsOfBf16Rounding(table_p, rounded_kv.tensor(), ComputeReference(table_p), exact_kv);
    ExpectWithinRoundingBounds(c, rounded_kv, bounds);
  }
}

}  // namespace
}  // namespace attnd::testing
