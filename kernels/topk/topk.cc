#include "kernels/topk/topk.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/common/status.h"
#include "kernels/topk/cpu.h"
#include "kernels/topk/request_map.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/topk/gpu/launch.h"
#endif
#if defined(ATTND_GPU_CUDA)
#include "kernels/topk/gpu/filter.h"
#include "kernels/topk/gpu/stream.h"
#endif

namespace attnd::kernels::topk {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

absl::Status CheckWindow(const Params& p, int64_t rows) {
  if (p.lengths.present()) {
    if (p.ks.present() || p.ke.present()) {
      return absl::InvalidArgumentError(
          "lengths: given together with ks/ke, want exactly one window form");
    }
    return CheckTensor(p.lengths, "lengths", DType::kI32, {rows});
  }
  if (!p.ks.present() && !p.ke.present()) {
    return absl::InvalidArgumentError("ks/ke or lengths: missing, want exactly one window form");
  }
  ATTND_RETURN_IF_ERROR(CheckTensor(p.ks, "ks", DType::kI32, {rows}));
  return CheckTensor(p.ke, "ke", DType::kI32, {rows});
}

absl::Status CheckBlockTable(const Params& p, int64_t rows) {
  if (p.rows_per_request < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows_per_request is ", p.rows_per_request, ", want >= 1"));
  }
  if (!p.block_table.present()) {
    if (p.page_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page_size is ", p.page_size, ", want 0 without block_table (block_table: missing)"));
    }
    if (p.block_stride != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("block_stride is ", p.block_stride,
                       ", want 0 without block_table (block_table: missing)"));
    }
    if (p.req_id_per_row.present() || p.cu_seqlens_q.present()) {
      return absl::InvalidArgumentError(
          absl::StrCat(p.req_id_per_row.present() ? "req_id_per_row" : "cu_seqlens_q",
                       ": given without block_table, want it only with the KV-slot mapping"));
    }
    return absl::OkStatus();
  }
  ATTND_RETURN_IF_ERROR(CheckTensor(p.block_table, "block_table", DType::kI32, {kAnyDim, kAnyDim}));
  if (p.page_size < 1 || p.page_size > kInt32Max) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size is ", p.page_size, ", want 1..", kInt32Max, " with block_table"));
  }
  if (p.block_stride != 0 && (p.block_stride < p.page_size || p.block_stride > kInt32Max)) {
    return absl::InvalidArgumentError(absl::StrCat("block_stride is ", p.block_stride,
                                                   ", want 0 (= page_size) or page_size (",
                                                   p.page_size, ")..", kInt32Max));
  }
  const int64_t requests = p.block_table.dim(0);
  const int forms = (p.rows_per_request != 1 ? 1 : 0) + (p.req_id_per_row.present() ? 1 : 0) +
                    (p.cu_seqlens_q.present() ? 1 : 0);
  if (forms > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows_per_request (", p.rows_per_request, "), req_id_per_row (",
                     p.req_id_per_row.present() ? "given" : "missing", ") and cu_seqlens_q (",
                     p.cu_seqlens_q.present() ? "given" : "missing",
                     "): want at most one form of the request of a row"));
  }
  if (p.req_id_per_row.present()) {
    return CheckTensor(p.req_id_per_row, "req_id_per_row", DType::kI32, {rows});
  }
  if (p.cu_seqlens_q.present()) {
    if (requests == std::numeric_limits<int64_t>::max()) {
      return absl::InvalidArgumentError("block_table: dim 0 too large");
    }
    return CheckTensor(p.cu_seqlens_q, "cu_seqlens_q", DType::kI32, {requests + 1});
  }
  int64_t covered;
  if (MulOverflow(requests, p.rows_per_request, &covered) || covered != rows) {
    return absl::InvalidArgumentError(absl::StrCat("block_table: dim 0 is ", requests,
                                                   ", want R with R * rows_per_request (",
                                                   p.rows_per_request, ") == M (", rows, ")"));
  }
  return absl::OkStatus();
}

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
// The SIMT kernel handles every validated call: any M, N <= INT32_MAX, k <= kMaxK, both window
// forms, both index bases, the KV-slot mapping, strided views. Windows are device data and are
// clamped on the device.
bool SupportsSimt(const Params&, std::string*) { return true; }
#endif

}  // namespace

