// The prefill operator's Params as an IndexerProblem (one group of M rows; the work split is
// left to the launcher). Host only; reads no tensor data.
#pragma once

#include "kernels/indexer_logits/gpu/problem.h"
#include "kernels/indexer_logits/params.h"

namespace attnd::kernels::indexer_logits::gpu {

inline IndexerProblem MakePrefillProblem(const Params& p) {
  IndexerProblem x;
  x.num_groups = 1;
  x.rows_per_group = p.q.dim(0);
  x.heads = static_cast<int>(p.q.dim(1));
  x.dim = static_cast<int>(p.q.dim(2));
  x.q = p.q.ptr<const uint8_t>();
  x.q_row_stride = p.q.stride(0);
  x.q_head_stride = p.q.stride(1);
  x.weights = p.weights.ptr<const float>();
  x.weights_stride = p.weights.stride(0);
  x.logits = p.logits.ptr<float>();
  x.ld = p.logits.stride(0);
  x.num_cols = p.k.dim(0);
  x.clean = p.clean_logits;
  x.ks = p.ks.ptr<const int32_t>();
  x.ke = p.ke.ptr<const int32_t>();
  x.ks_stride = p.ks.stride(0);
  x.ke_stride = p.ke.stride(0);
  x.k = p.k.ptr<const uint8_t>();
  x.k_stride = p.k.stride(0);
  x.k_scale = p.k_scale.ptr<const float>();
  return x;
}

}  // namespace attnd::kernels::indexer_logits::gpu
