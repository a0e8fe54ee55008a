// Builds mla_decode calls for the tests: random bf16 q and cache, a random (permuted) block table,
// optional padded strides, invalid page ids, and guard pages of NaN around the cache view so a
// kernel that reads a masked page poisons its output.
//   DecodeCase c;  c.heads = 16;  c.seqlens = {1, 65};
//   DecodeTensors t(c, rng);  // t.params() is ready for Validate / RunEachImpl
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "kernels/mla_decode/params.h"
#include "tests/harness/host_tensor.h"

namespace attnd::kernels::mla_decode {

struct DecodeCase {
  int64_t s_q = 1;
  int64_t heads = 16;
  int64_t d_qk = 576;
  int64_t page_size = 64;
  bool causal = false;
  bool with_lse = true;
  std::vector<int32_t> seqlens = {65};  // per request; the batch size is its length
  int64_t max_pages = -1;               // -1: just enough for the longest clamped request
  int64_t spare_pages = 3;              // cache pages no request uses
  bool padded_strides = false;          // pad every dimension of every tensor
  // (request, logical page) entries overwritten with an id outside [0, num_pages).
  std::vector<std::pair<int64_t, int64_t>> invalid_pages;
  std::vector<int32_t> invalid_ids = {-1};  // cycled through for invalid_pages
};

class DecodeTensors {
 public:
  DecodeTensors(const DecodeCase& c, std::mt19937_64& rng);
  const Params& params() const { return params_; }
  testing::HostTensor& out() { return out_; }
  testing::HostTensor& lse() { return lse_; }
  // The output tensors RunEachImpl poisons (lse only when present).
  std::vector<testing::HostTensor*> outputs();

 private:
  testing::HostTensor q_, kv_, table_, seqlens_, out_, lse_;
  Params params_;
};

}  // namespace attnd::kernels::mla_decode
