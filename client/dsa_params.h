// The inputs and outputs of one DSA attention layer as the DsaAttention RPC takes them (indexer ->
// top-k -> sparse MLA, docs/CONTRACTS.md "dsa_attention"), in the shape of a kernels Params struct
// so the client encodes it like any operator. Tensor names are the proto's field names.
//   DsaAttentionParams p;  p.index_q = ...;  p.topk = 2048;  p.q = ...;  p.kv = ...;
//   ATTND_ASSIGN_OR_RETURN(CallResult r, client.DsaAttention(p));
#pragma once

#include <cstdint>

#include "kernels/common/tensor.h"
#include "kernels/dsa/params.h"

namespace attnd::client {

struct DsaAttentionParams {
  // Indexer inputs.
  kernels::Tensor index_q;        // fp8 [T, H_idx, D_idx]
  kernels::Tensor index_k;        // fp8 [N, D_idx]
  kernels::Tensor index_k_scale;  // f32 [N]
  kernels::Tensor index_weights;  // f32 [T, H_idx]
  kernels::Tensor ks;             // i32 [T]: row t scores positions [max(ks,0), min(ke,N))
  kernels::Tensor ke;             // i32 [T]
  int64_t topk = 0;               // k of the top-k step (2048 in the model)
  // Sparse MLA inputs: the chosen positions index rows of kv (S = N).
  kernels::Tensor q;   // bf16 [T, H, d_qk]
  kernels::Tensor kv;  // bf16 [S, d_qk], or the FP8 KV cache u8 [S, 656] (d_qk 576)
  float sm_scale = 0;
  kernels::Precision precision = kernels::Precision::kFast;  // of out
  // Outputs.
  kernels::Tensor out;      // bf16 [T, H, 512]
  kernels::Tensor lse;      // f32 [T, H]
  kernels::Tensor indices;  // i32 [T, topk], optional: returned only when present

  template <class F>
  void ForEachTensor(F&& f) {
    ForEach(*this, f);
  }
  template <class F>
  void ForEachTensor(F&& f) const {
    ForEach(*this, f);
  }

 private:
  template <class Self, class F>
  static void ForEach(Self& s, F& f) {
    f("index_q", s.index_q, kernels::Role::kInput);
    f("index_k", s.index_k, kernels::Role::kInput);
    f("index_k_scale", s.index_k_scale, kernels::Role::kInput);
    f("index_weights", s.index_weights, kernels::Role::kInput);
    f("ks", s.ks, kernels::Role::kInput);
    f("ke", s.ke, kernels::Role::kInput);
    f("q", s.q, kernels::Role::kInput);
    f("kv", s.kv, kernels::Role::kInput);
    f("out", s.out, kernels::Role::kOutput);
    f("lse", s.lse, kernels::Role::kOutput);
    f("indices", s.indices, kernels::Role::kOutput);
  }
};

// The RPC's view of the kernel's params (kernels/dsa/params.h names the indexer tensors
// q_index, k_index, k_scale, weights; the proto index_q, index_k, index_k_scale,
// index_weights). The kernel's optional logits scratch is not part of the RPC.
inline DsaAttentionParams FromKernelParams(const kernels::dsa::Params& k) {
  DsaAttentionParams p;
  p.index_q = k.q_index;
  p.index_k = k.k_index;
  p.index_k_scale = k.k_scale;
  p.index_weights = k.weights;
  p.ks = k.ks;
  p.ke = k.ke;
  p.topk = k.topk;
  p.q = k.q;
  p.kv = k.kv;
  p.sm_scale = k.sm_scale;
  p.precision = k.precision;
  p.out = k.out;
  p.lse = k.lse;
  p.indices = k.indices;
  return p;
}

}  // namespace attnd::client
