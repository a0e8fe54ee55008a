// Small f32 GEMM for the CPU kernels: C[M,N] (+)= A[M,K] · B, B given as [K,N] or as Bᵀ [N,K].
// A register-blocked 6×16 micro-kernel on 8-wide vectors (AVX2 + FMA under -march=x86-64-v3)
// over B panels packed into a caller-provided buffer. No threads: callers parallelise outside.
//   std::vector<float> pack(GemmPackSize(k));
//   GemmF32(m, n, k, a, lda, kt, ldkt, /*b_transposed=*/true, s, lds, /*accumulate=*/false,
//           pack.data());
#pragma once

#include <cstdint>

#include "kernels/common/math.h"

namespace attnd::kernels::cpu {

inline constexpr int kGemmMr = 6;   // rows of C per micro-tile
inline constexpr int kGemmNr = 16;  // columns of C per micro-tile (two 8-wide vectors)

// Floats of scratch GemmF32 needs for a given K.
inline int64_t GemmPackSize(int64_t k) { return k * kGemmNr; }

// Pre-packed B, for a B reused across many products (one query's Qᵀ against every KV chunk) or
// written straight in this layout by a caller that converts its data anyway: ceil(n/16) panels
// of k×16 floats, B(kk, j) at packed[(j / 16)·k·16 + kk·16 + j % 16], columns past n zero.
inline int64_t GemmPackedBSize(int64_t n, int64_t k) { return CeilDiv(n, kGemmNr) * kGemmNr * k; }
void GemmPackB(int64_t n, int64_t k, const float* b, int64_t ldb, bool b_transposed, float* packed);

// C[i*ldc + j] = (accumulate ? C : 0) + Σ_k A[i*lda + k] · B(k, j), where B(k, j) is
// b[k*ldb + j] or, with b_transposed, b[j*ldb + k]. `pack` holds GemmPackSize(k) floats.
void GemmF32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, bool b_transposed, float* c, int64_t ldc, bool accumulate, float* pack);

// GemmF32 with B given in the GemmPackB layout (GemmPackedBSize(n, k) floats).
void GemmF32PackedB(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                    const float* packed_b, float* c, int64_t ldc, bool accumulate);

}  // namespace attnd::kernels::cpu
