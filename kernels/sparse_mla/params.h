// Parameters of sparse MLA (DESIGN.md §2): each query token attends, in MQA form, only to its
// selected rows of the latent KV cache. Selection is a top-k table or CSR; the form is chosen by
// whether `indptr` is present. Shapes: T tokens, H heads, d_qk 512 or 576, S cache rows.
#pragma once

#include <cstdint>

#include "kernels/common/tensor.h"

namespace attnd::kernels::sparse_mla {

inline constexpr int64_t kDimV = 512;      // d_v: V is the first 512 columns of kv
inline constexpr int64_t kMaxHeads = 128;  // H in [1, 128]

struct Params {
  // Inputs (owned by the caller; strided views are fine, the last dim must be contiguous).
  Tensor q;   // bf16 [T, H, d_qk], d_qk in {512, 576}
  Tensor kv;  // bf16 [S, d_qk]: K is all d_qk columns, V the first 512; row stride >= d_qk
  // Selection, one of two forms:
  //   table (indptr absent): i32 [T, K], row t lists token t's K slots (row stride may be > K);
  //   CSR (indptr present):  i32 [nnz], token t's slots are indices[indptr[t] .. indptr[t+1]).
  // An index < 0 or >= S is masked (never read). Duplicates count as often as they appear.
  Tensor indices;
  Tensor indptr;       // i32 [T + 1], CSR form only: indptr[0] = 0, monotone, indptr[T] = nnz
  Tensor topk_length;  // i32 [T], optional, table form only: slots >= topk_length[t] are ignored
                       // (values clamped to [0, K])
  float sm_scale = 0;  // softmax scale (> 0, finite) on q·k

  // Outputs (owned by the caller).
  Tensor out;  // bf16 [T, H, 512]: softmax-weighted V; 0 for a token with no valid slot
  Tensor lse;  // f32 [T, H], optional: natural log of Σ exp(sm_scale·q·k); -inf when no slot

  bool is_csr() const { return indptr.present(); }

  template <class F>
  void ForEachTensor(F&& f) {
    f("q", q, Role::kInput);
    f("kv", kv, Role::kInput);
    f("indices", indices, Role::kInput);
    f("indptr", indptr, Role::kInput);
    f("topk_length", topk_length, Role::kInput);
    f("out", out, Role::kOutput);
    f("lse", lse, Role::kOutput);
  }
  template <class F>
  void ForEachTensor(F&& f) const {
    f("q", q, Role::kInput);
    f("kv", kv, Role::kInput);
    f("indices", indices, Role::kInput);
    f("indptr", indptr, Role::kInput);
    f("topk_length", topk_length, Role::kInput);
    f("out", out, Role::kOutput);
    f("lse", lse, Role::kOutput);
  }
};

}  // namespace attnd::kernels::sparse_mla
