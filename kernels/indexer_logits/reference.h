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
  // Precision::kFast's bound on |logit − value| where kValue (docs/ACCURACY.md "Indexer logits,
  // FAST"), from the data: FastLogitBound over the heads' FastDotErrorBound (both indexer ops'
  // references fill it).
  std::vector<double> fast_bound;
};

// The FP8 tensor-core accumulator model's bound (docs/ACCURACY.md "Indexer logits, FAST") on
// |acc − Σ_d products[d]| for one head's dot product of `dim` exact fp8 products, accumulated in
// steps of 32 (the last one partial) into a register that keeps 14 significant bits, the model
// taken with the unit 2^-12 (twice the measured 2^-13). Per step s, with the exact partial sum
// P_s, the previous bound ε and M = max(|P_{s-1}| + ε, max |p| of the step):
//   ε += n·2^-12·M + 2^-12·(|P_s| + ε + n·2^-12·M),
// n = the step's addends that may lose bits in the alignment (nonzero products below 2^-5·M,
// and the running sum after the first step).
double FastDotErrorBound(const double* products, int64_t dim);

// FAST's bound on one logit from its magnitude (RefLogits::magnitude) and
// acc_bound = |k_scale| · Σ_h |w_h| · FastDotErrorBound(head h): the accumulators' error plus the
// f32 epilogue's (H + 4 roundings of at most 2^-24 of magnitude + acc_bound).
double FastLogitBound(double magnitude, double acc_bound, int64_t heads);

// logits[m,n] = Σ_h relu(Σ_d q[m,h,d]·k[n,d]) · k_scale[n] · w[m,h] in double (the fp8 inputs are
// exact), for n in [max(ks,0), min(ke,N)), with magnitude and fast_bound. Reads only p's inputs
// (not p.precision: the exact value is the same for both).
RefLogits Reference(const Params& p);

}  // namespace attnd::kernels::indexer_logits
