// fp64 reference of the dense MLA decode (tests only): direct loops over every visible token.
//   std::vector<double> out, lse, out_abs;
//   mla_decode::Reference(params, &out, &lse, &out_abs);  // [B, s_q, H, 512], [B, s_q, H]
#pragma once

#include <vector>

#include "kernels/mla_decode/params.h"

namespace attnd::kernels::mla_decode {

// out: dense [B, s_q, H, 512]; lse: dense [B, s_q, H] (natural log, -inf for empty rows).
// out_abs (optional): dense [B, s_q, H, 512], Σ_j p_j·|v_j| / l with p_j = exp(s_j − max) and
// l = Σ_j p_j, the scale of the error FAST's bf16 P may add (docs/ACCURACY.md); 0 for empty
// rows. Reads p's inputs only (not p.precision: the exact result); p must have passed Validate.
void Reference(const Params& p, std::vector<double>* out, std::vector<double>* lse,
               std::vector<double>* out_abs = nullptr);

}  // namespace attnd::kernels::mla_decode
