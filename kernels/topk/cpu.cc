#include "kernels/topk/cpu.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/common/thread_pool.h"
#include "kernels/topk/row_select.h"
#include "kernels/topk/topk.h"

namespace attnd::kernels::topk {
namespace {

// Global KV slot of column `col` through one block_table row, or -1 when its page is out of
// range, unmapped (negative entry) or the slot does not fit in int32. Page arithmetic in
// uint32 (col and page_size are < 2^31; Validate), by shift when page_size is a power of two.
// A row without a request maps through no table row (max_blocks 0: every column gives -1).
class SlotMapper {
 public:
  SlotMapper(const int32_t* table_row, int64_t max_blocks, int64_t page_size, int64_t block_stride)
      : table_row_(table_row),
        max_blocks_(max_blocks),
        page_size_(static_cast<uint32_t>(page_size)),
        block_stride_(block_stride),
        shift_((page_size & (page_size - 1)) == 0 ? __builtin_ctzll(page_size) : -1) {}

  int32_t operator()(int32_t col) const {
    const uint32_t c = static_cast<uint32_t>(col);
    const uint32_t page = shift_ >= 0 ? c >> shift_ : c / page_size_;
    const uint32_t offset = c - page * page_size_;
    if (page >= max_blocks_) return -1;
    const int64_t block = table_row_[page];
    if (block < 0) return -1;
    const int64_t slot = block * block_stride_ + offset;  // < 2^31 · 2^31: no overflow
    return slot <= std::numeric_limits<int32_t>::max() ? static_cast<int32_t>(slot) : -1;
  }

 private:
  const int32_t* table_row_;
  int64_t max_blocks_;
  uint32_t page_size_;
  int64_t block_stride_;
  int shift_;
};

// `origin`: the column that counts as 0 in the output (the window start under kRowStart, else 0;
// chosen columns are >= it, so the difference stays in [0, N)).
void WriteRow(const Params& p, int64_t row, int64_t count, const int32_t* cols,
              const uint32_t* keys, int32_t origin) {
  const int64_t k = p.k;
  int32_t* out = p.indices.ptr_at<int32_t>(row * p.indices.stride(0));
  if (p.block_table.present()) {
    const int64_t request = RowRequest(p, row);
    const int32_t* table_row =
        request >= 0 ? p.block_table.ptr_at<int32_t>(request * p.block_table.stride(0)) : nullptr;
    const SlotMapper slot_of(table_row, request >= 0 ? p.block_table.dim(1) : 0, p.page_size,
                             p.block_stride != 0 ? p.block_stride : p.page_size);
    for (int64_t j = 0; j < count; ++j) out[j] = slot_of(cols[j] - origin);
  } else {
    for (int64_t j = 0; j < count; ++j) out[j] = cols[j] - origin;
  }
  std::fill(out + count, out + k, -1);
  if (p.values.present()) {
    float* val = p.values.ptr_at<float>(row * p.values.stride(0));
    for (int64_t j = 0; j < count; ++j) val[j] = KeyToLogit(keys[j]);
    std::fill(val + count, val + k, -std::numeric_limits<float>::infinity());
  }
}

}  // namespace

absl::Status RunCpu(const Params& p, const ExecContext& ctx) {
  const int64_t rows = p.logits.dim(0);
  const int64_t ncols = p.logits.dim(1);
  std::atomic<bool> out_of_memory{false};
  ParallelFor(ctx.pool, rows, /*grain=*/1, [&](int64_t begin, int64_t end) {
    RowSelector selector;
    for (int64_t r = begin; r < end; ++r) {
      if (StopRequested(ctx)) return;
      const Window w = RowWindow(p, r, ncols);
      int64_t count = 0;  // an empty window never touches the row (it may have no storage)
      if (w.end > w.begin) {
        const float* row = p.logits.ptr_at<const float>(r * p.logits.stride(0));
        count = selector.Select(row, w.begin, w.end, p.k);
      }
      if (count < 0) {
        out_of_memory.store(true, std::memory_order_relaxed);
        return;
      }
      const int32_t origin =
          p.index_base == IndexBase::kRowStart ? static_cast<int32_t>(w.begin) : 0;
      WriteRow(p, r, count, selector.cols(), selector.keys(), origin);
    }
  });
  if (out_of_memory.load()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("topk: no memory for the scratch of a ", ncols, "-column row"));
  }
  return absl::OkStatus();
}

}  // namespace attnd::kernels::topk
