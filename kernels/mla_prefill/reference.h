// fp64 reference of the dense MLA prefill (tests only): direct loops over every visible key.
//   std::vector<double> out, lse, out_abs;
//   mla_prefill::Reference(params, &out, &lse, &out_abs);  // [total_q, H, d_v], [total_q, H]
#pragma once

#include <vector>

#include "kernels/mla_prefill/params.h"

namespace attnd::kernels::mla_prefill {

// out: dense [total_q, H, d_v]; lse: dense [total_q, H] (natural log). Rows that see no key and
// rows past the last sequence are 0 / -inf. out_abs (optional): dense [total_q, H, d_v],
// Σ_j p_j·|v_j| / l with p_j = exp(s_j − max) and l = Σ_j p_j, the scale of the error FAST's
// bf16 P may add (docs/ACCURACY.md); 0 where out is. Independent of p.precision (the exact
// result). p must have passed Validate and CheckCuSeqlens.
void Reference(const Params& p, std::vector<double>* out, std::vector<double>* lse,
               std::vector<double>* out_abs = nullptr);

}  // namespace attnd::kernels::mla_prefill
