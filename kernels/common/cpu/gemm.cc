#include "kernels/common/cpu/gemm.h"

#include <algorithm>
#include <cstring>

namespace attnd::kernels::cpu {
namespace {

typedef float V8 __attribute__((vector_size(32)));
typedef float V8u __attribute__((vector_size(32), aligned(4)));  // unaligned load/store type

inline V8 Load(const float* p) { return *reinterpret_cast<const V8u*>(p); }
inline void Store(float* p, V8 v) { *reinterpret_cast<V8u*>(p) = v; }
inline V8 Broadcast(float x) { return V8{x, x, x, x, x, x, x, x}; }

// Packs columns [j0, j0 + cols) of B into pack[k][0..16), zero-padding past `cols`.
void PackB(int64_t k, const float* b, int64_t ldb, bool b_transposed, int64_t j0, int cols,
           float* pack) {
  if (!b_transposed) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const float* src = b + kk * ldb + j0;
      float* dst = pack + kk * kGemmNr;
      int j = 0;
      for (; j < cols; ++j) dst[j] = src[j];
      for (; j < kGemmNr; ++j) dst[j] = 0.0f;
    }
    return;
  }
  for (int j = 0; j < kGemmNr; ++j) {
    if (j < cols) {
      const float* src = b + (j0 + j) * ldb;
      for (int64_t kk = 0; kk < k; ++kk) pack[kk * kGemmNr + j] = src[kk];
    } else {
      for (int64_t kk = 0; kk < k; ++kk) pack[kk * kGemmNr + j] = 0.0f;
    }
  }
}

// C tile [MR, 16] from A rows and a packed B panel; writes `cols` columns.
template <int MR>
void MicroKernel(int64_t k, const float* a, int64_t lda, const float* pack, float* c, int64_t ldc,
                 int cols, bool accumulate) {
  V8 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = Broadcast(0.0f);
  for (int64_t kk = 0; kk < k; ++kk) {
    const V8 b0 = Load(pack + kk * kGemmNr);
    const V8 b1 = Load(pack + kk * kGemmNr + 8);
    for (int i = 0; i < MR; ++i) {
      const V8 ai = Broadcast(a[i * lda + kk]);
      acc[i][0] += ai * b0;
      acc[i][1] += ai * b1;
    }
  }
  if (cols == kGemmNr) {
    for (int i = 0; i < MR; ++i) {
      float* row = c + i * ldc;
      if (accumulate) {
        Store(row, Load(row) + acc[i][0]);
        Store(row + 8, Load(row + 8) + acc[i][1]);
      } else {
        Store(row, acc[i][0]);
        Store(row + 8, acc[i][1]);
      }
    }
    return;
  }
  for (int i = 0; i < MR; ++i) {
    float tile[kGemmNr];
    Store(tile, acc[i][0]);
    Store(tile + 8, acc[i][1]);
    float* row = c + i * ldc;
    for (int j = 0; j < cols; ++j) row[j] = accumulate ? row[j] + tile[j] : tile[j];
  }
}

void MicroKernelRows(int rows, int64_t k, const float* a, int64_t lda, const float* pack, float* c,
                     int64_t ldc, int cols, bool accumulate) {
  switch (rows) {
    case 6: return MicroKernel<6>(k, a, lda, pack, c, ldc, cols, accumulate);
    case 5: return MicroKernel<5>(k, a, lda, pack, c, ldc, cols, accumulate);
    case 4: return MicroKernel<4>(k, a, lda, pack, c, ldc, cols, accumulate);
    case 3: return MicroKernel<3>(k, a, lda, pack, c, ldc, cols, accumulate);
    case 2: return MicroKernel<2>(k, a, lda, pack, c, ldc, cols, accumulate);
    case 1: return MicroKernel<1>(k, a, lda, pack, c, ldc, cols, accumulate);
    default: return;
  }
}

}  // namespace

void GemmF32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, bool b_transposed, float* c, int64_t ldc, bool accumulate, float* pack) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    }
    return;
  }
  for (int64_t j0 = 0; j0 < n; j0 += kGemmNr) {
    const int cols = static_cast<int>(std::min<int64_t>(kGemmNr, n - j0));
    PackB(k, b, ldb, b_transposed, j0, cols, pack);
    for (int64_t i0 = 0; i0 < m; i0 += kGemmMr) {
      const int rows = static_cast<int>(std::min<int64_t>(kGemmMr, m - i0));
      MicroKernelRows(rows, k, a + i0 * lda, lda, pack, c + i0 * ldc + j0, ldc, cols, accumulate);
    }
  }
}

void GemmPackB(int64_t n, int64_t k, const float* b, int64_t ldb, bool b_transposed,
               float* packed) {
  for (int64_t j0 = 0; j0 < n; j0 += kGemmNr) {
    const int cols = static_cast<int>(std::min<int64_t>(kGemmNr, n - j0));
    PackB(k, b, ldb, b_transposed, j0, cols, packed + j0 * k);
  }
}

void GemmF32PackedB(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                    const float* packed_b, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    }
    return;
  }
  for (int64_t j0 = 0; j0 < n; j0 += kGemmNr) {
    const int cols = static_cast<int>(std::min<int64_t>(kGemmNr, n - j0));
    const float* panel = packed_b + j0 * k;
    for (int64_t i0 = 0; i0 < m; i0 += kGemmMr) {
      const int rows = static_cast<int>(std::min<int64_t>(kGemmMr, m - i0));
      MicroKernelRows(rows, k, a + i0 * lda, lda, panel, c + i0 * ldc + j0, ldc, cols, accumulate);
    }
  }
}

}  // namespace attnd::kernels::cpu
