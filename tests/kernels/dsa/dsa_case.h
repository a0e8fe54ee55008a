// Random fused-DSA calls for the tests: fp8 indexer inputs, bf16 q, bf16, FP8-cache or per-tensor
// FP8 kv, windows
// (causal after a prefix unless given), optional caller logits scratch and indices output,
// NaN-poisoned outputs.
//   DsaCase c(spec, rng);
//   dsa::Params p = c.MakeParams();
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/dsa/params.h"
#include "tests/harness/host_tensor.h"

namespace attnd::testing {

struct DsaSpec {
  int64_t t = 6;
  int64_t prefix = 90;  // N = prefix + t; causal windows ks = 0, ke = prefix + t + 1
  int64_t index_heads = 16;
  int64_t index_dim = 128;
  int64_t topk = 64;
  int64_t heads = 16;
  int64_t d_qk = 576;
  bool with_logits = false;  // caller-provided scratch
  bool with_indices = true;  // indices output requested
  bool with_lse = true;
  int64_t pad = 0;  // extra elements on the leading strides of q, kv, logits
  // kv in sparse_mla's FP8 cache format (u8 [N, 656], d_qk must be 576; power-of-two scales, so
  // the GPU kernels' one bf16 rounding is exact) instead of bf16.
  bool fp8_kv = false;
  // kv as the per-tensor FP8 cache (u8 [N, d_qk], d_qk 576 or 512; docs/CONTRACTS.md "Per-tensor
  // FP8 KV cache"), written by the frontend's rules (tests/harness/fp8_kv.h) with kv_scale, and
  // named in kv_layout (FP8_576_PER_TENSOR / FP8_512_PER_TENSOR).
  bool per_tensor_kv = false;
  float kv_scale = 0.03125f;
};

class DsaCase {
 public:
  DsaCase(const DsaSpec& spec, std::mt19937_64& rng);

  int64_t n() const { return spec_.prefix + spec_.t; }
  // Overrides token t's window (defaults are causal).
  void SetWindow(int64_t t, int32_t ks, int32_t ke);
  kernels::dsa::Params MakeParams();
  std::vector<HostTensor*> Outputs();  // out, lse, indices, logits (those present)

  const DsaSpec& spec() const { return spec_; }
  HostTensor& out() { return out_; }
  HostTensor& lse() { return lse_; }
  HostTensor& indices() { return indices_; }
  HostTensor& logits() { return logits_; }

 private:
  DsaSpec spec_;
  HostTensor index_q_, index_k_, index_k_scale_, index_weights_, ks_, ke_, q_, kv_;
  HostTensor logits_, out_, lse_, indices_;
};

}  // namespace attnd::testing
