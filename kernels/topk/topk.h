// Host entry of the top-k operator: validation, work counts, the implementation list and Run.
//   topk::Params p;  p.logits = ...; p.lengths = ...; p.k = 2048; p.indices = ...;
//   ATTND_RETURN_IF_ERROR(topk::Run(p, ctx));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/topk/params.h"

namespace attnd::kernels::topk {

// Checks every tensor's dtype, rank, shape and strides, the window form (exactly one of ks/ke and
// lengths), k in [1, kMaxK], N <= INT32_MAX (indices are i32), index_base one of the enum's
// values and the block-table scalars
// (page_size in [1, INT32_MAX] with a table and 0 without; block_stride 0 or in
// [page_size, INT32_MAX]; at most one request form: rows_per_request > 1 with R * rows_per_request
// == M (also when it is 1 and no tensor is given), req_id_per_row i32 [M] or cu_seqlens_q
// i32 [R + 1]; none of them without a table). INVALID_ARGUMENT names the tensor or scalar. Window
// values are data and are clamped, never rejected.
absl::Status Validate(const Params& p);

// No FLOPs; bytes = the valid logits (4 each) + the window tensors + indices (+ values) + the
// block-table entries the windows span. Reads ks/ke/lengths, so they must be host memory.
WorkCount Count(const Params& p);

// Fastest first; each with its Supports predicate.
const std::vector<Impl<Params>>& Implementations();

// Validate + Dispatch; *impl (optional) receives the implementation's name.
absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl = nullptr);

// Row m's candidate columns [begin, end), clamped to [0, N); empty (begin == end) when the window
// is. For validated params.
struct Window {
  int64_t begin = 0;
  int64_t end = 0;
};
Window RowWindow(const Params& p, int64_t row, int64_t num_cols);

// Row `row`'s request (its block_table row) in the KV-slot mapping, or -1 when it has none
// (an out-of-range req_id_per_row entry, no cu_seqlens_q interval holding the row). For validated
// params with a block table; reads req_id_per_row / cu_seqlens_q, so they must be host memory.
int64_t RowRequest(const Params& p, int64_t row);

}  // namespace attnd::kernels::topk
