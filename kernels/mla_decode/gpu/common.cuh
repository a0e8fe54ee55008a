// Device-side pieces shared by the MLA decode GPU kernels (portable CUDA/HIP): the argument
// block built from Params on the host, the work item of a CTA (request, row block, split) with
// every untrusted value clamped, and the split-K partial layout the combine reads.
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/attention.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/mla_decode/balanced_plan.h"
#include "kernels/mla_decode/invariant_plan.h"

namespace attnd::kernels::mla_decode::gpu {

inline constexpr int kDimV = 512;

// Pointers and strides (elements) of one call as the kernels see them (device memory).
struct DecodeArgs {
  const uint16_t* q;  // bf16 [B, s_q, H, d_qk]
  int64_t q_stride_b, q_stride_s, q_stride_h;
  const uint16_t* kv;  // bf16 [num_pages, page_size, d_qk]
  int64_t kv_stride_page, kv_stride_slot;
  int64_t num_pages, page_size;
  const int32_t* block_table;  // i32 [B, max_pages]
  int64_t table_stride_b, table_stride_page;
  int64_t capacity;        // max_pages · page_size, saturated at INT64_MAX: the clamp of a seqlen
  const int32_t* seqlens;  // i32 [B]
  int64_t seqlens_stride;
  uint16_t* out;  // bf16 [B, s_q, H, 512]
  int64_t out_stride_b, out_stride_s, out_stride_h;
  float* lse;  // f32 [B, s_q, H] natural log; null when absent
  int64_t lse_stride_b, lse_stride_s, lse_stride_h;
  // Split-K workspace (null when splits == 1): partial O f32 [splits, B, rows, 512] divided by
  // its split's sum, and partial LSE f32 [splits, B, rows] in log2 units (-inf: nothing seen).
  float* partial_o;
  float* partial_lse;
  int32_t batch, s_q, heads;
  int32_t rows;      // s_q · H: query rows of a request (MTP tokens stacked over heads)
  int32_t block_m;   // rows per CTA
  int32_t m_blocks;  // ceil(rows / block_m)
  int32_t splits;
  int32_t causal;
  float scale_log2;  // sm_scale · log2(e)
  // Precision::kHigh: P·V keeps f32-path accuracy (P as bf16 hi + lo, or f32 P); false (kFast):
  // P is rounded to bf16 once before P·V. Row sums are taken over the unrounded P either way.
  bool exact_p;
  // The per-tensor FP8 cache (params.h): kv_fp8 holds its u8 codes (kv null; the kv strides are
  // then in bytes), each × kv_scale. Null for a bf16 cache. Both kernels read it (SIMT and the
  // tensor-core kernel's kFp8 instances), rounding each e4m3 × kv_scale to bf16 once.
  const uint8_t* kv_fp8;
  float kv_scale;
  // The cache is larger than the L2 (num_pages · page stride): the wgmma kernel's producer asks
  // the L2 for the next block's rows a block ahead (as the sparse one does; docs/BENCHMARKS.md
  // "Sparse MLA on Hopper"). The other kernels ignore it.
  bool prefetch_l2;
  // Params::batch_invariant: each request's splits are InvariantSplitTiles' fixed-size ranges
  // of its own context (trailing splits empty), not `splits` even shares.
  bool invariant_splits;
  // The wave-balanced plan (balanced_plan.h; a launch option, bal.ranges 0: off): CTA group
  // g = blockIdx.x / m_blocks runs BalancedPieceAt(bal, bal_order, g) (tiles of block_n, its
  // partial in the piece's slot), `splits` is bal.max_pieces, and request b's combine merges
  // BalancedPiecesOf(bal, b) partials.
  BalancedShape bal;
  uint8_t bal_order[kBalancedMaxRanges];
  // The length-aware schedule (schedule_plan.h; a launch option, sched null: off), in the
  // workspace after the partials: entry g (4 ints: request, tiles lo, hi, piece slot) of each
  // of sched_groups launched groups, written by the schedule kernel; the decode's CTA group g
  // runs entry g, its partial at piece slot · rows (PartialRow), and request b's combine merges
  // slots [sched_first[b], + sched_pieces[b]).
  int32_t* sched;
  int32_t* sched_first;
  int32_t* sched_pieces;
  int32_t sched_groups;
};

// One CTA's share: rows [row0, row0 + nrows) of request b, positions [begin, end) of the
// request's context (whole kernel tiles; empty when the split has nothing to do), and the
// per-row visibility rule.
struct WorkItem {
  int64_t b;
  int32_t split;
  int32_t row0, nrows;
  int64_t seqlen;  // cache_seqlens[b] clamped to [0, max_pages · page_size]
  int64_t begin, end;
  // Writes out and lse itself: one split, or under the schedule a request in one piece (whose
  // combine then skips it). Otherwise a partial in slot `split`.
  bool direct;
};

// blockIdx.x = ((b · splits) + split) · m_blocks + row_block: the row blocks of one split,
// which read the same pages, are neighbours in launch order. Under the balanced plan
// (a.bal.ranges > 0) blockIdx.x = group · m_blocks + row_block, the group's piece naming the
// request, its tiles and its partial slot.
__device__ __forceinline__ WorkItem DecodeWorkItem(const DecodeArgs& a, int64_t block,
                                                   int block_n) {
  WorkItem w;
  const int32_t rb = static_cast<int32_t>(block % a.m_blocks);
  const int64_t bs = block / a.m_blocks;
  const bool balanced = a.bal.ranges > 0 || a.sched != nullptr;
  BalancedPiece piece{0, 0, 0, 0};
  if (a.sched != nullptr) {  // the schedule kernel's entry for this group (broadcast loads)
    const int32_t* e = a.sched + 4 * bs;
    piece = BalancedPiece{e[0], e[1], e[2], e[3]};
    w.split = piece.slot;
    w.b = piece.request;
    // A group past the pieces (an empty span) writes only its own slot, never request 0's out.
    w.direct = piece.end > piece.begin && a.sched_pieces[w.b] == 1;
  } else if (balanced) {
    piece = BalancedPieceAt(a.bal, a.bal_order, bs);
    w.split = piece.slot;
    w.b = piece.request;
    w.direct = a.splits == 1;  // as before: the combine runs only when splits > 1
  } else {
    w.split = static_cast<int32_t>(bs % a.splits);
    w.b = bs / a.splits;
    w.direct = a.splits == 1;
  }
  w.row0 = rb * a.block_m;
  w.nrows = a.rows - w.row0 < a.block_m ? a.rows - w.row0 : a.block_m;
  const int64_t raw = a.seqlens[w.b * a.seqlens_stride];
  w.seqlen = Min64(Max64(raw, 0), a.capacity);
  // Rows see a prefix that grows with the MTP token index: the block's last row sees the most.
  const int32_t last_token = (w.row0 + w.nrows - 1) / a.heads;
  int64_t limit = w.seqlen;
  if (a.causal) limit = Max64(w.seqlen - a.s_q + last_token + 1, 0);
  if (a.invariant_splits) {
    const TileSpan s = InvariantSplitTiles(w.seqlen, limit, w.split, block_n);
    w.begin = s.begin;
    w.end = s.end;
    return w;
  }
  const int64_t tiles = (limit + block_n - 1) / block_n;
  if (balanced) {  // the piece's tiles of the table's capacity, clipped to what the rows see
    w.begin = Min64(piece.begin, tiles) * block_n;
    w.end = Min64(Min64(piece.end, tiles) * block_n, limit);
  } else {
    const int64_t per_split = (tiles + a.splits - 1) / a.splits;
    w.begin = Min64(w.split * per_split, tiles) * block_n;
    w.end = Min64(Min64((w.split + 1) * per_split, tiles) * block_n, limit);
  }
  if (w.end < w.begin) w.end = w.begin;
  return w;
}

// Positions [0, limit) that row `row` (of the request's s_q · H) sees, before page masking.
__device__ __forceinline__ int64_t RowLimit(const DecodeArgs& a, int64_t seqlen, int32_t row) {
  if (!a.causal) return seqlen;
  return Max64(seqlen - a.s_q + row / a.heads + 1, 0);
}

// Element offset of position `pos` of request b in the cache, or -1 when its page id is out of
// [0, num_pages) (the token is masked and never read). pos < seqlen <= capacity =
// max_pages · page_size, so the table entry read is inside the request's row.
__device__ __forceinline__ int64_t TokenOffset(const DecodeArgs& a, int64_t b, int64_t pos) {
  const int64_t page = pos / a.page_size;
  const int64_t slot = pos - page * a.page_size;
  const int64_t id = a.block_table[b * a.table_stride_b + page * a.table_stride_page];
  if (id < 0 || id >= a.num_pages) return -1;
  return id * a.kv_stride_page + slot * a.kv_stride_slot;
}

// Query row `row` of request b as a pointer to its d_qk elements.
__device__ __forceinline__ const uint16_t* QueryRow(const DecodeArgs& a, int64_t b, int32_t row) {
  const int64_t s = row / a.heads, h = row % a.heads;
  return a.q + b * a.q_stride_b + s * a.q_stride_s + h * a.q_stride_h;
}

__device__ __forceinline__ uint16_t* OutRow(const DecodeArgs& a, int64_t b, int32_t row) {
  const int64_t s = row / a.heads, h = row % a.heads;
  return a.out + b * a.out_stride_b + s * a.out_stride_s + h * a.out_stride_h;
}

__device__ __forceinline__ float* LseAt(const DecodeArgs& a, int64_t b, int32_t row) {
  const int64_t s = row / a.heads, h = row % a.heads;
  return a.lse + b * a.lse_stride_b + s * a.lse_stride_s + h * a.lse_stride_h;
}

// Index of (split, request b, row) in the partial arrays (64-bit: splits·B·rows·512 may pass
// 2^31); under the length-aware schedule `split` is the piece slot, whose rows hold one
// request's.
__device__ __forceinline__ int64_t PartialRow(const DecodeArgs& a, int32_t split, int64_t b,
                                              int32_t row) {
  if (a.sched != nullptr) return static_cast<int64_t>(split) * a.rows + row;
  return (static_cast<int64_t>(split) * a.batch + b) * a.rows + row;
}

// Writes what a CTA with no position to read owes: partial LSE -inf for its rows when it
// writes a partial (the combine then ignores them), else out 0 and lse -inf. Issues no loads.
__device__ __forceinline__ void WriteEmptyRows(const DecodeArgs& a, const WorkItem& w) {
  if (!w.direct) {
    for (int r = threadIdx.x; r < w.nrows; r += blockDim.x) {
      a.partial_lse[PartialRow(a, w.split, w.b, w.row0 + r)] = -INFINITY;
    }
    return;
  }
  for (int i = threadIdx.x; i < w.nrows * kDimV; i += blockDim.x) {
    OutRow(a, w.b, w.row0 + i / kDimV)[i % kDimV] = 0;
  }
  if (a.lse != nullptr) {
    for (int r = threadIdx.x; r < w.nrows; r += blockDim.x) *LseAt(a, w.b, w.row0 + r) = -INFINITY;
  }
}

}  // namespace attnd::kernels::mla_decode::gpu
