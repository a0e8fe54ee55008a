// The batch-invariant split-K plan (docs/KERNELS.md "Batch invariance"): how one work item's own
// length (a token's selection, a request's context) is cut into splits of a fixed size, so that
// the cut never depends on the batch or the device. Plain C++, host and device alike.
//   const int64_t per = InvariantUnitsPerSplit(tiles, kFixedTiles, kMaxSplits);
//   begin = min(split * per, tiles), end = min((split + 1) * per, tiles)
#pragma once

#include <cstdint>

#include "kernels/common/math.h"

namespace attnd::kernels {

// Units (KV tiles or 64-slot blocks) in each split of an item with `units` units: `fixed`, or
// more when `units` would need more than `max_splits` splits of that size. Depends on the
// item's own length and the constants only. fixed >= 1, max_splits >= 1.
constexpr int64_t InvariantUnitsPerSplit(int64_t units, int64_t fixed, int64_t max_splits) {
  const int64_t spread = CeilDiv(units, max_splits);
  return spread > fixed ? spread : fixed;
}

// Non-empty splits of an item with `units` units (0 for an empty item); at most max_splits.
constexpr int64_t InvariantSplitsOf(int64_t units, int64_t fixed, int64_t max_splits) {
  return units <= 0 ? 0 : CeilDiv(units, InvariantUnitsPerSplit(units, fixed, max_splits));
}

// The grid's split count for a call whose longest item has at most `max_units` units: enough
// for every item (InvariantSplitsOf(u) <= min(max_splits, ceil(u / fixed)), which grows with
// u), at least `min_splits` and at most max_splits (unless min_splits is larger).
constexpr int64_t InvariantGridSplits(int64_t max_units, int64_t fixed, int64_t max_splits,
                                      int64_t min_splits) {
  const int64_t by_size = max_units <= 0 ? 0 : CeilDiv(max_units, fixed);
  const int64_t need = by_size < max_splits ? by_size : max_splits;
  return need > min_splits ? need : min_splits;
}

}  // namespace attnd::kernels
