// Device-side pieces shared by the sparse MLA GPU kernels (portable CUDA/HIP): the kernel
// argument block built from Params on the host, the slot range of one (token, split) work item
// with every untrusted length clamped, and the split-K partial layout the combine reads.
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/attention.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/sparse_mla/invariant_plan.h"
#include "kernels/sparse_mla/params.h"

namespace attnd::kernels::sparse_mla::gpu {

// Split ranges are whole 64-slot blocks (the tensor-core kernel's KV tile; two SIMT chunks).
inline constexpr int kSplitAlign = 64;
static_assert(kInvariantBlockSlots == kSplitAlign, "invariant splits are whole split blocks");

// Pointers and strides (elements) of one call, as the kernels see them.
struct KernelArgs {
  const uint16_t* q;  // bf16 [T, H, d_qk]
  int64_t q_stride_t, q_stride_h;
  const uint16_t* kv;  // bf16 [S, d_qk]; null for the FP8 cache (kv_fp8)
  int64_t kv_stride;
  int64_t kv_rows;  // S (either format)
  // Selection: table (indptr null) [T, width] with row stride `indices_stride`, or CSR.
  const int32_t* indices;
  int64_t indices_stride;
  int64_t width;  // table: K; CSR: nnz
  const int32_t* indptr;
  const int32_t* topk_length;  // optional (table form)
  uint16_t* out;               // bf16 [T, H, 512]
  int64_t out_stride_t, out_stride_h;
  float* lse;  // f32 [T, H], optional, any non-overlapping strides (docs/CONTRACTS.md)
  int64_t lse_stride_t, lse_stride_h;
  // Split-K workspace (null when splits == 1): partial O f32 [splits, T, H, 512] (already
  // divided by the split's sum) and partial LSE f32 [splits, T, H] in log2 units (-inf: empty).
  float* partial_o;
  float* partial_lse;
  int32_t tokens;  // T
  int32_t heads;   // H
  int32_t splits;
  float scale_log2;  // sm_scale · log2(e)
  // The FP8 cache (params.h kFp8Row*): u8 [S, 656] rows `kv_fp8_stride` bytes apart; null for a
  // bf16 cache. Kernels that do not read it refuse the call in GpuSupports.
  const uint8_t* kv_fp8;
  int64_t kv_fp8_stride;
  // The KV pool is larger than the L2 (decode pools of B x 32K rows): the wgmma kernel's bf16
  // producer asks the L2 for the next block's rows a block ahead (prefill pools of one sequence
  // stay L2-resident, where the extra work only costs time: docs/BENCHMARKS.md
  // "Sparse MLA on Hopper").
  bool prefetch_l2;
  // Optional launch gate (null: always run): a CTA of a kernel that checks it (mma.cuh,
  // mma_lowh.cuh, the combine) returns at entry unless *gate == gate_open. A device word, so a
  // kernel earlier in the stream decides without the host (cuda_mma_auto, mma_auto.cu).
  const int32_t* gate;
  int32_t gate_open;
  // Precision::kHigh: P·V keeps f32-path accuracy (P as bf16 hi + lo, or f32 P); false (kFast):
  // P is rounded to bf16 once before P·V. Row sums are taken over the unrounded P either way.
  // Last, in gate_open's padding: the fields before keep their offsets.
  bool exact_p;
  // The per-tensor FP8 cache (params.h): kv_fp8 / kv_fp8_stride point at its u8 [S, d_qk] rows
  // and every code is multiplied by kv_scale; 0 for the other formats. Only the SIMT kernel
  // reads it (GpuSupports refuses it for the others).
  float kv_scale;
  // Params::batch_invariant with the table form: each token's splits are InvariantSplitSpan's
  // fixed-size ranges of its own row (trailing splits empty), not `splits` even shares.
  bool invariant_splits;
};

// Whether this CTA's kernel was chosen (a.gate, above); uniform over the CTA.
__device__ __forceinline__ bool GateClosed(const KernelArgs& a) {
  return a.gate != nullptr && *a.gate != a.gate_open;
}

// Token t's slots for one split: slots[begin, end) (slot i of the row is slots[i]).
struct SlotRange {
  const int32_t* slots;
  int64_t begin, end;
};

// Clamps every untrusted value: topk_length to [0, K]; a CSR row to [clamp(indptr[t], 0, nnz),
// clamp(indptr[t+1], that, nnz)) so a malformed indptr (the CPU refuses it) reads only inside
// indices and gives an empty or shortened row. The row is cut into `splits` ranges of whole
// kSplitAlign-slot blocks (with invariant_splits: InvariantSplitSpan's, from the row's own
// length); trailing splits may be empty.
__device__ __forceinline__ SlotRange SplitSlots(const KernelArgs& a, int64_t t, int split) {
  const int32_t* slots;
  int64_t len;
  if (a.indptr != nullptr) {
    const int64_t b = min(max(static_cast<int64_t>(a.indptr[t]), int64_t{0}), a.width);
    const int64_t e = min(max(static_cast<int64_t>(a.indptr[t + 1]), b), a.width);
    slots = a.indices + b;
    len = e - b;
  } else {
    slots = a.indices + t * a.indices_stride;
    len = a.width;
    if (a.topk_length != nullptr) {
      len = min(max(static_cast<int64_t>(a.topk_length[t]), int64_t{0}), a.width);
    }
  }
  if (a.invariant_splits) {
    const SlotSpan s = InvariantSplitSpan(len, split);
    return {slots, s.begin, s.end};
  }
  const int64_t blocks = (len + kSplitAlign - 1) / kSplitAlign;
  const int64_t per_split = (blocks + a.splits - 1) / a.splits;
  const int64_t begin = min(split * per_split * kSplitAlign, len);
  const int64_t end = min((split + 1) * per_split * kSplitAlign, len);
  return {slots, begin, end};
}

// Slot i of the range as a KV row, or -1 when masked (past the range end, < 0 or >= S).
// Never reads slots[i] for i >= end.
__device__ __forceinline__ int32_t LoadRow(const KernelArgs& a, const SlotRange& r, int64_t i) {
  if (i >= r.end) return -1;
  const int32_t idx = r.slots[i];
  return (idx >= 0 && static_cast<int64_t>(idx) < a.kv_rows) ? idx : -1;
}

// Offsets into the split workspace (64-bit: splits·T·H·512 may pass 2^31).
__device__ __forceinline__ int64_t PartialRow(const KernelArgs& a, int split, int64_t t,
                                              int64_t h) {
  return (static_cast<int64_t>(split) * a.tokens + t) * a.heads + h;
}

// Row (t, h)'s LSE from its final running max (log2 units) and sum: the split's partial (log2,
// -inf for an empty row) or, with one split, lse (natural log, -inf when empty; skipped when
// absent). Every kernel's epilogue.
__device__ __forceinline__ void StoreRowLse(const KernelArgs& a, int split, int64_t t, int64_t h,
                                            float max_log2, float sum) {
  const float lse2 = sum > 0.0f ? max_log2 + log2f(sum) : -INFINITY;
  if (a.splits > 1) {
    a.partial_lse[PartialRow(a, split, t, h)] = lse2;
  } else if (a.lse != nullptr) {
    a.lse[t * a.lse_stride_t + h * a.lse_stride_h] = sum > 0.0f ? lse2 * kLn2 : -INFINITY;
  }
}

}  // namespace attnd::kernels::sparse_mla::gpu
