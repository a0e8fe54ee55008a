// The two precisions of the attention operators' outputs (sparse_mla, mla_decode, mla_prefill,
// dsa), chosen per call by Params::precision; bounds and their derivation in docs/ACCURACY.md.
//   p.precision = Precision::kHigh;  ATTND_RETURN_IF_ERROR(CheckPrecision(p.precision));
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnd::kernels {

enum class Precision : uint8_t {
  // The default: P = exp(s − max) is rounded to bf16 before P·V (FlashMLA's and
  // FlashAttention-3's numerics); the row sum l is taken over the unrounded f32 P.
  kFast = 0,
  // P enters P·V as two bf16 terms hi + lo (or as f32): out is within bf16 rounding of the
  // exact result.
  kHigh = 1,
};

constexpr const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFast: return "fast";
    case Precision::kHigh: return "high";
  }
  return "invalid";
}

// OK for kFast and kHigh; INVALID_ARGUMENT for any other value (a cast from untrusted input).
inline absl::Status CheckPrecision(Precision p) {
  if (p == Precision::kFast || p == Precision::kHigh) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("precision: is ", static_cast<int>(p), ", want fast (0) or high (1)"));
}

}  // namespace attnd::kernels
