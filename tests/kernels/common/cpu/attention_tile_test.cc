// The CPU attention tile helpers: exp2 accuracy and its -inf / NaN edges, bf16 conversion into
// row-major and GemmPackB layouts, the 8×8-blocked transpose on ragged edges, causal masking and
// one online-softmax step against a double loop. (Built into mla_decode_test, which compiles
// with the CPU kernel flags these helpers need.)
#include "kernels/common/cpu/attention_tile.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "tests/harness/harness.h"

namespace attnd::kernels::cpu {
namespace {

float Exp2One(float x) {
  float in[kVec], out[kVec];
  for (float& v : in) v = x;
  StoreV(out, Exp2V(LoadV(in)));
  return out[0];
}

// Relative error ≤ 4e-7 over the softmax range [-126, 0]; exactly 0 below; NaN stays NaN.
TEST(AttentionTile, Exp2Accuracy) {
  auto rng = testing::MakeRng();
  std::uniform_real_distribution<float> dist(-126.0f, 0.0f);
  double worst = 0;
  for (int i = 0; i < 100000; ++i) {
    const float x = i < 1000 ? -static_cast<float>(i) / 8 : dist(rng);
    const double want = std::exp2(static_cast<double>(x));
    worst = std::max(worst, std::fabs(Exp2One(x) - want) / want);
  }
  EXPECT_LE(worst, 4e-7);
  EXPECT_EQ(Exp2One(0.0f), 1.0f);
  EXPECT_EQ(Exp2One(-127.5f), 0.0f);
  EXPECT_EQ(Exp2One(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isnan(Exp2One(std::nanf(""))));
}

TEST(AttentionTile, Bf16RowsToRowMajorAndPacked) {
  auto rng = testing::MakeRng();
  std::normal_distribution<float> dist;
  for (int64_t n : {1, 7, 16, 37, 512}) {
    const int64_t k = 5, panels = (n + kGemmNr - 1) / kGemmNr;
    std::vector<std::vector<bf16_t>> rows(k, std::vector<bf16_t>(n));
    std::vector<float> packed(panels * kGemmNr * k, 99.0f), row_major(n);
    for (int64_t t = 0; t < k; ++t) {
      for (auto& x : rows[t]) x = FloatToBf16(dist(rng));
      Bf16RowToPacked(rows[t].data(), n, t, k, packed.data());
    }
    Bf16ToF32Row(rows[2].data(), n, row_major.data());
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(row_major[j], Bf16ToFloat(rows[2][j])) << n;
    for (int64_t t = 0; t < k; ++t) {
      for (int64_t j = 0; j < panels * kGemmNr; ++j) {
        const float want = j < n ? Bf16ToFloat(rows[t][j]) : 0.0f;
        ASSERT_EQ(packed[(j / kGemmNr) * k * kGemmNr + t * kGemmNr + j % kGemmNr], want)
            << "n " << n << " t " << t << " j " << j;
      }
    }
    // Columns: the same layout with B(kk, r) = scale · src[kk]; null src gives zeros.
    std::vector<float> cols(panels * kGemmNr * k, 99.0f);
    for (int64_t r = 0; r < panels * kGemmNr; ++r) {
      Bf16ColumnToPacked(r < k ? rows[r].data() : nullptr, std::min<int64_t>(n, k), r, 0.5f,
                         cols.data());
    }
    const int64_t kk_rows = std::min<int64_t>(n, k);
    for (int64_t r = 0; r < panels * kGemmNr; ++r) {
      for (int64_t kk = 0; kk < kk_rows; ++kk) {
        const float want = r < k ? 0.5f * Bf16ToFloat(rows[r][kk]) : 0.0f;
        ASSERT_EQ(cols[(r / kGemmNr) * kk_rows * kGemmNr + kk * kGemmNr + r % kGemmNr], want);
      }
    }
  }
}

TEST(AttentionTile, TransposeRaggedEdges) {
  for (int64_t nt : {1, 8, 13, 64}) {
    for (int64_t rows : {1, 8, 9, 24}) {
      const int64_t ldpt = rows + 3, ldp = 67;
      std::vector<float> pt(nt * ldpt), p(rows * ldp, -1.0f);
      for (size_t i = 0; i < pt.size(); ++i) pt[i] = static_cast<float>(i);
      TransposeTile(nt, rows, pt.data(), ldpt, p.data(), ldp);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t t = 0; t < ldp; ++t) {
          ASSERT_EQ(p[r * ldp + t], t < nt ? pt[t * ldpt + r] : -1.0f)
              << nt << "x" << rows << " r " << r << " t " << t;
        }
      }
    }
  }
}

// One masked online-softmax step over a tile that extends a running (m, l), against doubles.
TEST(AttentionTile, MaskAndOnlineSoftmaxStep) {
  auto rng = testing::MakeRng();
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int64_t nt = 11, cols = 16;
  std::vector<float> st(nt * cols), m(cols), l(cols), alpha(cols);
  std::vector<int32_t> pos(nt), limit(cols);
  for (auto& x : st) x = dist(rng);
  for (int64_t t = 0; t < nt; ++t) pos[t] = static_cast<int32_t>(100 + t);
  for (int64_t c = 0; c < cols; ++c) {
    limit[c] = static_cast<int32_t>(95 + c);  // columns 0..5 see nothing of this tile
    m[c] = c % 3 == 0 ? kNegInf : dist(rng);  // some columns start empty
    l[c] = std::isinf(m[c]) ? 0.0f : 2.5f;
  }
  const std::vector<float> s0 = st, m0 = m, l0 = l;
  MaskByLimit(nt, cols, pos.data(), limit.data(), st.data(), cols);
  OnlineSoftmaxColumns(nt, cols, st.data(), cols, m.data(), l.data(), alpha.data());
  for (int64_t c = 0; c < cols; ++c) {
    double m_new = m0[c];
    for (int64_t t = 0; t < nt; ++t) {
      if (pos[t] < limit[c]) m_new = std::max(m_new, static_cast<double>(s0[t * cols + c]));
    }
    EXPECT_EQ(m[c], static_cast<float>(m_new)) << c;
    if (std::isinf(m_new)) {
      EXPECT_EQ(l[c], 0.0f) << c;
      for (int64_t t = 0; t < nt; ++t) EXPECT_EQ(st[t * cols + c], 0.0f) << c;
      continue;
    }
    const double a = std::exp2(static_cast<double>(m0[c] - static_cast<float>(m_new)));
    double sum = 0;
    for (int64_t t = 0; t < nt; ++t) {
      // The kernel's exponent is the f32 difference (rounded: up to 2^-20 relative of |x|, i.e.
      // several e-7 of 2^x at x ~ -16); 4e-7 bounds the polynomial's own error on that input.
      const float x = s0[t * cols + c] - static_cast<float>(m_new);
      const double want = pos[t] < limit[c] ? std::exp2(static_cast<double>(x)) : 0.0;
      EXPECT_NEAR(st[t * cols + c], want, 4e-7 * want) << c << " " << t;
      sum += want;
    }
    EXPECT_NEAR(alpha[c], a, 4e-7 * a) << c;
    EXPECT_NEAR(l[c], l0[c] * a + sum, 1e-6 * (l0[c] * a + sum)) << c;
  }
}

}  // namespace
}  // namespace attnd::kernels::cpu