absl::Status Validate(const Params& p) {
  ATTND_RETURN_IF_ERROR(CheckTensor(p.logits, "logits", DType::kF32, {kAnyDim, kAnyDim}));
  const int64_t rows = p.logits.dim(0);
  const int64_t cols = p.logits.dim(1);
  if (cols > kInt32Max) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits: dim 1 is ", cols, ", want <= ", kInt32Max, " (i32 indices)"));
  }
  if (p.k < 1 || p.k > kMaxK) {
    return absl::InvalidArgumentError(absl::StrCat("k is ", p.k, ", want 1..", kMaxK));
  }
  ATTND_RETURN_IF_ERROR(CheckWindow(p, rows));
  if (p.index_base != IndexBase::kAbsolute && p.index_base != IndexBase::kRowStart) {
    return absl::InvalidArgumentError(absl::StrCat("index_base is ",
                                                   static_cast<int32_t>(p.index_base),
                                                   ", want kAbsolute (0) or kRowStart (1)"));
  }
  ATTND_RETURN_IF_ERROR(CheckTensor(p.indices, "indices", DType::kI32, {rows, p.k}));
  ATTND_RETURN_IF_ERROR(CheckOptionalTensor(p.values, "values", DType::kF32, {rows, p.k}));
  return CheckBlockTable(p, rows);
}

Window RowWindow(const Params& p, int64_t row, int64_t num_cols) {
  int64_t begin = 0;
  int64_t end = 0;
  if (p.lengths.present()) {
    end = p.lengths.ptr<const int32_t>()[row * p.lengths.stride(0)];
  } else {
    begin = p.ks.ptr<const int32_t>()[row * p.ks.stride(0)];
    end = p.ke.ptr<const int32_t>()[row * p.ke.stride(0)];
  }
  Window w;
  w.begin = std::clamp<int64_t>(begin, 0, num_cols);
  w.end = std::clamp<int64_t>(end, w.begin, num_cols);
  return w;
}

int64_t RowRequest(const Params& p, int64_t row) {
  const int64_t requests = p.block_table.dim(0);
  if (p.req_id_per_row.present()) {
    return RequestById(p.req_id_per_row.ptr<const int32_t>()[row * p.req_id_per_row.stride(0)],
                       requests);
  }
  if (p.cu_seqlens_q.present()) {
    return RequestByCuSeqlens(p.cu_seqlens_q.ptr<const int32_t>(), p.cu_seqlens_q.stride(0),
                              requests, row);
  }
  return row / p.rows_per_request;
}

WorkCount Count(const Params& p) {
  const int64_t rows = p.logits.dim(0);
  const int64_t cols = p.logits.dim(1);
  double valid = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const Window win = RowWindow(p, r, cols);
    valid += static_cast<double>(win.end - win.begin);
  }
  // Block-table entries: per request, the pages from its rows' lowest to highest column.
  double table_entries = 0;
  // With req_id_per_row / cu_seqlens_q (not read here: they may be device data) each row counts
  // the pages its own window spans.
  const int64_t group =
      p.req_id_per_row.present() || p.cu_seqlens_q.present() ? 1 : p.rows_per_request;
  if (p.block_table.present() && p.page_size > 0 && group > 0) {
    for (int64_t first_row = 0; first_row < rows; first_row += group) {
      int64_t lo = cols, hi = 0;
      for (int64_t r = first_row; r < std::min(rows, first_row + group); ++r) {
        const Window win = RowWindow(p, r, cols);
        if (win.end <= win.begin) continue;
        lo = std::min(lo, win.begin);
        hi = std::max(hi, win.end);
      }
      if (hi <= lo) continue;
      const int64_t last = std::min((hi - 1) / p.page_size, p.block_table.dim(1) - 1);
      table_entries += static_cast<double>(std::max<int64_t>(0, last - lo / p.page_size + 1));
    }
  }
  const double out_elems = static_cast<double>(rows) * static_cast<double>(p.k);
  const double window_bytes = (p.lengths.present() ? 4.0 : 8.0) * static_cast<double>(rows);
  WorkCount w;
  w.bytes = 4.0 * valid + window_bytes + 4.0 * out_elems +
            (p.values.present() ? 4.0 * out_elems : 0.0) + 4.0 * table_entries;
  return w;
}

const std::vector<Impl<Params>>& Implementations() {
  static const auto* impls = new std::vector<Impl<Params>> {
#if defined(ATTND_GPU_CUDA)
    // Reads each logit once, a floor from a sample filtering it into shared memory; rows up to
    // the columns whose bitmaps fit the device's shared memory (~600K on sm_90).
    GpuImpl("filter", gpu::SupportsFilter, gpu::LaunchTopkFilter),
        // Reads each logit once; every shape on devices with its shared memory (sm_80 and up).
        GpuImpl("stream", gpu::SupportsStream, gpu::LaunchTopkStream),
#endif
#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
        GpuImpl("simt", SupportsSimt, gpu::LaunchTopkSimt),
#endif
        CpuImpl(RunCpu),
  };
  return *impls;
}

absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl) {
  return ValidateAndDispatch(Validate, Implementations(), p, ctx, impl);
}

}  // namespace attnd::kernels::topk
