// Checks an indexer op's logits against its fp64 RefLogits (both indexer ops' tests use it):
// in-window values within the precision's bound, exactly -inf where cleaned or masked, the
// poison bits untouched elsewhere (and in the padding columns [N, ld) of poisoned buffers).
//   ExpectLogits(out.tensor(), ref, ToleranceFor(heads, dim, p.precision), impl);
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "kernels/common/precision.h"
#include "kernels/common/tensor.h"
#include "kernels/indexer_logits/reference.h"
#include "tests/harness/host_tensor.h"

namespace attnd::testing {

struct LogitsTolerance {
  // HIGH: |got - ref| <= per_element · magnitude (RefLogits::magnitude). FAST (fast_bound):
  // |got - ref| <= RefLogits::fast_bound, which the reference derives from the data.
  double per_element;
  double rel_l2;            // ‖got - ref‖₂ / ‖ref‖₂ over in-window elements
  bool fast_bound = false;  // the per-element bound is RefLogits::fast_bound
};

// The norm bounds (both precisions) are statistical: ExpectLogits applies them over this many
// in-window values or more; fewer are held to the per-element bound alone. The FP8 accumulator
// model exceeds FAST's norm bound for ~14 % of one-value draws, ~6 % of two-value draws and 2 of
// 8000 sixteen-value draws, none of 8000 at 32 or 64 (worst 3.1e-4 of 4.9e-4 at 64:
// docs/ACCURACY.md "Indexer logits, FAST").
inline constexpr int64_t kMinValuesForNormBound = 64;

// The bounds of docs/ACCURACY.md "Indexer logits".
// HIGH: the inputs are exact in f32 (fp8 codes, f32 weights and scales), so every error is f32
// rounding: a D-term dot product (γ_D), relu (exact), an H-term weighted sum (γ_{H+1}) and one
// scale multiply, each bounded by n·2^-24 times the sum of |terms| — together at most
// (D + H + 4)·2^-24 · magnitude for any summation order. rel_l2: the typical error is a random
// walk, ~√D·2^-24·magnitude, and magnitude/|ref| is a few units for random signs: ~1e-6; 1e-5
// leaves room for the worst order yet fails a single bf16 rounding (2^-9).
// FAST: per element the FP8 accumulator model's bound computed from the data (fast_bound);
// rel_l2 ceil(D/32)·2^-13: each k32 step truncates the running sum (and the small products it
// aligns) once, by less than one unit of its 14th significant bit — a statistical bound, as
// FAST attention's. A dropped k-step (~0.5), a bf16 rounding of the logits (~1.6e-3) fail it.
inline LogitsTolerance ToleranceFor(int64_t heads, int64_t dim,
                                    kernels::Precision precision = kernels::Precision::kHigh) {
  if (precision == kernels::Precision::kFast) {
    const int64_t steps = (dim + 31) / 32;
    return {0.0, static_cast<double>(steps) * std::ldexp(1.0, -13), /*fast_bound=*/true};
  }
  return {static_cast<double>(dim + heads + 4) * std::ldexp(1.0, -24), 1e-5};
}

inline void ExpectLogits(const kernels::Tensor& logits,
                         const kernels::indexer_logits::RefLogits& ref, const LogitsTolerance& tol,
                         const std::string& what, bool padding_poisoned = true) {
  using kernels::indexer_logits::RefLogits;
  ASSERT_EQ(logits.dim(0), ref.rows) << what;
  ASSERT_EQ(logits.dim(1), ref.cols) << what;
  if (tol.fast_bound) {
    ASSERT_EQ(ref.fast_bound.size(), ref.value.size()) << what << ": no fast_bound";
  }
  const float* base = logits.ptr<const float>();
  const int64_t ld = logits.stride(0);
  int64_t bad = 0, values = 0;
  double err2 = 0, ref2 = 0;
  std::ostringstream first;
  auto fail = [&](int64_t r, int64_t c, const char* want, float got) {
    if (bad++ < 5) first << " [" << r << "," << c << "] got " << got << " want " << want << ";";
  };
  for (int64_t r = 0; r < ref.rows; ++r) {
    const float* row = base + r * ld;
    for (int64_t c = 0; c < ref.cols; ++c) {
      const size_t at = static_cast<size_t>(r * ref.cols + c);
      const float got = row[c];
      switch (ref.expect[at]) {
        case RefLogits::kUntouched:
          if (!IsPoisonF32(got)) fail(r, c, "untouched", got);
          break;
        case RefLogits::kNegInf:
          if (!(std::isinf(got) && got < 0)) fail(r, c, "-inf", got);
          break;
        case RefLogits::kValue: {
          ++values;
          const double want = ref.value[at], err = std::fabs(got - want);
          err2 += err * err;
          ref2 += want * want;
          const double bound =
              tol.fast_bound ? ref.fast_bound[at] : tol.per_element * ref.magnitude[at];
          if (!(err <= bound)) {
            fail(r, c, std::to_string(want).c_str(), got);
          }
          break;
        }
      }
    }
    // The padding of every row but the last lies inside the buffer (when it has elements).
    if (padding_poisoned && ref.cols > 0 && r + 1 < ref.rows) {
      for (int64_t c = ref.cols; c < ld; ++c) {
        if (!IsPoisonF32(row[c])) fail(r, c, "untouched padding", row[c]);
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.rows << "x" << ref.cols
                    << " elements wrong:" << first.str();
  if (values >= kMinValuesForNormBound) {
    const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    EXPECT_LE(rel, tol.rel_l2) << what << ": relative L2 error " << rel;
  }
}

}  // namespace attnd::testing
