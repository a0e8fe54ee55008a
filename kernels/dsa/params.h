// Parameters of the fused DSA attention layer (docs/CONTRACTS.md "dsa_attention"): indexer
// logits → top-k → sparse MLA in one call. T query tokens, N cache tokens (row n of index_k and of
// kv is the same token), indexer heads H_i of dim D_i, attention heads H of dim d_qk (512 or 576).
#pragma once

#include <cstdint>

#include "kernels/common/cache_layout.h"
#include "kernels/common/precision.h"
#include "kernels/common/tensor.h"

namespace attnd::kernels::dsa {

struct Params : WithTensors<Params> {
  // Indexer inputs (kernels/indexer_logits/params.h).
  Tensor index_q;        // fp8 e4m3 [T, H_i, D_i]
  Tensor index_k;        // fp8 e4m3 [N, D_i]
  Tensor index_k_scale;  // f32 [N]
  Tensor index_weights;  // f32 [T, H_i]
  // Token t's candidates are cache rows [max(ks[t], 0), min(ke[t], N)) (causal prefill of a
  // prompt after P cached tokens: ks = 0, ke = P + t + 1). Untrusted values are clamped.
  Tensor ks;            // i32 [T]
  Tensor ke;            // i32 [T]
  int64_t topk = 2048;  // k: 1 <= k <= 4096; a token keeps min(k, window) rows

  // Sparse MLA inputs (kernels/sparse_mla/params.h).
  Tensor q;   // bf16 [T, H, d_qk]
  Tensor kv;  // bf16 [N, d_qk], row stride >= d_qk; or sparse_mla's FP8 cache, u8
              // [N, 656] with d_qk 576 (kernels/sparse_mla/params.h)
  // kv's named layout: one of sparse_mla::kKvLayouts, or kUnspecified (inferred from its dtype
  // and shape). Checked by Validate; the math does not read it.
  CacheLayout kv_layout = CacheLayout::kUnspecified;
  float sm_scale = 0;  // softmax scale (> 0, finite)
  // Numerics of out (kernels/common/precision.h): kFast rounds P to bf16 before P·V.
  Precision precision = Precision::kFast;

  // Scratch, optional: f32 [T, N] (row stride >= N). Present: the call leaves the cleaned
  // indexer logits there (-inf outside each window). Absent: the CPU implementation allocates
  // blocks of rows itself (at most 64 MiB at a time).
  Tensor logits;

  // Outputs.
  Tensor out;      // bf16 [T, H, 512]
  Tensor lse;      // f32 [T, H], optional (natural log; -inf for a token with an empty window)
  Tensor indices;  // i32 [T, topk], optional: the chosen cache rows, ascending, then -1

  template <class Self, class F>
  static void Tensors(Self& self, F& f) {
    f("index_q", self.index_q, Role::kInput);
    f("index_k", self.index_k, Role::kInput);
    f("index_k_scale", self.index_k_scale, Role::kInput);
    f("index_weights", self.index_weights, Role::kInput);
    f("ks", self.ks, Role::kInput);
    f("ke", self.ke, Role::kInput);
    f("q", self.q, Role::kInput);
    f("kv", self.kv, Role::kInput);
    f("logits", self.logits, Role::kOutput);
    f("out", self.out, Role::kOutput);
    f("lse", self.lse, Role::kOutput);
    f("indices", self.indices, Role::kOutput);
  }
};

}  // namespace attnd::kernels::dsa
