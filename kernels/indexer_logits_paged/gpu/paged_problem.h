// The paged operator's Params as an IndexerProblem (a group per request, its next_n rows; the
// work split is left to the launcher). Host only; reads no tensor data.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/indexer_logits/gpu/problem.h"
#include "kernels/indexer_logits_paged/params.h"

namespace attnd::kernels::indexer_logits_paged::gpu {

using indexer_logits::gpu::IndexerProblem;

inline constexpr int64_t kMaxBlockSize = INT32_MAX;  // the kernels divide in 32 bits

// Output rows, visible_cap = min(N, max_blocks · block_size) without overflow (as VisibleLength).
inline IndexerProblem MakePagedProblem(const Params& p) {
  IndexerProblem x;
  x.num_groups = p.q.dim(0);
  x.rows_per_group = p.q.dim(1);
  x.heads = static_cast<int>(p.q.dim(2));
  x.dim = static_cast<int>(p.q.dim(3));
  x.q = p.q.ptr<const uint8_t>();
  x.q_group_stride = p.q.stride(0);
  x.q_row_stride = p.q.stride(1);
  x.q_head_stride = p.q.stride(2);
  x.weights = p.weights.ptr<const float>();
  x.weights_stride = p.weights.stride(0);
  x.logits = p.logits.ptr<float>();
  x.ld = p.logits.stride(0);
  x.num_cols = p.logits.dim(1);
  x.clean = true;  // the paged contract: -inf on every column that is not a visible logit
  x.context_lens = p.context_lens.ptr<const int32_t>();
  x.context_stride = p.context_lens.stride(0);
  x.context_per_token = p.context_lens.rank == 2;  // [B, next_n]: dim 1 contiguous (Validate)
  const int64_t max_blocks = p.block_table.dim(1);
  x.visible_cap = max_blocks > x.num_cols / p.block_size
                      ? x.num_cols
                      : std::min(x.num_cols, max_blocks * p.block_size);
  x.cache = p.kv_cache.ptr<const uint8_t>();
  x.cache_stride = p.kv_cache.stride(0);
  x.num_pages = p.kv_cache.dim(0);
  x.block_size = static_cast<int32_t>(std::min(p.block_size, kMaxBlockSize));
  x.key_tile_shift = KeyTileTokens(p.kv_cache_layout) == 1 ? 0 : 4;  // G = 16 (params.h)
  x.block_table = p.block_table.ptr<const int32_t>();
  x.table_stride = p.block_table.stride(0);
  return x;
}

}  // namespace attnd::kernels::indexer_logits_paged::gpu
