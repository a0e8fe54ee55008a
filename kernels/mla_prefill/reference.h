// fp64 reference of the dense MLA prefill (tests only): direct loops over every visible key.
//   std::vector<double> out, lse;
//   mla_prefill::Reference(params, &out, &lse);  // dense [total_q, H, d_v] and [total_q, H]
#pragma once

#include <vector>

#include "kernels/mla_prefill/params.h"

namespace attnd::kernels::mla_prefill {

// out: dense [total_q, H, d_v]; lse: dense [total_q, H] (natural log). Rows that see no key and
// rows past the last sequence are 0 / -inf. p must have passed Validate and CheckCuSeqlens.
void Reference(const Params& p, std::vector<double>* out, std::vector<double>* lse);

}  // namespace attnd::kernels::mla_prefill
