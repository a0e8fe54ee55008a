// The fp64 reference of top-k (tests only): per row, the selectable candidates of the window
// sorted by value descending (ties by column ascending) and cut at k, plus the KV-slot mapping.
// Written for clarity; tests compare sets against it, never order.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/topk/params.h"

namespace attnd::kernels::topk {

struct RefRow {
  int64_t begin = 0;  // the clamped window [begin, end)
  int64_t end = 0;
  int64_t selectable = 0;      // candidates in the window that are neither NaN nor -inf
  std::vector<int64_t> cols;   // min(k, selectable) chosen columns, by value descending
  std::vector<double> values;  // their logits
};

// One entry per row of p.logits.
std::vector<RefRow> Reference(const Params& p);

// The index row `row` writes for its chosen column `col` (docs/CONTRACTS.md "topk"): the column,
// or under IndexBase::kRowStart its position from the row's window start; then, with a block
// table, the KV slot that position maps to, or -1.
int64_t ReferenceSlot(const Params& p, int64_t row, int64_t col);

}  // namespace attnd::kernels::topk
