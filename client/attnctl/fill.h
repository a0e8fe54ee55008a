// Random fills and poisoning of host tensors for attnctl's cases (any dtype, strided views).
//   FillNormal(q, rng, 1.0);  FillInt(indices, rng, -1, s - 1);  Poison(out);
#pragma once

#include <cstdint>
#include <random>

#include "kernels/common/tensor.h"

namespace attnd::attnctl {

using Rng = std::mt19937_64;

// N(0, stddev) per element (float dtypes; fp8 saturates at ±448; integer dtypes get rounded
// values). Padding between rows is left as it is.
void FillNormal(const kernels::Tensor& t, Rng& rng, double stddev);
// U[lo, hi] per element (float dtypes: continuous).
void FillUniform(const kernels::Tensor& t, Rng& rng, double lo, double hi);
// Integers uniform in [lo, hi] (i32 / u8).
void FillInt(const kernels::Tensor& t, Rng& rng, int64_t lo, int64_t hi);
// Every byte of the span: NaN for f32/bf16 (0xff bytes), 0x7f for fp8 (NaN), 0x7f7f7f7f i32.
void Poison(const kernels::Tensor& t);

}  // namespace attnd::attnctl
