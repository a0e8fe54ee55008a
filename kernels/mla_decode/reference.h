// fp64 reference of the dense MLA decode (tests only): direct loops over every visible token.
//   std::vector<double> out, lse;
//   mla_decode::Reference(params, &out, &lse);  // dense [B, s_q, H, 512] and [B, s_q, H]
#pragma once

#include <vector>

#include "kernels/mla_decode/params.h"

namespace attnd::kernels::mla_decode {

// out: dense [B, s_q, H, 512]; lse: dense [B, s_q, H] (natural log, -inf for empty rows).
// Reads p's inputs only; p must have passed Validate.
void Reference(const Params& p, std::vector<double>* out, std::vector<double>* lse);

}  // namespace attnd::kernels::mla_decode
