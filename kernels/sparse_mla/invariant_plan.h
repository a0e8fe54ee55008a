// Sparse MLA's batch-invariant split plan (Params::batch_invariant; docs/KERNELS.md "Batch
// invariance"): a token's selection is cut into splits of a fixed number of 64-slot blocks,
// from its own length only. Plain C++ shared by the host plan, the kernels and the tests.
//   const int splits = InvariantGridSplits(p);  // the launch's split count
//   const SlotSpan s = InvariantSplitSpan(len, split);  // token's slots [s.begin, s.end)
#pragma once

#include <cstdint>

#include "kernels/common/invariant_split.h"
#include "kernels/common/math.h"
#include "kernels/sparse_mla/params.h"

namespace attnd::kernels::sparse_mla {

inline constexpr int64_t kInvariantBlockSlots = 64;   // split ranges are whole blocks of slots
inline constexpr int64_t kInvariantSplitBlocks = 16;  // 1024 slots a split (K 2048: 2 splits)
inline constexpr int64_t kInvariantMaxSplits = 32;    // the GPU's kMaxSplits

struct SlotSpan {
  int64_t begin, end;  // slots [begin, end) of the token's row; empty when begin == end
};

// Split `split` of a token whose row has `len` slots (topk_length or K; a CSR row's length):
// blocks of kInvariantSplitBlocks, more per split past kInvariantMaxSplits splits.
constexpr SlotSpan InvariantSplitSpan(int64_t len, int64_t split) {
  const int64_t blocks = CeilDiv(len, kInvariantBlockSlots);
  const int64_t per = InvariantUnitsPerSplit(blocks, kInvariantSplitBlocks, kInvariantMaxSplits) *
                      kInvariantBlockSlots;
  const int64_t begin = split * per < len ? split * per : len;
  const int64_t end = (split + 1) * per < len ? (split + 1) * per : len;
  return {begin, end};
}

// Non-empty splits of a token whose row has `len` slots.
constexpr int64_t InvariantSplitsOfRow(int64_t len) {
  return InvariantSplitsOf(CeilDiv(len, kInvariantBlockSlots), kInvariantSplitBlocks,
                           kInvariantMaxSplits);
}

// The launch's split count for a table of width K: enough for any row of at most K slots (1
// when K fits one split). The CSR form runs one split per token (the host cannot see a row's
// length, and the only bound it has, nnz, grows with the batch).
constexpr int InvariantGridSplitsFor(bool csr, int64_t width) {
  if (csr) return 1;
  return static_cast<int>(InvariantGridSplits(CeilDiv(width, kInvariantBlockSlots),
                                              kInvariantSplitBlocks, kInvariantMaxSplits, 1));
}

inline int InvariantGridSplits(const Params& p) {
  return InvariantGridSplitsFor(p.is_csr(), p.is_csr() ? p.indices.dim(0) : p.indices.dim(1));
}

}  // namespace attnd::kernels::sparse_mla
