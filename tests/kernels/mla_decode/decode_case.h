// Builds mla_decode calls for the tests: random bf16 q and cache, a random (permuted) block table,
// optional padded strides, invalid page ids, and guard pages of NaN around the cache view so a
// kernel that reads a masked page poisons its output.
//   DecodeCase c;  c.heads = 16;  c.seqlens = {1, 65};
//   DecodeTensors t(c, rng);  // t.params() is ready for Validate / RunEachImpl
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/mla_decode/params.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"

namespace attnd::kernels::mla_decode {

// Tolerances (never widened to make a test pass):
// out is bf16 (8-bit significand): rounding the f32 result costs up to 2^-8 relative per element
// (RMS ≈ 1.6e-3 measured). The f32 path adds: q pre-scaled by sm_scale·log2(e) (one rounding),
// 576-term f32 dot products (scores ~N(0,1), error ~1e-7..1e-6), the exp2 polynomial (2e-7
// relative) and 64-term f32 sums: ≲1e-6 relative on the softmax weights, so |Δout| ≲ 1e-6·
// max|v| with |v| < 6 for N(0,1) data (measured: ≤ 5e-7 beyond the rounding bound). Per element
// |Δ| ≤ 1e-5 + 2^-8·|ref|; relative L2 ≤ 2^-8 (≈2.4× the measured bf16 RMS). The GPU kernels
// stay inside the same model: f32 dot products (exact bf16 products on the tensor cores), and
// the tensor-core P·V takes P as two bf16 terms hi + lo (2^-16 relative, not bf16's 2^-9).
// That is the HIGH precision's bound; FAST's adds bf16 P's error (ExpectAttentionOut, harness.h).
inline constexpr testing::Tolerance kOutTol = {/*rel_l2=*/1.0 / 256, /*atol=*/1e-5,
                                               /*rtol=*/1.0 / 256};
// lse is f32 of log Σ exp(s): the absolute score error (≲1e-6) plus f32 rounding of a value of
// magnitude < 16 (1e-6); measured ≤ 2e-6, atol 2e-5 leaves ~10×. -inf must match exactly.
inline constexpr testing::Tolerance kLseTol = {/*rel_l2=*/1e-5, /*atol=*/2e-5, /*rtol=*/0};

struct DecodeCase {
  int64_t s_q = 1;
  int64_t heads = 16;
  int64_t d_qk = 576;
  int64_t page_size = 64;
  bool causal = false;
  bool with_lse = true;
  // lse as a view of FlashMLA's [B, H, s_q] buffer (docs/CONTRACTS.md "Strided lse"): strides
  // (H·(s_q + lse_pad), 1, s_q + lse_pad), head rows lse_pad elements apart; the gaps hold poison
  // that must survive (ExpectLseGapsPoisoned). Overrides padded_strides for lse.
  bool lse_head_major = false;
  int64_t lse_pad = 0;
  std::vector<int32_t> seqlens = {65};  // per request; the batch size is its length
  int64_t max_pages = -1;               // -1: just enough for the longest clamped request
  int64_t spare_pages = 3;              // cache pages no request uses
  bool padded_strides = false;          // pad every dimension of every tensor
  // (request, logical page) entries overwritten with an id outside [0, num_pages).
  std::vector<std::pair<int64_t, int64_t>> invalid_pages;
  std::vector<int32_t> invalid_ids = {-1};  // cycled through for invalid_pages
  // Nonzero: the cache is the per-tensor FP8 one (u8 codes, params.h) with this kv_scale, each
  // token row written the way vLLM's cache writer does (tests/harness/fp8_kv.h
  // QuantizeMlaRowPerTensor) from a bf16 row with subnormal and saturating values.
  float fp8_kv_scale = 0;
  // bf16 cache: every position a request's table maps at or past its length (the rest of its
  // last page, and whole pages after it) holds NaN, so a kernel that lets a position past the
  // length reach its arithmetic (even as 0 · V) poisons its output.
  bool nan_past_length = false;
};

// Every f32 element in lse's span that the view does not address still holds PoisonNaN's pattern.
void ExpectLseGapsPoisoned(const testing::HostTensor& lse, const std::string& what);

class DecodeTensors {
 public:
  DecodeTensors(const DecodeCase& c, std::mt19937_64& rng);
  const Params& params() const { return params_; }
  // A per-tensor FP8 case's cache as the GPU kernels see it: a dense bf16 copy of the cache view
  // with every e4m3 × kv_scale rounded to bf16 (exact for power-of-two scales).
  testing::HostTensor RoundedKvAsBf16() const;
  testing::HostTensor& out() { return out_; }
  testing::HostTensor& lse() { return lse_; }
  // The output tensors RunEachImpl poisons (lse only when present).
  std::vector<testing::HostTensor*> outputs();

 private:
  testing::HostTensor q_, kv_, table_, seqlens_, out_, lse_;
  Params params_;
};

}  // namespace attnd::kernels::mla_decode
