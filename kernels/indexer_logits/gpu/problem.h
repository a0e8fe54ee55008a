// The device-side description of one indexer-logits call, shared by the prefill and the paged
// operator's GPU kernels: rows (queries) in groups, their windows, where each key lives, and the
// host-chosen split of the work into CTAs. Plain data, passed to kernels by value.
#pragma once

#include <stdint.h>

#include "kernels/common/math.h"

namespace attnd::kernels::indexer_logits::gpu {

// Rows come in num_groups groups of rows_per_group (prefill: one group of M rows; paged: one
// group per request, its next_n new tokens). Row j of group g is output row g·rows_per_group + j.
struct IndexerProblem {
  int64_t num_groups = 0, rows_per_group = 0;
  int heads = 0, dim = 0;
  // q[g, j, h, :] at q + g·q_group_stride + j·q_row_stride + h·q_head_stride (bytes, fp8).
  const uint8_t* q = nullptr;
  int64_t q_group_stride = 0, q_row_stride = 0, q_head_stride = 0;
  const float* weights = nullptr;  // [rows, heads], row stride weights_stride
  int64_t weights_stride = 0;
  float* logits = nullptr;  // [rows, num_cols], row stride ld
  int64_t ld = 0, num_cols = 0;
  bool clean = true;  // -inf on the columns of [0, num_cols) outside a row's window

  // Prefill windows: row m sees [max(ks[m], 0), min(ke[m], num_cols)).
  const int32_t* ks = nullptr;
  const int32_t* ke = nullptr;
  int64_t ks_stride = 0, ke_stride = 0;
  // Paged windows: row (b, j) sees [0, clamp(context_lens[b] − rows_per_group + j + 1, 0,
  // visible_cap)), visible_cap = min(num_cols, max_blocks · block_size); with per-token lengths
  // (context_per_token) [0, clamp(context_lens[b·context_stride + j], 0, visible_cap)).
  const int32_t* context_lens = nullptr;
  int64_t context_stride = 0, visible_cap = 0;
  bool context_per_token = false;

  // Prefill keys: key n at k + n·k_stride (bytes), its scale k_scale[n].
  const uint8_t* k = nullptr;
  int64_t k_stride = 0;
  const float* k_scale = nullptr;
  // Paged keys: key n of request b in page block_table[b·table_stride + n / block_size] (masked
  // unless in [0, num_pages)), slot n % block_size: scale at page·cache_stride + block_size·dim +
  // 4·slot; the key's bytes in tiles of G = 2^key_tile_shift tokens × 16 bytes: its 16-byte
  // piece c at page·cache_stride + (slot / G)·G·dim + (slot % G)·16 + c·16·G (G = 1: slot·dim +
  // 16·c, a contiguous row; G = 16: AITER's shuffled indexer cache).
  const uint8_t* cache = nullptr;
  int64_t cache_stride = 0, num_pages = 0;
  int32_t block_size = 1;
  int key_tile_shift = 0;  // log2 G; prefill keys are contiguous rows (0)
  const int32_t* block_table = nullptr;
  int64_t table_stride = 0;

  // Work split: CTA b owns query block (b / num_chunks) — queries_per_block rows of one group —
  // and key chunk (b % num_chunks): columns [chunk·key_chunk, min(num_cols, (chunk+1)·key_chunk)).
  int queries_per_block = 1;
  int64_t blocks_per_group = 0;  // ceil(rows_per_group / queries_per_block)
  int64_t key_chunk = 0, num_chunks = 0;
};

// Fills the work split of `p` (rows, columns and groups set): query blocks of
// `queries_per_block` rows, and the columns cut into key chunks (multiples of `tile_keys`, at
// least four tiles) only when there are fewer than `target_ctas` query blocks. Shapes only: no
// tensor data is read, so the split is the same for every replay of a captured graph.
inline void ChooseSplit(IndexerProblem* p, int queries_per_block, int64_t tile_keys,
                        int64_t target_ctas) {
  p->queries_per_block = queries_per_block;
  p->blocks_per_group = CeilDiv(p->rows_per_group, queries_per_block);
  const int64_t blocks = p->num_groups * p->blocks_per_group;
  int64_t chunks = 1;
  if (blocks > 0 && blocks < target_ctas) {
    const int64_t by_size = CeilDiv(p->num_cols, 4 * tile_keys);
    const int64_t by_ctas = CeilDiv(target_ctas, blocks);
    chunks = by_size < by_ctas ? by_size : by_ctas;
    if (chunks < 1) chunks = 1;
  }
  const int64_t per_chunk = CeilDiv(p->num_cols, chunks);
  p->key_chunk = CeilDiv(per_chunk, tile_keys) * tile_keys;
  if (p->key_chunk < tile_keys) p->key_chunk = tile_keys;
  p->num_chunks = CeilDiv(p->num_cols, p->key_chunk);
}

// The grid ChooseSplit gives, in CTAs (one dimension; must stay below kMaxGridCtas).
inline constexpr int64_t kMaxGridCtas = int64_t{1} << 31;  // exclusive
inline int64_t GridCtas(const IndexerProblem& p) {
  return p.num_groups * p.blocks_per_group * p.num_chunks;
}

}  // namespace attnd::kernels::indexer_logits::gpu
