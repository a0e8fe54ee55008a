// The top-k op's tensors as the GPU kernels read them: raw device pointers with element strides
// (products are formed in 64 bits), made once from Params on the host by MakeRowArgs, and a row's
// clamped window. Shared by the portable kernel (simt.cu) and the streaming kernel (stream.cu);
// docs/CONTRACTS.md "topk". Include from .cu files.
#pragma once

#include <stdint.h>

#include "kernels/common/gpu/convert.cuh"
#include "kernels/topk/gpu/radix.h"
#include "kernels/topk/params.h"
#include "kernels/topk/request_map.h"

namespace attnd::kernels::topk::gpu {

struct RowArgs {
  const uint32_t* logits = nullptr;  // f32 bits [rows, logits_ld]
  int64_t logits_ld = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  const int32_t* ks = nullptr;  // window [ks, ke) ...
  const int32_t* ke = nullptr;
  const int32_t* lengths = nullptr;  // ... or [0, lengths) when non-null
  int64_t ks_stride = 0, ke_stride = 0, lengths_stride = 0;
  uint32_t k = 0;
  int32_t* indices = nullptr;
  int64_t indices_ld = 0;
  float* values = nullptr;  // null when absent
  int64_t values_ld = 0;
  const int32_t* block_table = nullptr;  // null when absent
  int64_t table_ld = 0;
  int64_t max_blocks = 0;
  uint32_t page_size = 0;
  int page_shift = -1;        // log2(page_size) when it is a power of two, else -1
  uint32_t block_stride = 0;  // slots per block in the pool (page_size unless given)
  int64_t rows_per_request = 1;
  int64_t num_requests = 0;                 // block_table rows
  const int32_t* req_id_per_row = nullptr;  // [rows], or null
  int64_t req_id_stride = 0;
  const int32_t* cu_seqlens_q = nullptr;  // [num_requests + 1], or null
  int64_t cu_seqlens_stride = 0;
  bool row_start_base = false;  // IndexBase::kRowStart: write columns minus the window start
};

inline RowArgs MakeRowArgs(const Params& p) {
  RowArgs a;
  a.logits = p.logits.ptr<const uint32_t>();
  a.logits_ld = p.logits.stride(0);
  a.rows = p.logits.dim(0);
  a.cols = p.logits.dim(1);
  if (p.lengths.present()) {
    a.lengths = p.lengths.ptr<const int32_t>();
    a.lengths_stride = p.lengths.stride(0);
  } else {
    a.ks = p.ks.ptr<const int32_t>();
    a.ks_stride = p.ks.stride(0);
    a.ke = p.ke.ptr<const int32_t>();
    a.ke_stride = p.ke.stride(0);
  }
  a.k = static_cast<uint32_t>(p.k);
  a.indices = p.indices.ptr<int32_t>();
  a.indices_ld = p.indices.stride(0);
  if (p.values.present()) {
    a.values = p.values.ptr<float>();
    a.values_ld = p.values.stride(0);
  }
  if (p.block_table.present()) {
    a.block_table = p.block_table.ptr<const int32_t>();
    a.table_ld = p.block_table.stride(0);
    a.max_blocks = p.block_table.dim(1);
    a.page_size = static_cast<uint32_t>(p.page_size);
    a.page_shift = -1;
    if ((p.page_size & (p.page_size - 1)) == 0) {
      a.page_shift = 0;
      while ((int64_t{1} << a.page_shift) < p.page_size) ++a.page_shift;
    }
    a.block_stride = static_cast<uint32_t>(p.block_stride != 0 ? p.block_stride : p.page_size);
    a.rows_per_request = p.rows_per_request;
    a.num_requests = p.block_table.dim(0);
    if (p.req_id_per_row.present()) {
      a.req_id_per_row = p.req_id_per_row.ptr<const int32_t>();
      a.req_id_stride = p.req_id_per_row.stride(0);
    }
    if (p.cu_seqlens_q.present()) {
      a.cu_seqlens_q = p.cu_seqlens_q.ptr<const int32_t>();
      a.cu_seqlens_stride = p.cu_seqlens_q.stride(0);
    }
  }
  a.row_start_base = p.index_base == IndexBase::kRowStart;
  return a;
}

// Row `row`'s request (block_table row), or -1 when it has none; as topk::RowRequest. The ids and
// cu_seqlens_q are device data, read by each thread: every read stays in its tensor whatever
// they hold (request_map.h), so a changed value alters the output, never the addressing.
__device__ __forceinline__ int64_t RowRequestOf(const RowArgs& a, int64_t row) {
  if (a.req_id_per_row != nullptr) {
    return RequestById(a.req_id_per_row[row * a.req_id_stride], a.num_requests);
  }
  if (a.cu_seqlens_q != nullptr) {
    return RequestByCuSeqlens(a.cu_seqlens_q, a.cu_seqlens_stride, a.num_requests, row);
  }
  return row / a.rows_per_request;
}

inline constexpr uint32_t kNegInfBits = 0xff800000u;  // f32 -inf: the value of an empty entry

// Where row `row`'s output goes, and the KV-slot mapping of its request: what both kernels write
// through (simt.cu and stream.cu add their own padding loops).
struct RowDest {
  int32_t* indices;
  float* values;             // null when absent
  const int32_t* table_row;  // null when absent
  int64_t max_blocks;
  uint32_t page_size;
  int page_shift;
  uint32_t block_stride;
  int32_t origin;  // the column written as 0: the window start (IndexBase::kRowStart) or 0

