// The fp64 reference of the paged indexer logits (tests and the NumPy cross-check only): reads
// keys and scales through the block table byte by byte, as params.h lays them out.
//   RefLogits ref = indexer_logits_paged::Reference(p);
#pragma once

#include "kernels/indexer_logits/reference.h"
#include "kernels/indexer_logits_paged/params.h"

namespace attnd::kernels::indexer_logits_paged {

using indexer_logits::RefLogits;

// Row b·next_n + j: kValue at positions n < L (params.h) whose page id is in range (with
// magnitude and FAST's fast_bound, as indexer_logits::Reference), kNegInf at every other column
// of [0, N) (masked positions included). Reads only p's inputs (not p.precision).
RefLogits Reference(const Params& p);

}  // namespace attnd::kernels::indexer_logits_paged
