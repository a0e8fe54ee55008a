// Writes an indexer op's fp64 RefLogits into a NumPy case (cases_indexer_logits*.cc): "logits"
// (the value in-window, -inf where it must be -inf, 0 where the op leaves the output untouched)
// and "expect" (RefLogits::Expect per element: 0 untouched, 1 -inf, 2 value), both [rows, cols].
#pragma once

#include <cmath>
#include <vector>

#include "kernels/indexer_logits/reference.h"
#include "tests/numpy/dump.h"

namespace attnd::testing {

inline void AddRefLogits(CaseWriter& w, const kernels::indexer_logits::RefLogits& ref) {
  using kernels::indexer_logits::RefLogits;
  std::vector<double> logits(ref.value.size()), expect(ref.value.size());
  for (size_t i = 0; i < ref.value.size(); ++i) {
    expect[i] = ref.expect[i];
    logits[i] = ref.expect[i] == RefLogits::kValue    ? ref.value[i]
                : ref.expect[i] == RefLogits::kNegInf ? -INFINITY
                                                      : 0.0;
  }
  w.AddReference("logits", logits, {ref.rows, ref.cols});
  w.AddReference("expect", expect, {ref.rows, ref.cols});
}

}  // namespace attnd::testing
