// fp64 reference of sparse MLA, for tests and the NumPy cross-check only: a plain loop over
// tokens, heads and selected slots, written for clarity.
//   Reference ref = ComputeReference(params);  // params validated, CSR indptr well-formed
#pragma once

#include <vector>

#include "kernels/sparse_mla/params.h"

namespace attnd::kernels::sparse_mla {

struct Reference {
  std::vector<double> out;  // [T, H, 512]: 0 for a token with no valid slot
  std::vector<double> lse;  // [T, H], natural log; -inf for a token with no valid slot
  // [T, H, 512]: Σ_j p_j·|v_j| / l (p_j = exp(s_j − max), l = Σ_j p_j), the scale of the error
  // FAST's bf16 P may add (docs/ACCURACY.md); 0 for a token with no valid slot.
  std::vector<double> out_abs;
};

// Each valid slot (inside the row and topk_length, index in [0, S)) contributes once per
// appearance: s = sm_scale·q·k, out = Σ softmax(s)·v, lse = log Σ exp(s). Independent of
// p.precision (the exact result).
Reference ComputeReference(const Params& p);

}  // namespace attnd::kernels::sparse_mla
