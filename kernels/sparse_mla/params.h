// Parameters of sparse MLA (docs/CONTRACTS.md "sparse_mla"): each query token attends, in MQA
// form, only to its selected rows of the latent KV cache. Selection is a top-k table or CSR; the
// form is chosen by whether `indptr` is present. Shapes: T tokens, H heads, d_qk 512 or 576, S
// cache rows. The KV cache is bf16 or, for decode with d_qk 576, the FP8 format of FlashMLA / vLLM
// (kFp8Row*; docs/CONTRACTS.md "FP8 KV cache"), or flat e4m3 rows of d_qk codes with one
// per-tensor scale (kv_scale).
#pragma once

#include <cstdint>

#include "kernels/common/cache_layout.h"
#include "kernels/common/precision.h"
#include "kernels/common/tensor.h"

namespace attnd::kernels::sparse_mla {

inline constexpr int64_t kDimV = 512;      // d_v: V is the first 512 columns of kv
inline constexpr int64_t kMaxHeads = 128;  // H in [1, 128]

// FP8 KV cache row (DeepSeek-V3.2's layout in FlashMLA and vLLM), 656 bytes per token:
//   bytes [0, 512)    512 e4m3fn codes: columns 0..511 (the no-rope part: V and K's first 512)
//   bytes [512, 528)  4 f32 scales: scale j applies to columns 128·j .. 128·j + 127
//   bytes [528, 656)  64 bf16 values: columns 512..575 (rope), not scaled
// Column c < 512 is e4m3(byte c) × scale[c / 128]. NaN codes (S.1111.111) are not valid input.
inline constexpr int64_t kFp8RowBytes = 656;
inline constexpr int64_t kFp8ScaleOffset = 512;  // bytes
inline constexpr int64_t kFp8RopeOffset = 528;   // bytes
inline constexpr int64_t kFp8ScaleCols = 128;    // columns per scale
inline constexpr int64_t kFp8DimQk = 576;        // the only d_qk the FP8 cache serves

// Per-tensor FP8 rows (CACHE_LAYOUT_FP8_576_PER_TENSOR / FP8_512_PER_TENSOR; vLLM's
// kv_cache_dtype "fp8" MLA cache, docs/CONTRACTS.md "Per-tensor FP8 KV cache"): u8 [S, d_qk],
// byte c is the e4m3fn code of column c (rope included at d_qk 576), value e4m3(byte c) ×
// kv_scale, one f32 scale for the whole cache. NaN codes are not valid input.

// The named layouts kv may have (docs/CONTRACTS.md "Named layouts"); dtype and last dim tell
// them apart, so each is inferred when kv_layout is unspecified.
inline constexpr CacheLayoutUse kKvLayouts[] = {{CacheLayout::kBf16_576, true},
                                                {CacheLayout::kBf16_512, true},
                                                {CacheLayout::kFlashMlaFp8_656, true},
                                                {CacheLayout::kFp8_576PerTensor, true},
                                                {CacheLayout::kFp8_512PerTensor, true}};

struct Params : WithTensors<Params> {
  // Inputs (owned by the caller; strided views are fine, the last dim must be contiguous).
  Tensor q;  // bf16 [T, H, d_qk], d_qk in {512, 576}
  // KV cache, one of two formats (K is all d_qk columns, V the first 512):
  //   bf16 [S, d_qk], row stride >= d_qk elements;
  //   FP8  u8 [S, 656] (kFp8Row*, d_qk must be 576), row stride >= 656 bytes and a multiple of
  //        4, base 4-byte aligned (f32 scales); a strided view of a wider cache row is fine;
  //   per-tensor FP8  u8 [S, d_qk] (above), row stride >= d_qk bytes, with kv_scale.
  Tensor kv;
  // The per-tensor FP8 cache's scale (finite, > 0); 0 (unset) for every other format.
  float kv_scale = 0;
  // kv's named layout (one of kKvLayouts), or kUnspecified: inferred from its dtype and shape.
  // Checked by Validate against kv; the math does not read it.
  CacheLayout kv_layout = CacheLayout::kUnspecified;
  // Selection, one of two forms:
  //   table (indptr absent): i32 [T, K], row t lists token t's K slots (row stride may be > K);
  //   CSR (indptr present):  i32 [nnz], token t's slots are indices[indptr[t] .. indptr[t+1]).
  // An index < 0 or >= S is masked (never read). Duplicates count as often as they appear.
  Tensor indices;
  Tensor indptr;       // i32 [T + 1], CSR form only: indptr[0] = 0, monotone, indptr[T] = nnz
  Tensor topk_length;  // i32 [T], optional, table form only: slots >= topk_length[t] are ignored
                       // (values clamped to [0, K])
  float sm_scale = 0;  // softmax scale (> 0, finite) on q·k
  // Numerics of out (kernels/common/precision.h): kFast rounds P to bf16 before P·V.
  Precision precision = Precision::kFast;
  // Each token's out and lse bitwise the same whatever else is in the call (docs/KERNELS.md
  // "Batch invariance"): its split plan comes from its own selection only, and implementations
  // whose result can depend on neighbouring tokens refuse it. False: the fastest plan.
  bool batch_invariant = false;

  // Outputs (owned by the caller).
  Tensor out;  // bf16 [T, H, 512]: softmax-weighted V; 0 for a token with no valid slot
  Tensor lse;  // f32 [T, H], optional: natural log of Σ exp(sm_scale·q·k); -inf when no slot
               // Any non-overlapping strides, e.g. a view of [H, T] (CONTRACTS.md "Strided lse").

  bool is_csr() const { return indptr.present(); }
  // The FlashMLA FP8 cache (u8 rows of 656 bytes with their own scales).
  bool kv_is_fp8() const { return kv.dtype == DType::kU8 && !kv_is_fp8_per_tensor(); }
  // The per-tensor FP8 cache (u8 rows of d_qk codes, one kv_scale).
  bool kv_is_fp8_per_tensor() const {
    return kv.dtype == DType::kU8 && kv.rank >= 1 && kv.shape[kv.rank - 1] != kFp8RowBytes;
  }

  template <class Self, class F>
  static void Tensors(Self& self, F& f) {
    f("q", self.q, Role::kInput);
    f("kv", self.kv, Role::kInput);
    f("indices", self.indices, Role::kInput);
    f("indptr", self.indptr, Role::kInput);
    f("topk_length", self.topk_length, Role::kInput);
    f("out", self.out, Role::kOutput);
    f("lse", self.lse, Role::kOutput);
  }
};

}  // namespace attnd::kernels::sparse_mla
