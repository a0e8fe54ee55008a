// Tile helpers shared by the CPU attention kernels (dense MLA decode / prefill): bf16 rows to f32
// (row-major or straight into cpu::GemmPackB panels), a vectorised exp2, causal masking, the
// online softmax over a transposed score tile Sᵀ[token][row] (rows on the contiguous axis, 8 at a
// time) and the Pᵀ → P transpose. Include only from sources built with attnd_cpu_kernel_flags.
//   cpu::OnlineSoftmaxColumns(nt, rp, st, rp, m, l, alpha);  // then rescale O, O += P·V
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/cpu/gemm.h"
#include "kernels/common/math.h"

namespace attnd::kernels::cpu {

typedef float V8f __attribute__((vector_size(32)));
typedef float V8fu __attribute__((vector_size(32), aligned(4)));
typedef int32_t V8i __attribute__((vector_size(32)));
typedef int32_t V8iu __attribute__((vector_size(32), aligned(4)));
typedef uint16_t V8h __attribute__((vector_size(16)));
typedef uint16_t V8hu __attribute__((vector_size(16), aligned(2)));
typedef uint32_t V8u __attribute__((vector_size(32)));

inline constexpr int kVec = 8;  // floats per vector; tile row counts are padded to a multiple

inline V8f LoadV(const float* p) { return *reinterpret_cast<const V8fu*>(p); }
inline void StoreV(float* p, V8f v) { *reinterpret_cast<V8fu*>(p) = v; }
inline V8f SplatV(float x) { return V8f{x, x, x, x, x, x, x, x}; }
inline V8f MaxV(V8f a, V8f b) { return a > b ? a : b; }

// 2^x for x <= 0 (softmax exponents), relative error ~2e-7: Cody–Waite split x = n + f,
// f in [-1/2, 1/2], Cephes' degree-6 polynomial for 2^f, 2^n through the exponent bits.
// x < -126 (including -inf) gives exactly 0; NaN stays NaN.
inline V8f Exp2V(V8f x) {
  const V8f min_x = SplatV(-126.0f);
  const V8f xc = x < min_x ? min_x : x;
  const V8f round = SplatV(12582912.0f);  // 1.5·2^23: adding it rounds to an integer
  const V8f n = (xc + round) - round;
  const V8f f = xc - n;
  V8f p = SplatV(1.535336188319500e-4f);
  p = p * f + SplatV(1.339887440266574e-3f);
  p = p * f + SplatV(9.618437357674640e-3f);
  p = p * f + SplatV(5.550332471162809e-2f);
  p = p * f + SplatV(2.402264791363012e-1f);
  p = p * f + SplatV(6.931472028550421e-1f);
  p = p * f + SplatV(1.0f);
  const V8i bits = (__builtin_convertvector(n, V8i) + 127) << 23;
  const V8f r = p * (V8f)bits;
  return x < min_x ? SplatV(0.0f) : r;
}

// dst[0..n) = src[0..n) (bf16 bits) as f32.
inline void Bf16ToF32Row(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + kVec <= n; i += kVec) {
    const V8h h = *reinterpret_cast<const V8hu*>(src + i);
    const V8u u = __builtin_convertvector(h, V8u) << 16;
    StoreV(dst + i, (V8f)u);
  }
  for (; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &u, sizeof u);
  }
}

// Row t of a k-row matrix in cpu::GemmPackB layout (16-column panels of k×16 floats) from the
// n bf16 values at src; the lanes of the last panel past n are zeroed.
inline void Bf16RowToPacked(const uint16_t* src, int64_t n, int64_t t, int64_t k, float* packed) {
  constexpr int64_t kPanel = kGemmNr;
  int64_t j = 0;
  for (; j + kPanel <= n; j += kPanel) Bf16ToF32Row(src + j, kPanel, packed + j * k + t * kPanel);
  if (j < n) {
    float* dst = packed + j * k + t * kPanel;
    Bf16ToF32Row(src + j, n - j, dst);
    for (int64_t i = n - j; i < kPanel; ++i) dst[i] = 0.0f;
  }
}

// Column r of a k-row matrix in cpu::GemmPackB layout from scale · the k bf16 values at src, or
// zeros when src is null (padding columns).
inline void Bf16ColumnToPacked(const uint16_t* src, int64_t k, int64_t r, float scale,
                               float* packed) {
  float* dst = packed + (r / kGemmNr) * k * kGemmNr + r % kGemmNr;
  for (int64_t i = 0; i < k; ++i) {
    float x = 0.0f;
    if (src != nullptr) {
      const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
      std::memcpy(&x, &u, sizeof u);
    }
    dst[i * kGemmNr] = x * scale;
  }
}

// Asks for the `bytes` bytes at p to be pulled into cache (a hint; never faults).
inline void PrefetchBytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off);
}

