#include "kernels/common/cpu/gemm.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace attnd::kernels::cpu {
namespace {

// Checks C = A·B (both B layouts, with and without accumulation) against a double loop for
// sizes around the micro-tile (6×16) edges, with padded leading dimensions.
TEST(GemmF32, MatchesNaiveProductOnTileEdges) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t m : {1, 5, 6, 7, 13}) {
    for (int64_t n : {1, 15, 16, 17, 40}) {
      for (int64_t k : {0, 1, 9, 64}) {
        for (bool bt : {false, true}) {
          for (bool acc : {false, true}) {
            const int64_t lda = k + 3, ldb = (bt ? k : n) + 2, ldc = n + 5;
            std::vector<float> a(m * lda), b((bt ? n : k) * ldb + 1), c(m * ldc), c0;
            for (auto& x : a) x = dist(rng);
            for (auto& x : b) x = dist(rng);
            for (auto& x : c) x = dist(rng);
            c0 = c;
            std::vector<float> pack(GemmPackSize(k) + 1);
            GemmF32(m, n, k, a.data(), lda, b.data(), ldb, bt, c.data(), ldc, acc, pack.data());
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < n; ++j) {
                double want = acc ? c0[i * ldc + j] : 0.0;
                for (int64_t kk = 0; kk < k; ++kk) {
                  want += double(a[i * lda + kk]) * (bt ? b[j * ldb + kk] : b[kk * ldb + j]);
                }
                ASSERT_NEAR(c[i * ldc + j], want, 1e-4 * (1 + std::sqrt(double(k))))
                    << m << "x" << n << "x" << k << " bt=" << bt << " acc=" << acc;
              }
              for (int64_t j = n; j < ldc; ++j) {
                ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]) << "padding untouched";
              }
            }
          }
        }
      }
    }
  }
}

// GemmPackB + GemmF32PackedB give the same bits as GemmF32 (same micro-kernel, same order), and
// the packed layout is the documented one (callers write it directly).
TEST(GemmF32, PackedBMatchesUnpackedAndDocumentedLayout) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t n : {1, 16, 17, 40}) {
    for (bool bt : {false, true}) {
      const int64_t m = 13, k = 9, lda = k + 1, ldb = (bt ? k : n) + 3, ldc = n + 2;
      std::vector<float> a(m * lda), b((bt ? n : k) * ldb), c0(m * ldc), c1, c2;
      for (auto& x : a) x = dist(rng);
      for (auto& x : b) x = dist(rng);
      for (auto& x : c0) x = dist(rng);
      c1 = c2 = c0;
      std::vector<float> pack(GemmPackSize(k)), packed(GemmPackedBSize(n, k), -1.0f);
      GemmF32(m, n, k, a.data(), lda, b.data(), ldb, bt, c1.data(), ldc, true, pack.data());
      GemmPackB(n, k, b.data(), ldb, bt, packed.data());
      for (int64_t j = 0; j < (n + kGemmNr - 1) / kGemmNr * kGemmNr; ++j) {
        for (int64_t kk = 0; kk < k; ++kk) {
          const float want = j < n ? (bt ? b[j * ldb + kk] : b[kk * ldb + j]) : 0.0f;
          ASSERT_EQ(packed[(j / kGemmNr) * k * kGemmNr + kk * kGemmNr + j % kGemmNr], want);
        }
      }
      GemmF32PackedB(m, n, k, a.data(), lda, packed.data(), c2.data(), ldc, true);
      ASSERT_EQ(c1, c2) << "n=" << n << " bt=" << bt;
    }
  }
}

}  // namespace
}  // namespace attnd::kernels::cpu
