// Parameters of the dense, non-absorbed MLA prefill over packed variable-length sequences
// (docs/CONTRACTS.md "mla_prefill"): sequence b's queries q[cu_seqlens_q[b], cu_seqlens_q[b+1])
// attend to its keys k/v[cu_seqlens_k[b], cu_seqlens_k[b+1]), with GQA. Callers own every tensor.
#pragma once

#include "kernels/common/precision.h"
#include "kernels/common/tensor.h"

namespace attnd::kernels::mla_prefill {

inline constexpr int64_t kMaxHeadDim = 256;  // d_qk and d_v; 192 / 128 is the model's shape

struct Params : WithTensors<Params> {
  Tensor q;             // bf16 [total_q, H, d_qk], 1 <= d_qk <= 256
  Tensor k;             // bf16 [total_k, H_kv, d_qk], H % H_kv == 0
  Tensor v;             // bf16 [total_k, H_kv, d_v], 1 <= d_v <= 256
  Tensor cu_seqlens_q;  // i32 [B + 1]: 0 = first <= ... <= last <= total_q (data, checked)
  Tensor cu_seqlens_k;  // i32 [B + 1]: 0 = first <= ... <= last <= total_k (data, checked)
  Tensor out;           // bf16 [total_q, H, d_v]; rows past cu_seqlens_q[B] are written 0
  Tensor lse;           // f32 [total_q, H], natural log, optional (rank 0 = absent)
  float sm_scale = 0;   // softmax scale applied to q·k, finite and > 0
  // Bottom-right aligned: in a sequence with Lq queries and Lk keys, query i sees keys
  // j <= i + Lk − Lq. Without causal every query sees all Lk keys. Query head h reads kv head
  // h / (H / H_kv). A query that sees no key gets out 0 and lse -inf.
  bool causal = false;
  // Numerics of out (kernels/common/precision.h): kFast rounds P to bf16 before P·V.
  Precision precision = Precision::kFast;

  template <class Self, class F>
  static void Tensors(Self& self, F& f) {
    f("q", self.q, Role::kInput);
    f("k", self.k, Role::kInput);
    f("v", self.v, Role::kInput);
    f("cu_seqlens_q", self.cu_seqlens_q, Role::kInput);
    f("cu_seqlens_k", self.cu_seqlens_k, Role::kInput);
    f("out", self.out, Role::kOutput);
    f("lse", self.lse, Role::kOutput);
  }
};

}  // namespace attnd::kernels::mla_prefill