// Sᵀ[t][c] = -inf where pos[t] >= limit[c]: token t is past row c's last visible position.
// `cols` is a multiple of kVec.
inline void MaskByLimit(int64_t nt, int64_t cols, const int32_t* pos, const int32_t* limit,
                        float* st, int64_t ld) {
  const V8f neg_inf = SplatV(kNegInf);
  for (int64_t t = 0; t < nt; ++t) {
    const V8i p = V8i{} + pos[t];
    float* row = st + t * ld;
    for (int64_t c = 0; c < cols; c += kVec) {
      const V8i lim = *reinterpret_cast<const V8iu*>(limit + c);
      StoreV(row + c, p >= lim ? neg_inf : LoadV(row + c));
    }
  }
}

// One online-softmax step over a score tile Sᵀ[nt][cols] in log2 units (masked = -inf), column c
// being one query row. Updates the running max m[c] and sum l[c], overwrites the tile with
// Pᵀ = 2^(S − m_new) and writes alpha[c] = 2^(m_old − m_new), the factor to rescale that row's
// output accumulator by. A column that has seen only -inf keeps m = -inf, l = 0 and gets P = 0.
// `cols` is a multiple of kVec.
inline void OnlineSoftmaxColumns(int64_t nt, int64_t cols, float* st, int64_t ld, float* m,
                                 float* l, float* alpha) {
  const V8f neg_inf = SplatV(kNegInf);
  for (int64_t c = 0; c < cols; c += kVec) {
    const V8f m_old = LoadV(m + c);
    V8f m_new = m_old;
    for (int64_t t = 0; t < nt; ++t) m_new = MaxV(m_new, LoadV(st + t * ld + c));
    const V8f m_use = m_new == neg_inf ? SplatV(0.0f) : m_new;
    const V8f a = Exp2V(m_old - m_use);
    V8f sum = SplatV(0.0f);
    for (int64_t t = 0; t < nt; ++t) {
      const V8f p = Exp2V(LoadV(st + t * ld + c) - m_use);
      StoreV(st + t * ld + c, p);
      sum += p;
    }
    StoreV(l + c, LoadV(l + c) * a + sum);
    StoreV(m + c, m_new);
    StoreV(alpha + c, a);
  }
}

// Rounds an nt×cols tile of P (row stride ld) to bf16 values in place, to nearest even: the
// FAST precision's P (kernels/common/precision.h), applied after OnlineSoftmaxColumns has summed
// the unrounded values into l. `cols` is a multiple of kVec; P is finite and >= 0.
inline void RoundTileToBf16(int64_t nt, int64_t cols, float* st, int64_t ld) {
  const V8u keep = V8u{} + 0xffff0000u;
  for (int64_t t = 0; t < nt; ++t) {
    float* row = st + t * ld;
    for (int64_t c = 0; c < cols; c += kVec) {
      const V8u u = (V8u)LoadV(row + c);
      StoreV(row + c, (V8f)((u + 0x7fffu + ((u >> 16) & 1u)) & keep));
    }
  }
}

// Lanes of two V8f picked by constant indices (0..7 from a, 8..15 from b): GCC's
// __builtin_shuffle, or clang's __builtin_shufflevector (clang builds: the sanitizer build).
#if defined(__clang__)
#define ATTND_SHUFFLE8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define ATTND_SHUFFLE8(a, b, ...) __builtin_shuffle(a, b, V8i{__VA_ARGS__})
#endif

// dst[j][i] = src[i][j] for an 8×8 block (unpack, 64-bit shuffle, 128-bit permute).
inline void Transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  V8f r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = LoadV(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = ATTND_SHUFFLE8(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = ATTND_SHUFFLE8(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = ATTND_SHUFFLE8(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[i + 1] = ATTND_SHUFFLE8(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[i + 2] = ATTND_SHUFFLE8(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[i + 3] = ATTND_SHUFFLE8(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int i = 0; i < 4; ++i) {
    StoreV(dst + i * ldd, ATTND_SHUFFLE8(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11));
    StoreV(dst + (i + 4) * ldd, ATTND_SHUFFLE8(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15));
  }
}
#undef ATTND_SHUFFLE8

// p[r][t] = pt[t][r] for r < rows, t < nt: 8×8 blocks, scalar edges.
inline void TransposeTile(int64_t nt, int64_t rows, const float* pt, int64_t ldpt, float* p,
                          int64_t ldp) {
  const int64_t nt8 = nt / kVec * kVec, rows8 = rows / kVec * kVec;
  for (int64_t t = 0; t < nt8; t += kVec) {
    for (int64_t r = 0; r < rows8; r += kVec) {
      Transpose8x8(pt + t * ldpt + r, ldpt, p + r * ldp + t, ldp);
    }
  }
  for (int64_t t = 0; t < nt; ++t) {
    const float* src = pt + t * ldpt;
    for (int64_t r = (t < nt8 ? rows8 : 0); r < rows; ++r) p[r * ldp + t] = src[r];
  }
}

// o[r][0..n) *= alpha[r] for each row whose factor is not 1.
inline void RescaleRows(int64_t rows, int64_t n, const float* alpha, float* o, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    const float a = alpha[r];
    if (a == 1.0f) continue;
    float* row = o + r * ldo;
    for (int64_t j = 0; j < n; ++j) row[j] *= a;
  }
}

}  // namespace attnd::kernels::cpu
