// The fp64 reference of the indexer logits (tests and the NumPy cross-check only), and the
// result form both indexer ops' references share: what each output element must be.
//   RefLogits ref = indexer_logits::Reference(p);
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/indexer_logits/params.h"

namespace attnd::kernels::indexer_logits {

// What an implementation must leave in logits [rows, cols] (row-major, dense).
struct RefLogits {
  enum Expect : uint8_t {
    kUntouched = 0,  // outside the window without clean_logits: the caller's bits stay
    kNegInf = 1,     // outside the window (or masked) with cleaning: exactly -inf
    kValue = 2,      // inside the window: value, within the f32 accumulation bound below
  };
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> expect;  // Expect per element
  std::vector<double> value;    // the exact logit where kValue
  // |k_scale[n]| · Σ_h |w[m,h]| · Σ_d |q[m,h,d] · k[n,d]| where kValue: the scale of the error
  // any f32 evaluation order makes (sum of |terms| of every rounded sum).
  std::vector<double> magnitude;
};

// logits[m,n] = Σ_h relu(Σ_d q[m,h,d]·k[n,d]) · k_scale[n] · w[m,h] in double (the fp8 inputs are
// exact), for n in [max(ks,0), min(ke,N)). Reads only p's inputs.
RefLogits Reference(const Params& p);

}  // namespace attnd::kernels::indexer_logits
