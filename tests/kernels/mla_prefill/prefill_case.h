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
#include "tests/harness/host_tensor.h"

namespace attnd::kernels::mla_prefill {

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
