// Device-side pieces shared by the MLA prefill GPU kernels (portable CUDA/HIP): the argument
// block built from Params on the host, the clamped bounds of a sequence, and the schedule that
// maps a CTA to (sequence, query tile) through per-sequence tile offsets in the workspace.
//
// cu_seqlens are device data and untrusted: every entry is clamped to [0, total] and each end
// to at least its start, so a kernel only ever reads rows inside q / k / v. For well-formed
// cu_seqlens (what the CPU implementation accepts) this changes nothing; for malformed ones the
// GPU stays memory-safe but its output is unspecified (rows covered by no clamped sequence
// inside [0, cu_seqlens_q[B]) may stay unwritten; overlapping sequences may write a row twice).
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/attention.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"

namespace attnd::kernels::mla_prefill::gpu {

// Pointers and strides (elements) of one call as the kernels see them (device memory).
struct PrefillArgs {
  const uint16_t* q;  // bf16 [total_q, H, d_qk]
  int64_t q_stride_t, q_stride_h;
  const uint16_t* k;  // bf16 [total_k, H_kv, d_qk]
  int64_t k_stride_t, k_stride_h;
  const uint16_t* v;  // bf16 [total_k, H_kv, d_v]
  int64_t v_stride_t, v_stride_h;
  const int32_t* cu_q;  // i32 [B + 1]
  int64_t cu_q_stride;
  const int32_t* cu_k;  // i32 [B + 1]
  int64_t cu_k_stride;
  uint16_t* out;  // bf16 [total_q, H, d_v]
  int64_t out_stride_t, out_stride_h;
  float* lse;  // f32 [total_q, H] natural log; null when absent
  int64_t lse_stride_t, lse_stride_h;
  // Workspace: tile_start[b] = Σ_{b' < b} ceil(Lq_b' / block_m), b in [0, B] (schedule.cu),
  // then the counter the wgmma kernel's CTAs take work items from (zeroed by schedule.cu).
  int64_t* tile_start;
  int64_t* work_counter;
  int64_t total_q, total_k;
  int64_t slots;  // CTAs per head: ceil(total_q / block_m) + B >= every sequence's tiles
  int32_t batch, heads, group;  // group = H / H_kv query heads per kv head
  int32_t d_qk, d_v;
  int32_t block_m;  // query rows per CTA
  // The wgmma kernel's item order: heads in groups of head_group whose items interleave
  // (docs/KERNELS.md "MLA prefill on Hopper", "Work"); 1 = heads in order. Others ignore it.
  int32_t head_group;
  int32_t causal;
  float scale_log2;  // sm_scale · log2(e)
  // Precision::kHigh: P·V keeps f32-path accuracy (P as bf16 hi + lo, or f32 P); false (kFast):
  // P is rounded to bf16 once before P·V. Row sums are taken over the unrounded P either way.
  bool exact_p;
};

// Sequence b's query rows [q0, q0 + lq) and key rows [k0, k0 + lk), clamped.
struct SeqRange {
  int64_t q0, lq, k0, lk;
};

__device__ __forceinline__ SeqRange SequenceRange(const PrefillArgs& a, int64_t b) {
  SeqRange s;
  const int64_t qb = Min64(Max64(a.cu_q[b * a.cu_q_stride], 0), a.total_q);
  const int64_t qe = Min64(Max64(a.cu_q[(b + 1) * a.cu_q_stride], qb), a.total_q);
  const int64_t kb = Min64(Max64(a.cu_k[b * a.cu_k_stride], 0), a.total_k);
  const int64_t ke = Min64(Max64(a.cu_k[(b + 1) * a.cu_k_stride], kb), a.total_k);
  s.q0 = qb;
  s.lq = qe - qb;
  s.k0 = kb;
  s.lk = ke - kb;
  return s;
}

// Keys [0, limit) that query i of a sequence with lq queries and lk keys sees (bottom-right
// causal alignment); the CPU implementation's KeyLimit.
__device__ __forceinline__ int64_t KeyLimit(const PrefillArgs& a, int64_t i, int64_t lq,
                                            int64_t lk) {
  if (!a.causal) return lk;
  return Min64(Max64(i + lk - lq + 1, 0), lk);
}

// CTA blockIdx.x = slot + slots · h. Finds the sequence b and query tile of `slot`: tiles of a
// sequence run last tile first (in causal the last tile sees the most keys), sequences in
// order. False for slots past the last tile (those CTAs exit).
__device__ __forceinline__ bool FindTile(const PrefillArgs& a, int64_t slot, int64_t* b,
                                         int64_t* tile) {
  if (slot >= a.tile_start[a.batch]) return false;
  int64_t lo = 0, hi = a.batch;  // tile_start[lo] <= slot < tile_start[hi]
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (a.tile_start[mid] <= slot) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  *b = lo;
  *tile = a.tile_start[lo + 1] - 1 - slot;
  return true;
}

__device__ __forceinline__ uint16_t* OutRow(const PrefillArgs& a, int64_t t, int64_t h) {
  return a.out + t * a.out_stride_t + h * a.out_stride_h;
}

__device__ __forceinline__ float* LseAt(const PrefillArgs& a, int64_t t, int64_t h) {
  return a.lse + t * a.lse_stride_t + h * a.lse_stride_h;
}

// Rows [t0, t0 + n) of head h get out 0 and lse -inf (the block's threads share the work).
__device__ __forceinline__ void WriteEmptyRows(const PrefillArgs& a, int64_t t0, int64_t n,
                                               int64_t h) {
  for (int64_t i = threadIdx.x; i < n * a.d_v; i += blockDim.x) {
    OutRow(a, t0 + i / a.d_v, h)[i % a.d_v] = 0;
  }
  if (a.lse != nullptr) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) *LseAt(a, t0 + i, h) = -INFINITY;
  }
}

}  // namespace attnd::kernels::mla_prefill::gpu
