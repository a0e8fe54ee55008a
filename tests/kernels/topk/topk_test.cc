// Correctness of every top-k implementation against the fp64 reference (sets, not order), one
// named case per edge case of docs/CONTRACTS.md "topk".
#include "kernels/topk/topk.h"

#include <cmath>
#include <limits>
#include <random>
#include <tuple>

#include "gtest/gtest.h"
#include "tests/harness/harness.h"
#include "tests/kernels/topk/topk_case.h"

namespace attnd::kernels::topk {
namespace {

using testing::FillNormal;
using testing::FillUniform;
using testing::MakeRng;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kHuge = 1e30f;  // outside windows and in padding: picked only by a bug

TEST(TopK, RowsShorterThanK) {
  auto rng = MakeRng();
  const int64_t k = 2048;
  TopKCase c(8, 3000, k, WindowForm::kLengths, /*with_values=*/true);
  FillNormal(c.logits, rng, 1.0);
  const int64_t lengths[8] = {1, 17, 1000, k - 1, k, k + 1, 2999, 3000};
  for (int64_t r = 0; r < 8; ++r) c.SetWindow(r, 0, lengths[r]);
  c.FillOutsideWindows(kHuge);
  RunAndCheck(c);
}

TEST(TopK, HeavyTiesAtThreshold) {
  auto rng = MakeRng();
  const int64_t n = 32768;
  TopKCase c(4, n, 2048, WindowForm::kKsKe, /*with_values=*/true);
  c.SetFullWindows();
  std::uniform_int_distribution<int> small(0, 15);
  std::uniform_int_distribution<int64_t> col(0, n - 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t j = 0; j < n; ++j) {
    c.Logit(0, j) = static_cast<float>(small(rng));             // ~2048 per value: ties everywhere
    c.Logit(1, j) = normal(rng);                                // below the tie block
    c.Logit(2, j) = static_cast<float>(small(rng) % 2) * 0.5f;  // two values, 16K ties each
    c.Logit(3, j) = normal(rng) - 10.0f;
  }
  // Row 1: 1000 entries of 5 and 5000 of 4: 1048 of the 5000 ties complete the top 2048.
  // Row 3: 2047 entries of 3 and 100 of 2.5: the last slot is one of 100 ties.
  for (int i = 0; i < 6000; ++i) c.Logit(1, col(rng)) = 4.0f;
  for (int i = 0; i < 1000; ++i) c.Logit(1, col(rng)) = 5.0f;
  for (int i = 0; i < 100; ++i) c.Logit(3, col(rng)) = 2.5f;
  for (int64_t j = 0; j < 2047; ++j) c.Logit(3, j * 16) = 3.0f;
  RunAndCheck(c);
}

TEST(TopK, AllEqualRows) {
  auto rng = MakeRng();
  TopKCase c(4, 40000, 2048, WindowForm::kLengths, /*with_values=*/true);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t lengths[4] = {100, 5000, 40000, 2048};
  for (int64_t r = 0; r < 4; ++r) {
    const float v = normal(rng);
    for (int64_t j = 0; j < c.cols(); ++j) c.Logit(r, j) = v;
    c.SetWindow(r, 0, lengths[r]);
  }
  c.FillOutsideWindows(kHuge);
  RunAndCheck(c);
}

TEST(TopK, K2048Over32KColumns) {
  auto rng = MakeRng();
  TopKCase c(6, 32768 + 77, 2048, WindowForm::kKsKe, /*with_values=*/true);
  FillNormal(c.logits, rng, 1.0);
  c.SetFullWindows();
  c.SetWindow(1, 5, 32768 + 70);
  c.SetWindow(2, 0, 32768);
  c.SetWindow(3, 123, 1 << 20);  // past the end
  c.FillOutsideWindows(kHuge);
  RunAndCheck(c);
}

TEST(TopK, Row128KValuesInOneTwo) {
  auto rng = MakeRng();
  TopKCase c(2, 131072, 2048, WindowForm::kLengths, /*with_values=*/true);
  FillUniform(c.logits, rng, 1.0, 2.0);
  c.SetFullWindows();
  RunAndCheck(c);
}

TEST(TopK, NegInfBlocksAndNaN) {
  auto rng = MakeRng();
  const int64_t n = 20000;
  TopKCase c(5, n, 2048, WindowForm::kKsKe, /*with_values=*/true);
  FillNormal(c.logits, rng, 1.0);
  c.SetFullWindows();
  const float pos_nan = std::numeric_limits<float>::quiet_NaN();
  const float neg_nan = -pos_nan;
  std::uniform_int_distribution<int64_t> col(0, n - 1);
  // Row 0: -inf blocks (the indexer's clean fill) and NaN of both signs sprinkled.
  for (int64_t j = 0; j < n; j += 1024) {
    for (int64_t i = j; i < std::min(n, j + 512); ++i) c.Logit(0, i) = -kInf;
  }
  for (int i = 0; i < 2000; ++i) c.Logit(0, col(rng)) = (i % 2) ? pos_nan : neg_nan;
  // Row 1: only 1000 selectable entries: the rest is -inf or NaN.
  for (int64_t j = 0; j < n; ++j) {
    if (j % 20 != 0) c.Logit(1, j) = (j % 3 == 0) ? pos_nan : -kInf;
  }
  // Row 2: all -inf. Row 3: all NaN. Row 4: +inf entries (selectable) among NaN-heavy data.
  for (int64_t j = 0; j < n; ++j) {
    c.Logit(2, j) = -kInf;
    c.Logit(3, j) = (j % 2) ? pos_nan : neg_nan;
    if (j % 4 == 0) c.Logit(4, j) = pos_nan;
  }
  for (int i = 0; i < 50; ++i) c.Logit(4, col(rng)) = kInf;
  RunAndCheck(c);
}

TEST(TopK, EmptyWindows) {
  auto rng = MakeRng();
  const int64_t n = 5000;
  TopKCase c(7, n, 64, WindowForm::kKsKe, /*with_values=*/true);
  FillNormal(c.logits, rng, 1.0);
  c.SetWindow(0, 100, 100);      // ke == ks
  c.SetWindow(1, 300, 200);      // ke < ks
  c.SetWindow(2, -50, -1);       // ke < 0
  c.SetWindow(3, n + 1, n + 9);  // ks > N
  c.SetWindow(4, n, n + 100);    // ks == N
  c.SetWindow(5, -100, 30);      // negative ks, 30 columns: a short row
  c.SetWindow(6, 0, n);
  c.FillOutsideWindows(kHuge);
  RunAndCheck(c);

  TopKCase l(3, n, 64, WindowForm::kLengths, /*with_values=*/true);
  FillNormal(l.logits, rng, 1.0);
  l.SetWindow(0, 0, 0);
  l.SetWindow(1, 0, -7);
  l.SetWindow(2, 0, std::numeric_limits<int32_t>::min());
  l.FillOutsideWindows(kHuge);
  RunAndCheck(l);
}

// Random windows (causal, context-parallel, misaligned, past the end, empty) in both forms,
// over k from 1 to kMaxK and row lengths around k.
class WindowFormTest : public ::testing::TestWithParam<std::tuple<WindowForm, int64_t>> {};

TEST_P(WindowFormTest, RandomWindows) {
  const auto [form, k] = GetParam();
  auto rng = MakeRng();
  const int64_t m = 24;
  const int64_t n = std::max<int64_t>(4 * k + 13, 300);
  TopKCase c(m, n, k, form, /*with_values=*/true);
  FillNormal(c.logits, rng, 2.0);
  std::uniform_int_distribution<int64_t> pos(-20, n + 20);
  for (int64_t r = 0; r < m; ++r) {
    int64_t begin = pos(rng), end = pos(rng);
    if (r % 4 == 0) std::swap(begin, end);          // some empty windows
    if (r % 4 == 1) end = begin + k + (r % 3) - 1;  // lengths around k
    if (form == WindowForm::kLengths) begin = 0;
    c.SetWindow(r, begin, end);
  }
  c.FillOutsideWindows(kHuge);
  RunAndCheck(c);
}

INSTANTIATE_TEST_SUITE_P(
    TopK, WindowFormTest,
    ::testing::Combine(::testing::Values(WindowForm::kKsKe, WindowForm::kLengths),
                       ::testing::Values(1, 7, 64, 2048, kMaxK)),
    [](const ::testing::TestParamInfo<WindowFormTest::ParamType>& info) {
      return std::string(std::get<0>(info.param) == WindowForm::kKsKe ? "KsKe" : "Lengths") + "_k" +
             std::to_string(std::get<1>(info.param));
    });

TEST(TopK, PaddedRowStrides) {
  auto rng = MakeRng();
  const int64_t m = 5, n = 9000, k = 2048;
  TopKCase c(m, n, k, WindowForm::kKsKe, /*with_values=*/true, /*logits_ld=*/n + 37,
             /*out_ld=*/k + 5);
  FillNormal(c.logits, rng, 1.0);
  float* base = c.logits.data<float>();
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = n; j < n + 37 && r + 1 < m; ++j) base[r * (n + 37) + j] = kHuge;
  }
  c.SetFullWindows();
  c.SetWindow(2, 1000, 2500);  // shorter than k
  RunAndCheck(c);
  // The output padding keeps PoisonNaN's patterns: nothing was written between rows.
  for (int64_t r = 0; r + 1 < m; ++r) {
    for (int64_t j = k; j < k + 5; ++j) {
      EXPECT_EQ(c.indices.data<int32_t>()[r * (k + 5) + j], 0x7f7f7f7f) << r << "," << j;
      EXPECT_TRUE(testing::IsPoisonF32(c.values.data<float>()[r * (k + 5) + j])) << r << "," << j;
    }
  }
}

