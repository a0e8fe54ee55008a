#include "kernels/indexer_logits/cpu_tile.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/common/cpu/gemm.h"

namespace attnd::kernels::indexer_logits {
namespace {

typedef float V8 __attribute__((vector_size(32)));
typedef float V8u __attribute__((vector_size(32), aligned(4)));  // unaligned load/store type
typedef int32_t V8i __attribute__((vector_size(32)));

constexpr int kVec = 8;
constexpr int32_t kFp8ExpBias = 7;
constexpr int32_t kF32ExpBias = 127;
constexpr int32_t kF32QuietNaN = 0x7fc00000;

inline V8 Load(const float* p) { return *reinterpret_cast<const V8u*>(p); }
inline void Store(float* p, V8 v) { *reinterpret_cast<V8u*>(p) = v; }
inline V8 Relu(V8 v) { return v > 0.0f ? v : V8{}; }

inline float HorizontalSum(V8 v) {
  float lanes[kVec];
  Store(lanes, v);
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
         ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

// Eight e4m3fn bytes to f32. Normal codes move exponent and mantissa into place and rebias;
// subnormal codes (exponent 0) are mantissa · 2^-9, exact in f32; S.1111.111 is NaN.
inline V8 DecodeFp8x8(const uint8_t* src) {
  int64_t bytes;
  std::memcpy(&bytes, src, sizeof bytes);
  const V8i x = __builtin_bit_cast(V8i, _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes)));
  const V8i magnitude = x & 0x7f;
  const V8i sign = (x & 0x80) << 24;
  const V8i normal = (magnitude << 20) + ((kF32ExpBias - kFp8ExpBias) << 23);
  const V8 subnormal = __builtin_convertvector(magnitude, V8) * (1.0f / 512.0f);
  V8i bits = magnitude < 8 ? __builtin_bit_cast(V8i, subnormal) : normal;
  bits = magnitude == 0x7f ? V8i{} + kF32QuietNaN : bits;
  bits |= sign;
  return __builtin_bit_cast(V8, bits);
}

// Σ_h w[h] · relu(s[h]) over `heads` contiguous scores.
inline float HeadSum(const float* s, const float* w, int64_t heads) {
  V8 acc0{}, acc1{};
  int64_t h = 0;
  for (; h + 2 * kVec <= heads; h += 2 * kVec) {
    acc0 += Load(w + h) * Relu(Load(s + h));
    acc1 += Load(w + h + kVec) * Relu(Load(s + h + kVec));
  }
  if (h + kVec <= heads) {
    acc0 += Load(w + h) * Relu(Load(s + h));
    h += kVec;
  }
  float sum = HorizontalSum(acc0 + acc1);
  for (; h < heads; ++h) sum += w[h] * std::max(s[h], 0.0f);
  return sum;
}

}  // namespace

int64_t QueriesPerBlock(int64_t heads) {
  return std::max<int64_t>(1, kTargetColumns / std::max<int64_t>(1, heads));
}

void DecodeFp8(const uint8_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + kVec <= n; i += kVec) Store(dst + i, DecodeFp8x8(src + i));
  if (i < n) {
    uint8_t tail[kVec] = {};
    float out[kVec];
    std::memcpy(tail, src + i, static_cast<size_t>(n - i));
    Store(out, DecodeFp8x8(tail));
    std::memcpy(dst + i, out, static_cast<size_t>(n - i) * sizeof(float));
  }
}

void QueryBlock::Load(const uint8_t* q, int64_t q_stride, int64_t head_stride, const float* w,
                      int64_t w_stride, int64_t nq, int64_t heads, int64_t dim) {
  heads_ = heads;
  dim_ = dim;
  const int64_t columns = nq * heads;
  packed_.resize(static_cast<size_t>(cpu::GemmPackedBSize(columns, dim)));
  weights_.resize(static_cast<size_t>(columns));
  // Columns past nq·heads in the last panel are zero (the micro-kernel reads whole panels).
  const int64_t last_panel = columns / cpu::kGemmNr * cpu::kGemmNr;
  if (last_panel < columns) {
    std::fill(packed_.begin() + last_panel * dim, packed_.end(), 0.0f);
  }
  std::vector<float> row(static_cast<size_t>(dim));
  for (int64_t i = 0; i < nq; ++i) {
    std::memcpy(weights_.data() + i * heads, w + i * w_stride, heads * sizeof(float));
    for (int64_t h = 0; h < heads; ++h) {
      DecodeFp8(q + i * q_stride + h * head_stride, dim, row.data());
      const int64_t j = i * heads + h;
      float* panel = packed_.data() + j / cpu::kGemmNr * cpu::kGemmNr * dim + j % cpu::kGemmNr;
      for (int64_t d = 0; d < dim; ++d) panel[d * cpu::kGemmNr] = row[d];
    }
  }
}

KeyTile::KeyTile(int64_t dim, int64_t columns)
    : dim_(dim),
      keys_(static_cast<size_t>(kKeyTile * dim)),
      scales_(static_cast<size_t>(kKeyTile)),
      scores_(static_cast<size_t>(kKeyTile * (columns + cpu::kGemmNr))) {}

void KeyTile::Score(const QueryBlock& qb, int64_t q_begin, int64_t q_end, int64_t num_keys,
                    const int64_t* lo, const int64_t* hi, float* const* out) {
  if (q_begin >= q_end || num_keys <= 0) return;
  const int64_t heads = qb.heads(), dim = qb.dim();
  // The GEMM starts at the panel holding q_begin's first column.
  const int64_t col_begin = q_begin * heads / cpu::kGemmNr * cpu::kGemmNr;
  const int64_t columns = q_end * heads - col_begin;
  float* scores = scores_.data();
  cpu::GemmF32PackedB(num_keys, columns, dim, keys_.data(), dim, qb.packed() + col_begin * dim,
                      scores, columns, /*accumulate=*/false);
  const float* scales = scales_.data();
  for (int64_t i = q_begin; i < q_end; ++i) {
    const float* w = qb.weights(i);
    const float* s = scores + (i * heads - col_begin);
    float* o = out[i];
    for (int64_t n = lo[i]; n < hi[i]; ++n) {
      o[n] = HeadSum(s + n * columns, w, heads) * scales[n];
    }
  }
}

}  // namespace attnd::kernels::indexer_logits
