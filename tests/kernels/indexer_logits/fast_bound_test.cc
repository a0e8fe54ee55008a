// The FAST precision's bound (docs/ACCURACY.md "Indexer logits, FAST") against a software model of
// the FP8 tensor-core accumulator: its logits pass the FAST check and fail the HIGH one (so the
// two bounds differ where it matters), and the same model with one k32 step dropped, or its
// result rounded to bf16, fails the FAST check (so the check can fail).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"
#include "kernels/indexer_logits/reference.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/kernels/indexer_logits/logits_check.h"

namespace attnd::kernels::indexer_logits {
namespace {

using testing::HostTensor;

// x cut to a multiple of `grid`, toward zero or toward −∞.
double Cut(double x, double grid, bool floor_mode) {
  const double q = x / grid;
  return (floor_mode ? std::floor(q) : std::trunc(q)) * grid;
}
int Exponent(double x) { return std::ilogb(x); }

struct AccumulatorModel {
  int fraction_bits = 13;   // e8m13: the measured accumulator
  bool floor_mode = false;  // truncation toward zero (false) or toward −∞ (sign-fill shifts)
  int64_t drop_step = -1;   // a broken kernel: this k32 step never added
};

// One head's dot product as the model accumulates it: per step of 32 products, every addend
// (the running sum included) aligned to the largest exponent E and cut to 2^(E − bits), the
// aligned addends summed exactly, the result cut to `bits` fractional bits of its own exponent.
float ModelDot(const double* products, int64_t dim, const AccumulatorModel& model) {
  double acc = 0;
  for (int64_t s0 = 0, step = 0; s0 < dim; s0 += 32, ++step) {
    if (step == model.drop_step) continue;
    const int64_t s1 = std::min(dim, s0 + 32);
    int e = acc != 0 ? Exponent(acc) : INT32_MIN;
    for (int64_t d = s0; d < s1; ++d) {
      if (products[d] != 0) e = std::max(e, Exponent(products[d]));
    }
    if (e == INT32_MIN) continue;  // all zero
    const double grid = std::ldexp(1.0, e - model.fraction_bits);
    double sum = Cut(acc, grid, model.floor_mode);
    for (int64_t d = s0; d < s1; ++d) sum += Cut(products[d], grid, model.floor_mode);
    if (sum != 0) {
      sum = Cut(sum, std::ldexp(1.0, Exponent(sum) - model.fraction_bits), model.floor_mode);
    }
    acc = sum;
  }
  return static_cast<float>(acc);  // 14 significant bits: exact in f32
}

// Writes the model's logits (f32 epilogue: Σ_h w·relu(acc) by fmaf, then × k_scale) into the
// windows of dense params; cleans the rest to −inf.
void ModelLogits(const Params& p, const AccumulatorModel& model, bool bf16_result = false) {
  const int64_t m_count = p.q.dim(0), heads = p.q.dim(1), dim = p.q.dim(2), n_count = p.k.dim(0);
  const uint8_t* q = p.q.ptr<const uint8_t>();
  const uint8_t* k = p.k.ptr<const uint8_t>();
  std::vector<double> products(static_cast<size_t>(dim));
  for (int64_t m = 0; m < m_count; ++m) {
    float* row = p.logits.ptr<float>() + m * p.logits.stride(0);
    const int64_t lo = std::max<int64_t>(p.ks.ptr<const int32_t>()[m], 0);
    const int64_t hi = std::min<int64_t>(p.ke.ptr<const int32_t>()[m], n_count);
    for (int64_t n = 0; n < n_count; ++n) {
      if (n < lo || n >= hi) {
        row[n] = -INFINITY;
        continue;
      }
      float part = 0;
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = 0; d < dim; ++d) {
          products[d] = static_cast<double>(Fp8E4M3ToFloat(q[(m * heads + h) * dim + d])) *
                        static_cast<double>(Fp8E4M3ToFloat(k[n * dim + d]));
        }
        const float acc = ModelDot(products.data(), dim, model);
        part = std::fmaf(p.weights.ptr<const float>()[m * heads + h], std::max(acc, 0.0f), part);
      }
      const float v = part * p.k_scale.ptr<const float>()[n];
      row[n] = bf16_result ? Bf16ToFloat(FloatToBf16(v)) : v;
    }
  }
}