TEST(TopK, ValuesOutput) {
  auto rng = MakeRng();
  TopKCase with(16, 4000, 256, WindowForm::kLengths, /*with_values=*/true);
  FillNormal(with.logits, rng, 3.0);
  std::uniform_int_distribution<int64_t> len(0, 4000);
  for (int64_t r = 0; r < 16; ++r) with.SetWindow(r, 0, len(rng));
  with.FillOutsideWindows(kHuge);
  RunAndCheck(with);  // values bit-exact the chosen logits, -inf where padded

  TopKCase without(16, 4000, 256, WindowForm::kLengths, /*with_values=*/false);
  FillNormal(without.logits, rng, 3.0);
  without.SetFullWindows();
  RunAndCheck(without);
}

TEST(TopK, SmallSizesAndTails) {
  auto rng = MakeRng();
  for (int64_t m : {0, 1, 3}) {
    for (int64_t n : {0, 1, 63, 64, 65}) {
      for (int64_t k : {1, 63, 64, 65}) {
        SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k);
        TopKCase c(m, n, k, WindowForm::kKsKe, /*with_values=*/true);
        FillNormal(c.logits, rng, 1.0);
        c.SetFullWindows();
        RunAndCheck(c);
      }
    }
  }
}

// Long rows whose every 64th column holds one of a few hundred large values: a strided sample
// of the row sees only those and overestimates the threshold; the result must still be right.
TEST(TopK, MisleadingSampleStillExact) {
  auto rng = MakeRng();
  const int64_t n = 65536;
  TopKCase c(4, n, 2048, WindowForm::kLengths, /*with_values=*/true);
  FillNormal(c.logits, rng, 1.0);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t j = r; j < n; j += 64 * (r + 1))
      c.Logit(r, j) = 100.0f + static_cast<float>(j % 7);
    for (int64_t j = 32 + r; j < n; j += 64) c.Logit(r, j) += 50.0f;
  }
  c.SetFullWindows();
  RunAndCheck(c);
}

TEST(TopK, ManyRowsAcrossThreads) {
  auto rng = MakeRng();
  const int64_t m = 257, n = 6000;
  TopKCase c(m, n, 512, WindowForm::kKsKe, /*with_values=*/false);
  FillNormal(c.logits, rng, 1.0);
  for (int64_t r = 0; r < m; ++r) c.SetWindow(r, r * 7, r * 23 + 100);  // causal-like growth
  c.FillOutsideWindows(kHuge);
  RunAndCheck(c);
}

}  // namespace
}  // namespace attnd::kernels::topk
