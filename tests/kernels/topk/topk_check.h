// Checks of a top-k result against the fp64 reference that accept any valid answer: the set (not
// the order) of chosen columns, any tie resolution at the threshold, -1 / -inf padding.
//   ExpectValidTopK(p, Reference(p), "cpu");
#pragma once

#include <string>
#include <vector>

#include "kernels/topk/params.h"
#include "kernels/topk/reference.h"

namespace attnd::kernels::topk {

// Unmapped output: per row, exactly min(k, selectable) leading entries are distinct selectable
// columns of the window whose logits equal the reference's top values as a multiset (so every
// chosen value >= every unchosen one, also checked directly), then -1 to k. With p.values, each
// value is bit-exact the logit of its column and padding is -inf. Under IndexBase::kRowStart the
// entries are read as positions from the row's window start.
void ExpectValidTopK(const Params& p, const std::vector<RefRow>& ref, const std::string& what);

// Mapped output (block_table): the multiset of (slot, value) pairs of each row equals the mapped
// reference's (ReferenceSlot: the index base applied, then the table), -1 included. Requires a
// unique top-k (no ties at the threshold) in every row.
void ExpectMappedTopK(const Params& p, const std::vector<RefRow>& ref, const std::string& what);

}  // namespace attnd::kernels::topk