// The failures `check` reports (without failing this test), one string each.
std::vector<std::string> Failures(const std::function<void()>& check) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    check();
  }
  std::vector<std::string> out;
  for (int i = 0; i < results.size(); ++i) {
    if (results.GetTestPartResult(i).failed())
      out.emplace_back(results.GetTestPartResult(i).message());
  }
  return out;
}

bool AnyContains(const std::vector<std::string>& failures, const std::string& what) {
  return std::any_of(failures.begin(), failures.end(),
                     [&](const std::string& f) { return f.find(what) != std::string::npos; });
}

// Dense params of m query rows over n keys with fresh random data, causal windows (row i sees
// the first n - m + i + 1 keys: the last m of n tokens; m 1 sees all n).
struct Problem {
  HostTensor q, k, k_scale, weights, ks, ke, logits;
  Params p;
  Problem(int64_t m, int64_t n, int64_t heads, int64_t dim, std::mt19937_64& rng)
      : q(HostTensor::Dense(DType::kFp8E4M3, {m, heads, dim})),
        k(HostTensor::Dense(DType::kFp8E4M3, {n, dim})),
        k_scale(HostTensor::Dense(DType::kF32, {n})),
        weights(HostTensor::Dense(DType::kF32, {m, heads})),
        ks(HostTensor::Dense(DType::kI32, {m})),
        ke(HostTensor::Dense(DType::kI32, {m})),
        logits(HostTensor::Dense(DType::kF32, {m, n})) {
    testing::FillNormal(q, rng, 1.0);
    testing::FillNormal(k, rng, 1.0);
    testing::FillUniform(k_scale, rng, 0.01, 0.1);
    testing::FillNormal(weights, rng, 1.0);
    for (int64_t i = 0; i < m; ++i) {
      ks.data<int32_t>()[i] = 0;
      ke.data<int32_t>()[i] = static_cast<int32_t>(n - m + i + 1);
    }
    p.q = q.tensor();
    p.k = k.tensor();
    p.k_scale = k_scale.tensor();
    p.weights = weights.tensor();
    p.ks = ks.tensor();
    p.ke = ke.tensor();
    p.logits = logits.tensor();
  }
};

class FastBoundTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(FastBoundTest, AdmitsTheAccumulatorModelAndRejectsBrokenResults) {
  const auto [heads, dim] = GetParam();
  auto rng = testing::MakeRng();
  Problem prob(24, 160, heads, dim, rng);
  const Params& p = prob.p;
  HostTensor& logits = prob.logits;
  const RefLogits ref = Reference(p);
  const testing::LogitsTolerance fast = testing::ToleranceFor(heads, dim, Precision::kFast);
  const testing::LogitsTolerance high = testing::ToleranceFor(heads, dim, Precision::kHigh);

  // The measured accumulator (e8m13, truncation toward zero) and the sign-fill reading of it
  // (toward −∞) both meet FAST's bounds; the measured one misses HIGH's.
  for (const bool floor_mode : {false, true}) {
    SCOPED_TRACE(floor_mode ? "toward -inf" : "toward zero");
    ModelLogits(p, {13, floor_mode, -1});
    testing::ExpectLogits(logits.tensor(), ref, fast, "model", /*padding_poisoned=*/false);
    if (!floor_mode) {
      const auto failures = Failures([&] {
        testing::ExpectLogits(logits.tensor(), ref, high, "model", /*padding_poisoned=*/false);
      });
      EXPECT_FALSE(failures.empty()) << "HIGH's bound admits the FP8 accumulator";
    }
  }
  // A kernel that skips any one k32 step fails both the per-element and the L2 bound.
  for (int64_t step = 0; step < (dim + 31) / 32; ++step) {
    SCOPED_TRACE("step " + std::to_string(step) + " dropped");
    ModelLogits(p, {13, false, step});
    const auto failures = Failures([&] {
      testing::ExpectLogits(logits.tensor(), ref, fast, "dropped", /*padding_poisoned=*/false);
    });
    EXPECT_TRUE(AnyContains(failures, "elements wrong")) << failures.size();
    EXPECT_TRUE(AnyContains(failures, "relative L2 error")) << failures.size();
  }
  // Logits rounded to bf16 (relative RMS ~1.6e-3) fail the L2 bound.
  ModelLogits(p, {13, false, -1}, /*bf16_result=*/true);
  const auto failures = Failures([&] {
    testing::ExpectLogits(logits.tensor(), ref, fast, "bf16", /*padding_poisoned=*/false);
  });
  EXPECT_TRUE(AnyContains(failures, "relative L2 error")) << failures.size();
}