  __device__ __forceinline__ static RowDest Of(const RowArgs& a, int64_t row) {
    RowDest d;
    d.indices = a.indices + row * a.indices_ld;
    d.values = a.values != nullptr ? a.values + row * a.values_ld : nullptr;
    d.table_row = nullptr;
    d.max_blocks = a.max_blocks;
    if (a.block_table != nullptr) {
      // A row without a request keeps a non-null table row and max_blocks 0: SlotOf gives -1
      // and reads nothing.
      const int64_t request = RowRequestOf(a, row);
      d.table_row = a.block_table + (request >= 0 ? request * a.table_ld : 0);
      if (request < 0) d.max_blocks = 0;
    }
    d.page_size = a.page_size;
    d.page_shift = a.page_shift;
    d.block_stride = a.block_stride;
    d.origin = 0;
    return d;
  }
  // `col` is a chosen column of the window (>= origin); `bits` its f32 logit.
  __device__ __forceinline__ void Write(uint32_t pos, int32_t col, uint32_t bits) const {
    const int32_t n = col - origin;
    indices[pos] = table_row != nullptr ? radix::SlotOf(n, table_row, max_blocks, page_size,
                                                        page_shift, block_stride)
                                        : n;
    if (values != nullptr) values[pos] = ::attnd::gpu::BitsToFloat(bits);
  }
  // Entry `pos` empty: -1 and -inf.
  __device__ __forceinline__ void PadOne(uint32_t pos) const {
    indices[pos] = -1;
    if (values != nullptr) values[pos] = ::attnd::gpu::BitsToFloat(kNegInfBits);
  }
};

// A row's window [begin, begin + len); Begin is the kernel's column type.
template <class Begin>
struct RowSpanOf {
  Begin begin = 0;
  uint32_t len = 0;
};

// Row `row`'s window as a Span {begin, len}: [begin, begin + len), clamped to [0, cols) as
// topk::RowWindow does (ks / ke / lengths are device data and untrusted).
template <class Span>
__device__ __forceinline__ Span LoadWindowAs(const RowArgs& a, int64_t row) {
  int64_t begin = 0, end = 0;
  if (a.lengths != nullptr) {
    end = a.lengths[row * a.lengths_stride];
  } else {
    begin = a.ks[row * a.ks_stride];
    end = a.ke[row * a.ke_stride];
  }
  begin = begin < 0 ? 0 : (begin > a.cols ? a.cols : begin);
  end = end < begin ? begin : (end > a.cols ? a.cols : end);
  Span w;
  w.begin = static_cast<decltype(w.begin)>(begin);
  w.len = static_cast<uint32_t>(end - begin);
  return w;
}

}  // namespace attnd::kernels::topk::gpu
