// Work is split into items (a request × a block of its next_n queries × a chunk of columns).
// Each item writes only its rows × columns: -inf past each row's visible length, and the logits
// before it, key tile by key tile. A tile's keys are gathered page by page (one fp8 decode per
// run of positions inside a page, or per 16-byte piece of a key in the shuffled layout); positions
// whose page id is out of range are masked: zero rows in the tile that are never read from the
// cache, -inf in the output.
#include "kernels/indexer_logits_paged/cpu.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/common/thread_pool.h"
#include "kernels/indexer_logits/cpu_tile.h"
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"

namespace attnd::kernels::indexer_logits_paged {
namespace {

using indexer_logits::DecodeFp8;
using indexer_logits::KeyTile;
using indexer_logits::kKeyTile;
using indexer_logits::QueryBlock;

constexpr int64_t kKeyChunk = 2048;  // columns per work item

// The cache as the kernel reads it.
struct Cache {
  const uint8_t* data;
  int64_t num_blocks, block_stride, block_size, dim;
  int64_t tile_tokens;   // KeyTileTokens of the layout: 1 (keys contiguous) or 16 (shuffled)
  const int32_t* table;  // this request's block_table row
};

// Decodes the keys in slots [slot, slot + run) of the block at `base` into rows (D floats each).
void DecodeKeys(const Cache& c, const uint8_t* base, int64_t slot, int64_t run, float* rows) {
  if (c.tile_tokens == 1) {
    DecodeFp8(base + slot * c.dim, run * c.dim, rows);
    return;
  }
  // 16-token tiles: a key's 16-byte pieces lie 16·G bytes apart (params.h KeyTileTokens).
  const int64_t g = c.tile_tokens;
  for (int64_t t = slot; t < slot + run; ++t) {
    const uint8_t* key = base + t / g * g * c.dim + t % g * 16;
    float* row = rows + (t - slot) * c.dim;
    for (int64_t d0 = 0; d0 < c.dim; d0 += 16) DecodeFp8(key + d0 * g, 16, row + d0);
  }
}

// Gathers positions [t0, t1) into tile rows [0, t1 - t0) and their scales; appends the masked
// runs (tile-relative) to *masked.
void GatherKeys(const Cache& c, int64_t t0, int64_t t1, KeyTile* tile,
                std::vector<std::pair<int64_t, int64_t>>* masked) {
  masked->clear();
  for (int64_t pos = t0; pos < t1;) {
    const int64_t block = pos / c.block_size, slot = pos % c.block_size;
    const int64_t run = std::min(t1 - pos, c.block_size - slot);
    const int64_t page = c.table[block];
    float* rows = tile->KeyRow(pos - t0);
    float* scales = tile->scales() + (pos - t0);
    if (page >= 0 && page < c.num_blocks) {
      const uint8_t* base = c.data + page * c.block_stride;
      DecodeKeys(c, base, slot, run, rows);
      std::memcpy(scales, base + c.block_size * c.dim + slot * 4, run * sizeof(float));
    } else {
      std::fill(rows, rows + run * c.dim, 0.0f);
      std::fill(scales, scales + run, 0.0f);
      masked->emplace_back(pos - t0, pos - t0 + run);
    }
    pos += run;
  }
}

}  // namespace

absl::Status RunCpu(const Params& p, const ExecContext& ctx) {
  const int64_t batch = p.q.dim(0), next_n = p.q.dim(1), heads = p.q.dim(2), dim = p.q.dim(3);
  const int64_t num_cols = p.logits.dim(1), ld = p.logits.stride(0);
  if (batch == 0 || num_cols == 0) return absl::OkStatus();
  const int64_t block_queries = indexer_logits::QueriesPerBlock(heads);
  const int64_t query_blocks = CeilDiv(next_n, block_queries);
  const int64_t num_chunks = CeilDiv(num_cols, kKeyChunk);
  float* const logits = p.logits.ptr<float>();
  const uint8_t* const q = p.q.ptr<const uint8_t>();
  const float* const weights = p.weights.ptr<const float>();

  auto run_items = [&](int64_t item_begin, int64_t item_end) {
    QueryBlock block;
    KeyTile tile(dim, block_queries * heads);
    std::vector<int64_t> len(block_queries), lo(block_queries, 0), hi(block_queries);
    std::vector<float*> out(block_queries);
    std::vector<std::pair<int64_t, int64_t>> masked;
    int64_t loaded = -1;
    for (int64_t item = item_begin; item < item_end; ++item) {
      if (StopRequested(ctx)) return;
      const int64_t chunk = item % num_chunks, group = item / num_chunks;
      const int64_t b = group / query_blocks, j0 = group % query_blocks * block_queries;
      const int64_t nq = std::min(block_queries, next_n - j0);
      const int64_t row0 = b * next_n + j0;
      const int64_t c0 = chunk * kKeyChunk, c1 = std::min(num_cols, c0 + kKeyChunk);
      int64_t longest = 0;  // per-token lengths may come in any order
      for (int64_t i = 0; i < nq; ++i) {
        len[i] = VisibleLength(p, b, j0 + i);
        longest = std::max(longest, len[i]);
        float* row = logits + (row0 + i) * ld;
        std::fill(row + std::clamp(len[i], c0, c1), row + c1, kNegInf);
      }
      const int64_t key_end = std::min(c1, longest);
      if (c0 >= key_end) continue;
      if (loaded != group) {
        block.Load(q + b * p.q.stride(0) + j0 * p.q.stride(1), p.q.stride(1), p.q.stride(2),
                   weights + row0 * p.weights.stride(0), p.weights.stride(0), nq, heads, dim);
        loaded = group;
      }
      const Cache cache{p.kv_cache.ptr<const uint8_t>(),
                        p.kv_cache.dim(0),
                        p.kv_cache.stride(0),
                        p.block_size,
                        dim,
                        KeyTileTokens(p.kv_cache_layout),
                        p.block_table.ptr_at<const int32_t>(b * p.block_table.stride(0))};
      for (int64_t t0 = c0; t0 < key_end; t0 += kKeyTile) {
        const int64_t t1 = std::min(key_end, t0 + kKeyTile);
        int64_t q_begin = 0;  // the first query that sees past t0 (one does: t0 < longest)
        while (len[q_begin] <= t0) ++q_begin;
        GatherKeys(cache, t0, t1, &tile, &masked);
        for (int64_t i = q_begin; i < nq; ++i) {
          hi[i] = std::max(std::min(len[i], t1) - t0, int64_t{0});  // 0: a later, shorter query
          out[i] = logits + (row0 + i) * ld + t0;
        }
        const bool all_masked = masked.size() == 1 && masked[0].second - masked[0].first == t1 - t0;
        if (!all_masked) {
          tile.Score(block, q_begin, nq, t1 - t0, lo.data(), hi.data(), out.data());
        }
        for (const auto& [a, e] : masked) {
          for (int64_t i = q_begin; i < nq; ++i) {
            std::fill(out[i] + a, out[i] + std::max(a, std::min(e, hi[i])), kNegInf);
          }
        }
      }
    }
  };
  ParallelFor(ctx.pool, batch * query_blocks * num_chunks, 1, run_items);
  return absl::OkStatus();
}

}  // namespace attnd::kernels::indexer_logits_paged