INSTANTIATE_TEST_SUITE_P(IndexerLogits, FastBoundTest,
                         ::testing::Values(std::make_tuple(64, 128), std::make_tuple(32, 128),
                                           std::make_tuple(64, 64)),
                         [](const auto& info) {
                           return "H" + std::to_string(std::get<0>(info.param)) + "_D" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The closed form (docs/ACCURACY.md): the data-derived bound never exceeds
// ((1 + 34u + 33u²)^⌈D/32⌉ − 1)·Σ|p| per head, u = 2^-12, even on adversarial steps (one large
// product and 31 small ones that all lose bits), and it is at least the worst loss the model makes
// there.
TEST(IndexerLogitsFastBound, ClosedFormCoversTheDataBound) {
  const double u = std::ldexp(1.0, -12);
  for (const int64_t dim : {32, 64, 128, 256}) {
    std::vector<double> products(static_cast<size_t>(dim));
    for (int64_t d = 0; d < dim; ++d) {  // 1.0 then 31 products of 15·2^-19 (off the grid)
      products[d] = d % 32 == 0 ? 1.0 : 15.0 * std::ldexp(1.0, -19);
    }
    double abs_sum = 0;
    for (double x : products) abs_sum += std::fabs(x);
    const double bound = FastDotErrorBound(products.data(), dim);
    const double closed = (std::pow(1 + 34 * u + 33 * u * u, (dim + 31) / 32) - 1) * abs_sum;
    EXPECT_LE(bound, closed) << "D " << dim;
    double exact = 0;
    for (double x : products) exact += x;
    const double model = ModelDot(products.data(), dim, {13, false, -1});
    EXPECT_GT(std::fabs(model - exact), 0.0) << "the case loses nothing";
    EXPECT_LE(std::fabs(model - exact), bound) << "D " << dim;
  }
}

// The norm bound is statistical (docs/ACCURACY.md "Indexer logits, FAST"): over one or two
// values the accumulator model exceeds it for about one draw in seven or sixteen (a logit near
// zero after the heads' weighted sum), which failed a GPU test of two values on 2026-12-07; so
// ExpectLogits applies it over kMinValuesForNormBound values or more and holds fewer to the
// per-element bound alone. Here: a one-value draw over the norm bound passes the check, and at
// the threshold the check still rejects logits rounded to bf16.
TEST(IndexerLogitsFastBound, NormBoundNeedsManyValues) {
  auto rng = testing::MakeRng();
  const testing::LogitsTolerance fast = testing::ToleranceFor(32, 128, Precision::kFast);
  bool found = false;
  for (int draw = 0; draw < 400 && !found; ++draw) {  // P(none of 400 over) < 1e-20
    Problem one(1, 1, 32, 128, rng);
    const RefLogits ref = Reference(one.p);
    ModelLogits(one.p, {13, false, -1});
    const double got = one.logits.data<float>()[0], want = ref.value[0];
    if (std::fabs(got - want) <= fast.rel_l2 * std::fabs(want)) continue;
    found = true;
    testing::ExpectLogits(one.logits.tensor(), ref, fast, "one value", /*padding_poisoned=*/false);
  }
  EXPECT_TRUE(found) << "no one-value draw exceeded the norm bound";
  Problem many(1, testing::kMinValuesForNormBound, 32, 128, rng);
  const RefLogits ref = Reference(many.p);
  ModelLogits(many.p, {13, false, -1});
  testing::ExpectLogits(many.logits.tensor(), ref, fast, "64 values", /*padding_poisoned=*/false);
  ModelLogits(many.p, {13, false, -1}, /*bf16_result=*/true);
  const auto failures = Failures([&] {
    testing::ExpectLogits(many.logits.tensor(), ref, fast, "bf16", /*padding_poisoned=*/false);
  });
  EXPECT_TRUE(AnyContains(failures, "relative L2 error")) << failures.size();
}

}  // namespace
}  // namespace attnd::kernels::indexer_logits
