// MLA decode's batch-invariant split plan (Params::batch_invariant; docs/KERNELS.md "Batch
// invariance"): a request's context is cut into splits of a fixed number of positions, from its
// own length only, and every launch goes through the combine. Plain C++ shared by the host
// plan, the kernels and the tests.
//   const int splits = InvariantGridSplitsFor(capacity, block_n);  // the launch's split count
//   const TileSpan s = InvariantSplitTiles(seqlen, limit, split, block_n);
#pragma once

#include <cstdint>

#include "kernels/common/invariant_split.h"
#include "kernels/common/math.h"

namespace attnd::kernels::mla_decode {

// Positions a split covers: a multiple of every kernel's tile (SIMT 32, tensor-core 64).
inline constexpr int64_t kInvariantSplitPositions = 4096;
inline constexpr int64_t kInvariantMaxSplits = 128;  // the GPU's kMaxSplits
// Splits of every launch, at least: a request alone (a narrow block table) and inside a batch
// (the widest request's table) then both take the split path and the combine.
inline constexpr int64_t kInvariantMinSplits = 2;

struct TileSpan {
  int64_t begin, end;  // positions [begin, end), whole tiles of block_n except at `limit`
};

// Split `split` of a request whose clamped length is `seqlen`, for rows that see positions
// [0, limit) (limit <= seqlen: causal MTP rows see less): tiles of block_n (dividing
// kInvariantSplitPositions), kInvariantSplitPositions a split, more past kInvariantMaxSplits.
constexpr TileSpan InvariantSplitTiles(int64_t seqlen, int64_t limit, int64_t split,
                                       int64_t block_n) {
  const int64_t per =
      InvariantUnitsPerSplit(CeilDiv(seqlen, block_n), kInvariantSplitPositions / block_n,
                             kInvariantMaxSplits) *
      block_n;
  const int64_t begin = split * per < limit ? split * per : limit;
  const int64_t end = (split + 1) * per < limit ? (split + 1) * per : limit;
  return {begin, end};
}

// Non-empty splits of a request of `seqlen` positions.
constexpr int64_t InvariantSplitsOfRequest(int64_t seqlen, int64_t block_n) {
  return InvariantSplitsOf(CeilDiv(seqlen, block_n), kInvariantSplitPositions / block_n,
                           kInvariantMaxSplits);
}

// The launch's split count for a block table of `capacity` positions (max_pages · page_size):
// enough for any request it can hold, at least kInvariantMinSplits.
constexpr int InvariantGridSplitsFor(int64_t capacity, int64_t block_n) {
  return static_cast<int>(InvariantGridSplits(CeilDiv(capacity, block_n),
                                              kInvariantSplitPositions / block_n,
                                              kInvariantMaxSplits, kInvariantMinSplits));
}

}  // namespace attnd::kernels::mla_decode
