// Parameters of the dense, absorbed MLA decode over a paged latent KV cache (docs/CONTRACTS.md
// "mla_decode"): every query row attends to the first visible tokens of its request's pages; V is
// the first 512 columns of each cache row. Callers own every tensor; the op only reads and writes
// through them.
#pragma once

#include "kernels/common/cache_layout.h"
#include "kernels/common/precision.h"
#include "kernels/common/tensor.h"

namespace attnd::kernels::mla_decode {

inline constexpr int64_t kDv = 512;         // V width: the first 512 columns of a cache row
inline constexpr int64_t kDqkRope = 576;    // DeepSeek: 512 latent + 64 rope
inline constexpr int64_t kDqkNoRope = 512;  // GLM-5.3-Flash: K = V
inline constexpr int64_t kMaxHeads = 128;

// The named layouts kv_cache may have (docs/CONTRACTS.md "Named layouts"): its dtype and last
// dim tell them apart, so each is inferred when kv_cache_layout is unspecified. The per-tensor
// FP8 ones (vLLM's kv_cache_dtype "fp8" MLA cache; docs/CONTRACTS.md "Per-tensor FP8 KV cache"):
// u8 rows of d_qk e4m3fn codes, column c = e4m3(byte c) × kv_scale.
inline constexpr CacheLayoutUse kKvCacheLayouts[] = {{CacheLayout::kBf16_576, true},
                                                     {CacheLayout::kBf16_512, true},
                                                     {CacheLayout::kFp8_576PerTensor, true},
                                                     {CacheLayout::kFp8_512PerTensor, true}};

struct Params : WithTensors<Params> {
  Tensor q;  // bf16 [B, s_q, H, d_qk], d_qk 576 or 512, H in 1..128
  // bf16 [num_pages, page_size, d_qk], page_size >= 1 (64 in the model), or the per-tensor FP8
  // cache u8 [num_pages, page_size, d_qk] (with kv_scale).
  Tensor kv_cache;
  // The per-tensor FP8 cache's scale (finite, > 0); 0 (unset) with a bf16 cache.
  float kv_scale = 0;
  // kv_cache's named layout (one of kKvCacheLayouts), or kUnspecified: inferred from its dtype
  // and shape. Checked by Validate; the math does not read it.
  CacheLayout kv_cache_layout = CacheLayout::kUnspecified;
  Tensor block_table;    // i32 [B, max_pages]; ids outside [0, num_pages) mask their tokens
  Tensor cache_seqlens;  // i32 [B]; clamped to [0, max_pages·page_size]
  Tensor out;            // bf16 [B, s_q, H, 512]
  Tensor lse;            // f32 [B, s_q, H], natural log, optional (rank 0 = absent); any
                         // non-overlapping strides, e.g. a view of FlashMLA's [B, H, s_q]
  float sm_scale = 0;    // softmax scale applied to q·k, finite and > 0
  // Query i of s_q sees the first seqlen − s_q + i + 1 tokens (none when that is <= 0) with
  // causal; all seqlen tokens without. A row that sees no readable token gets out 0, lse -inf.
  bool causal = false;
  // Numerics of out (kernels/common/precision.h): kFast rounds P to bf16 before P·V.
  Precision precision = Precision::kFast;
  // Each request's out and lse bitwise the same whatever else is in the call (docs/KERNELS.md
  // "Batch invariance"): its split plan comes from its own context length only. False: the
  // fastest plan.
  bool batch_invariant = false;

  bool kv_is_fp8() const { return kv_cache.dtype == DType::kU8; }

  template <class Self, class F>
  static void Tensors(Self& self, F& f) {
    f("q", self.q, Role::kInput);
    f("kv_cache", self.kv_cache, Role::kInput);
    f("block_table", self.block_table, Role::kInput);
    f("cache_seqlens", self.cache_seqlens, Role::kInput);
    f("out", self.out, Role::kOutput);
    f("lse", self.lse, Role::kOutput);
  }
};

}  // namespace attnd::kernels::mla_decode
