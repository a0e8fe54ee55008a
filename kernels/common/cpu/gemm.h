// Small f32 GEMM for the CPU kernels: C[M,N] (+)= A[M,K] · B, B given as [K,N] or as Bᵀ [N,K].
// A register-blocked 6×16 micro-kernel on 8-wide vectors (AVX2 + FMA under -march=x86-64-v3)
// over B panels packed into a caller-provided buffer. No threads: callers parallelise outside.
//   std::vector<float> pack(GemmPackSize(k));
//   GemmF32(m, n, k, a, lda, kt, ldkt, /*b_transposed=*/true, s, lds, /*accumulate=*/false,
//           pack.data());
#pragma once

#include <cstdint>

namespace attnd::kernels::cpu {

inline constexpr int kGemmMr = 6;   // rows of C per micro-tile
inline constexpr int kGemmNr = 16;  // columns of C per micro-tile (two 8-wide vectors)

// Floats of scratch GemmF32 needs for a given K.
inline int64_t GemmPackSize(int64_t k) { return k * kGemmNr; }

// C[i*ldc + j] = (accumulate ? C : 0) + Σ_k A[i*lda + k] · B(k, j), where B(k, j) is
// b[k*ldb + j] or, with b_transposed, b[j*ldb + k]. `pack` holds GemmPackSize(k) floats.
void GemmF32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, bool b_transposed, float* c, int64_t ldc, bool accumulate, float* pack);

}  // namespace attnd::kernels::cpu
