// Numeric constants and integer helpers of every op, host and device alike (plain C++: device
// code reads the constants and calls the constexpr functions under nvcc's
// --expt-relaxed-constexpr; HIP treats constexpr functions as host and device).
//   const float scale_log2 = sm_scale * kLog2e;  // softmax in exp2
//   const int64_t tiles = CeilDiv(n, kTile);
#pragma once

#include <cstdint>
#include <limits>

namespace attnd::kernels {

inline constexpr float kLog2e = 1.4426950408889634f;  // log2(e): exp(x) = exp2(x · kLog2e)
inline constexpr float kLn2 = 0.6931471805599453f;    // ln(2): ln(x) = log2(x) · kLn2
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ceil(a / b) for a >= 0, b > 0, in the type a + b has (as the expression written out).
template <class A, class B>
constexpr auto CeilDiv(A a, B b) {
  return (a + b - 1) / b;
}

}  // namespace attnd::kernels
