// Work is split into items (a block of queries × a chunk of key columns). Each item writes only
// its own rows × columns: the -inf fill outside the windows (with clean_logits) and the logits
// inside them, tile by tile, each key tile decoded once for all queries of the block.
#include "kernels/indexer_logits/cpu.h"

#include <algorithm>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/common/thread_pool.h"
#include "kernels/indexer_logits/cpu_tile.h"

namespace attnd::kernels::indexer_logits {
namespace {

constexpr int64_t kKeyChunk = 2048;  // columns per work item

struct Window {
  int64_t lo = 0, hi = 0;  // [lo, hi) ⊆ [0, N); lo == hi == 0 when empty
};

// Row m's window [max(ks,0), min(ke,N)), normalised to [0,0) when empty.
std::vector<Window> Windows(const Params& p) {
  const int64_t m = p.q.dim(0), n = p.k.dim(0);
  const int32_t* ks = p.ks.ptr<const int32_t>();
  const int32_t* ke = p.ke.ptr<const int32_t>();
  std::vector<Window> w(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    const int64_t lo = std::max<int64_t>(ks[i * p.ks.stride(0)], 0);
    const int64_t hi = std::min<int64_t>(ke[i * p.ke.stride(0)], n);
    if (hi > lo) w[i] = {lo, hi};
  }
  return w;
}

// Writes -inf to the columns of [c0, c1) outside `w` in `row`.
void FillOutside(float* row, int64_t c0, int64_t c1, const Window& w) {
  std::fill(row + c0, row + std::max(c0, std::min(w.lo, c1)), kNegInf);
  std::fill(row + std::min(c1, std::max(w.hi, c0)), row + c1, kNegInf);
}

}  // namespace

absl::Status RunCpu(const Params& p, const ExecContext& ctx) {
  const int64_t num_rows = p.q.dim(0), heads = p.q.dim(1), dim = p.q.dim(2);
  const int64_t num_keys = p.k.dim(0);
  if (num_rows == 0 || num_keys == 0) return absl::OkStatus();
  const std::vector<Window> windows = Windows(p);
  const int64_t block_queries = QueriesPerBlock(heads);
  const int64_t num_blocks = CeilDiv(num_rows, block_queries);
  const int64_t num_chunks = CeilDiv(num_keys, kKeyChunk);
  const int64_t ld = p.logits.stride(0);
  float* const logits = p.logits.ptr<float>();
  const uint8_t* const q = p.q.ptr<const uint8_t>();
  const uint8_t* const k = p.k.ptr<const uint8_t>();
  const float* const k_scale = p.k_scale.ptr<const float>();
  const float* const weights = p.weights.ptr<const float>();

  auto run_items = [&](int64_t item_begin, int64_t item_end) {
    QueryBlock block;
    KeyTile tile(dim, block_queries * heads);
    std::vector<int64_t> lo(block_queries), hi(block_queries);
    std::vector<float*> out(block_queries);
    int64_t loaded = -1;
    for (int64_t item = item_begin; item < item_end; ++item) {
      if (StopRequested(ctx)) return;
      // Later query blocks first: under causal windows they carry the most work.
      const int64_t b = num_blocks - 1 - item / num_chunks;
      const int64_t m0 = b * block_queries;
      const int64_t nq = std::min(block_queries, num_rows - m0);
      const Window* w = windows.data() + m0;
      const int64_t c0 = item % num_chunks * kKeyChunk;
      const int64_t c1 = std::min(num_keys, c0 + kKeyChunk);
      int64_t key_begin = c1, key_end = c0;  // the union of the windows within [c0, c1)
      for (int64_t i = 0; i < nq; ++i) {
        if (p.clean_logits) FillOutside(logits + (m0 + i) * ld, c0, c1, w[i]);
        const int64_t a = std::max(w[i].lo, c0), e = std::min(w[i].hi, c1);
        if (a < e) {
          key_begin = std::min(key_begin, a);
          key_end = std::max(key_end, e);
        }
      }
      if (key_begin >= key_end) continue;
      if (loaded != b) {
        block.Load(q + m0 * p.q.stride(0), p.q.stride(0), p.q.stride(1),
                   weights + m0 * p.weights.stride(0), p.weights.stride(0), nq, heads, dim);
        loaded = b;
      }
      for (int64_t t0 = key_begin; t0 < key_end; t0 += kKeyTile) {
        const int64_t t1 = std::min(key_end, t0 + kKeyTile);
        // Queries whose windows meet [t0, t1), and the keys they need.
        int64_t q_begin = nq, q_end = 0, r0 = t1, r1 = t0;
        for (int64_t i = 0; i < nq; ++i) {
          const int64_t a = std::max(w[i].lo, t0), e = std::min(w[i].hi, t1);
          if (a >= e) continue;
          q_begin = std::min(q_begin, i);
          q_end = i + 1;
          r0 = std::min(r0, a);
          r1 = std::max(r1, e);
        }
        if (q_begin >= q_end) continue;
        for (int64_t r = r0; r < r1; ++r) {
          DecodeFp8(k + r * p.k.stride(0), dim, tile.KeyRow(r - r0));
        }
        std::copy(k_scale + r0, k_scale + r1, tile.scales());
        for (int64_t i = q_begin; i < q_end; ++i) {
          lo[i] = std::clamp(w[i].lo - r0, int64_t{0}, r1 - r0);
          hi[i] = std::clamp(w[i].hi - r0, lo[i], r1 - r0);
          out[i] = logits + (m0 + i) * ld + r0;
        }
        tile.Score(block, q_begin, q_end, r1 - r0, lo.data(), hi.data(), out.data());
      }
    }
  };
  ParallelFor(ctx.pool, num_blocks * num_chunks, 1, run_items);
  return absl::OkStatus();
}

}  // namespace attnd::kernels::indexer_logits
