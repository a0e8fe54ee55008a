// Helpers for the fp64 reference implementations (tests only): read any element of a Tensor as
// double and write float outputs, by multi-index, with no vectorisation or cleverness.
//   double x = RefLoad(p.q, {t, h, d});
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/common/tensor.h"

namespace attnd::kernels {

// Element offset of a multi-index (elements, 64-bit).
int64_t RefOffset(const Tensor& t, std::initializer_list<int64_t> index);
// The element at `index` converted exactly to double (bf16, fp8, f32, i32, u8).
double RefLoad(const Tensor& t, std::initializer_list<int64_t> index);
// Stores `v` at `index` rounded to t's dtype (f32, bf16 round-to-nearest-even, i32).
void RefStore(const Tensor& t, std::initializer_list<int64_t> index, double v);
// The exact value of an OCP e4m3fn code, decoded by hand (independent of kernels/common/fp8.h,
// which the implementations use): S.EEEE.MMM, bias 7, subnormals at E = 0; S.1111.111 is NaN.
double RefDecodeE4m3(uint8_t code);

}  // namespace attnd::kernels
