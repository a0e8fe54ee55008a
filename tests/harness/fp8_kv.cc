#include "tests/harness/fp8_kv.h"

#include <cmath>
#include <cstring>

#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"
#include "kernels/sparse_mla/params.h"

namespace attnd::testing {

namespace {
// The FP8 row layout (kernels/sparse_mla/params.h).
constexpr int64_t kDimV = kernels::sparse_mla::kDimV;
constexpr int64_t kFp8DimQk = kernels::sparse_mla::kFp8DimQk;
constexpr int64_t kFp8RopeOffset = kernels::sparse_mla::kFp8RopeOffset;
constexpr int64_t kFp8ScaleCols = kernels::sparse_mla::kFp8ScaleCols;
constexpr int64_t kFp8ScaleOffset = kernels::sparse_mla::kFp8ScaleOffset;
}  // namespace

void FillFp8Row(uint8_t* row, std::mt19937_64& rng, bool pow2_scales) {
  std::normal_distribution<float> wide(0.0f, 64.0f), narrow(0.0f, 1.0f / 64), rope(0.0f, 1.0f);
  std::bernoulli_distribution subnormal(0.04), small_tile(0.25);
  std::uniform_int_distribution<int> sub_code(0, 15), exponent(-9, -5);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int64_t j = 0; j < kDimV / kFp8ScaleCols; ++j) {
    // A quarter of the tiles hold small codes (about two thirds subnormal) under a large scale,
    // so subnormal decoding matters to the output; the rest span the normal range, 4% of them
    // replaced by random subnormal codes.
    const bool small = small_tile(rng);
    for (int64_t c = j * kFp8ScaleCols; c < (j + 1) * kFp8ScaleCols; ++c) {
      uint8_t code = kernels::FloatToFp8E4M3(small ? narrow(rng) : wide(rng));
      if (!small && subnormal(rng)) {
        const int r = sub_code(rng);
        code = static_cast<uint8_t>((r & 8) << 4 | (r & 7));  // sign, E = 0, mantissa
      }
      if ((code & 0x7f) == 0x7f) code &= 0xfe;  // never a NaN code (|x| < 448 makes none)
      row[c] = code;
    }
    float scale = std::ldexp(1.0f, exponent(rng) + (small ? 11 : 0));
    if (!pow2_scales) scale *= mantissa(rng);
    std::memcpy(row + kFp8ScaleOffset + 4 * j, &scale, sizeof scale);
  }
  for (int64_t d = 0; d < kFp8DimQk - kDimV; ++d) {
    const kernels::bf16_t b = kernels::FloatToBf16(rope(rng));
    std::memcpy(row + kFp8RopeOffset + 2 * d, &b, sizeof b);
  }
}

HostTensor Fp8KvAsBf16(const kernels::Tensor& kv) {
  const int64_t s = kv.dim(0);
  HostTensor out = HostTensor::Dense(kernels::DType::kBF16, {s, kFp8DimQk});
  for (int64_t r = 0; r < s; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(kv.data) + r * kv.stride(0);
    kernels::bf16_t* dst = out.data<kernels::bf16_t>() + r * kFp8DimQk;
    for (int64_t c = 0; c < kDimV; ++c) {
      float scale;
      std::memcpy(&scale, row + kFp8ScaleOffset + 4 * (c / kFp8ScaleCols), sizeof scale);
      dst[c] = kernels::FloatToBf16(kernels::Fp8E4M3ToFloat(row[c]) * scale);
    }
    std::memcpy(dst + kDimV, row + kFp8RopeOffset, (kFp8DimQk - kDimV) * 2);
  }
  return out;
}

void QuantizeMlaRowPerTensor(const kernels::bf16_t* src, int64_t n, float scale, uint8_t* dst) {
  for (int64_t c = 0; c < n; ++c) {
    // f32 division, then e4m3fn with round-to-nearest-even and finite saturation
    // (kernels/common/fp8.h FloatToFp8E4M3 has exactly cvt.rn.satfinite's semantics).
    dst[c] = kernels::FloatToFp8E4M3(kernels::Bf16ToFloat(src[c]) / scale);
  }
}

void FillMlaSourceRow(kernels::bf16_t* row, int64_t n, float scale, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::bernoulli_distribution sign(0.5);
  for (int64_t c = 0; c < n; ++c) {
    const float u = unit(rng);
    float x = normal(rng);
    if (u < 0.04f) {
      x = scale * std::ldexp(unit(rng), -6);  // e4m3 subnormal range after the division
    } else if (u < 0.05f) {
      x = scale * (448.0f + 448.0f * unit(rng));  // saturates to 448
    }
    row[c] = kernels::FloatToBf16(sign(rng) && u < 0.05f ? -x : x);
  }
}

HostTensor Fp8PerTensorKvAsBf16(const kernels::Tensor& kv, float scale) {
  const int64_t s = kv.dim(0), w = kv.dim(1);
  HostTensor out = HostTensor::Dense(kernels::DType::kBF16, {s, w});
  for (int64_t r = 0; r < s; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(kv.data) + r * kv.stride(0);
    kernels::bf16_t* dst = out.data<kernels::bf16_t>() + r * w;
    for (int64_t c = 0; c < w; ++c)
      dst[c] = kernels::FloatToBf16(kernels::Fp8E4M3ToFloat(row[c]) * scale);
  }
  return out;
}

}  // namespace attnd::testing
