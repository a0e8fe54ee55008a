// Builds mla_prefill calls for the tests: packed random bf16 q/k/v for sequences of given query
// and key lengths, GQA head counts, any head dims, optional padded strides and token rows past
// the last sequence (whose keys are NaN, so a kernel reading past its sequence poisons).
//   PrefillCase c;  c.lens = {{37, 150}, {0, 5}};
//   PrefillTensors t(c, rng);  // t.params() is ready for Validate / RunEachImpl
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "kernels/mla_prefill/params.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"

namespace attnd::kernels::mla_prefill {

// Tolerances (never widened to make a test pass):
// out is bf16 (8-bit significand): rounding the f32 result costs up to 2^-8 relative per element
// (RMS ≈ 1.6e-3). The f32 path adds: q pre-scaled by sm_scale·log2(e) (one rounding), ≤256-term
// f32 dot products (scores ~N(0,1), error ≲1e-6), the exp2 polynomial (2e-7 relative) and
// 64-term f32 sums: ≲1e-6 relative on the softmax weights, so |Δout| ≲ 1e-6·max|v| with |v| < 6
// for N(0,1) data. Per element |Δ| ≤ 1e-5 + 2^-8·|ref|; relative L2 ≤ 2^-8 (≈2.4× the bf16 RMS).
// The GPU kernels stay inside the same model: f32 dot products (exact bf16 products on the
// tensor cores), and the tensor-core P·V takes P as two bf16 terms hi + lo (2^-16 relative).
// That is the HIGH precision's bound; FAST's adds bf16 P's error (ExpectAttentionOut, harness.h).
inline constexpr testing::Tolerance kOutTol = {/*rel_l2=*/1.0 / 256, /*atol=*/1e-5,
                                               /*rtol=*/1.0 / 256};
// lse is f32 of log Σ exp(s): the absolute score error (≲1e-6) plus f32 rounding of a value of
// magnitude < 16 (1e-6); atol 2e-5 leaves ~10×. -inf must match exactly.
inline constexpr testing::Tolerance kLseTol = {/*rel_l2=*/1e-5, /*atol=*/2e-5, /*rtol=*/0};

struct PrefillCase {
  std::vector<std::pair<int32_t, int32_t>> lens = {{70, 70}};  // (Lq, Lk) per sequence
  int64_t heads = 4;
  int64_t heads_kv = 4;
  int64_t d_qk = 192;
  int64_t d_v = 128;
  bool causal = true;
  bool with_lse = true;
  bool padded_strides = false;
  int64_t extra_q_rows = 0;  // query rows past cu_seqlens_q[B]
  int64_t extra_k_rows = 0;  // key rows past cu_seqlens_k[B], filled with NaN
};

class PrefillTensors {
 public:
  PrefillTensors(const PrefillCase& c, std::mt19937_64& rng);
  const Params& params() const { return params_; }
  testing::HostTensor& out() { return out_; }
  testing::HostTensor& lse() { return lse_; }
  testing::HostTensor& cu_seqlens_q() { return cu_q_; }
  testing::HostTensor& cu_seqlens_k() { return cu_k_; }
  std::vector<testing::HostTensor*> outputs();

 private:
  testing::HostTensor q_, k_, v_, cu_q_, cu_k_, out_, lse_;
  Params params_;
};

}  // namespace attnd::kernels::mla_prefill
