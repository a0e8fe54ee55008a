#include "kernels/topk/reference.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/common/reference.h"

namespace attnd::kernels::topk {

std::vector<RefRow> Reference(const Params& p) {
  const int64_t rows = p.logits.dim(0);
  const int64_t num_cols = p.logits.dim(1);
  std::vector<RefRow> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t ks = 0, ke = 0;
    if (p.lengths.present()) {
      ke = static_cast<int64_t>(RefLoad(p.lengths, {r}));
    } else {
      ks = static_cast<int64_t>(RefLoad(p.ks, {r}));
      ke = static_cast<int64_t>(RefLoad(p.ke, {r}));
    }
    RefRow& row = out[static_cast<size_t>(r)];
    row.begin = std::max<int64_t>(ks, 0);
    row.end = std::min<int64_t>(ke, num_cols);
    std::vector<std::pair<double, int64_t>> cand;  // (value, column)
    for (int64_t n = row.begin; n < row.end; ++n) {
      const double v = RefLoad(p.logits, {r, n});
      if (std::isnan(v) || v == -INFINITY) continue;
      cand.emplace_back(v, n);
    }
    if (row.end < row.begin) row.end = row.begin;
    row.selectable = static_cast<int64_t>(cand.size());
    std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    const size_t keep = std::min(cand.size(), static_cast<size_t>(p.k));
    for (size_t i = 0; i < keep; ++i) {
      row.values.push_back(cand[i].first);
      row.cols.push_back(cand[i].second);
    }
  }
  return out;
}

int64_t ReferenceSlot(const Params& p, int64_t row, int64_t col) {
  if (p.index_base == IndexBase::kRowStart && !p.lengths.present()) {
    col -= std::max<int64_t>(static_cast<int64_t>(RefLoad(p.ks, {row})), 0);  // the window start
  }
  if (!p.block_table.present()) return col;
  const int64_t requests = p.block_table.dim(0);
  int64_t request = row / p.rows_per_request;
  if (p.req_id_per_row.present()) {
    request = static_cast<int64_t>(RefLoad(p.req_id_per_row, {row}));
    if (request < 0 || request >= requests) return -1;
  } else if (p.cu_seqlens_q.present()) {
    // The contract's search (docs/CONTRACTS.md "topk"): lo = 0, hi = R; halve keeping
    // cu[lo] <= row; the request is lo when cu[lo] <= row < cu[lo + 1].
    if (requests == 0) return -1;
    int64_t lo = 0, hi = requests;
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      (static_cast<int64_t>(RefLoad(p.cu_seqlens_q, {mid})) <= row ? lo : hi) = mid;
    }
    if (static_cast<int64_t>(RefLoad(p.cu_seqlens_q, {lo})) > row ||
        static_cast<int64_t>(RefLoad(p.cu_seqlens_q, {lo + 1})) <= row) {
      return -1;
    }
    request = lo;
  }
  const int64_t page = col / p.page_size;
  if (page >= p.block_table.dim(1)) return -1;
  const int64_t block = static_cast<int64_t>(RefLoad(p.block_table, {request, page}));
  if (block < 0) return -1;
  const int64_t stride = p.block_stride != 0 ? p.block_stride : p.page_size;
  const int64_t slot = block * stride + col % p.page_size;
  return slot > INT32_MAX ? -1 : slot;
}

}  // namespace attnd::kernels::topk
