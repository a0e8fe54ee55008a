// Parameters of the prefill indexer-logits operator, the DSA "lightning indexer"
// (docs/CONTRACTS.md "indexer_logits"):
//   logits[m,n] = Σ_h relu(q[m,h]·k[n]) · k_scale[n] · weights[m,h], n in [max(ks,0), min(ke,N))
// Tensors are views owned by the caller; the operator never allocates them.
#pragma once

#include <cstdint>

#include "kernels/common/precision.h"
#include "kernels/common/tensor.h"

namespace attnd::kernels::indexer_logits {

inline constexpr int64_t kMaxHeads = 128;     // H in [1, kMaxHeads]
inline constexpr int64_t kHeadDimAlign = 16;  // D is a multiple of this ...
inline constexpr int64_t kMaxHeadDim = 1024;  // ... in [kHeadDimAlign, kMaxHeadDim]

struct Params : WithTensors<Params> {
  // Inputs.
  Tensor q;        // fp8 e4m3 [M, H, D]; leading strides may be padded
  Tensor k;        // fp8 e4m3 [N, D]; row stride >= D (a strided view of a gathered cache)
  Tensor k_scale;  // f32 [N], contiguous; any sign (it multiplies after the head sum)
  Tensor weights;  // f32 [M, H]; row stride >= H
  // The window of row m is [max(ks[m], 0), min(ke[m], N)); empty when that is empty (ke <= ks,
  // ke <= 0, ks >= N). Values are untrusted and clamped, never used to address memory unclamped.
  Tensor ks;  // i32 [M]
  Tensor ke;  // i32 [M]
  // true: every column of [0, N) outside row m's window is written -inf. false: those columns
  // are left untouched (bit for bit). Columns [N, ld) are never touched.
  bool clean_logits = true;
  // Numerics (docs/ACCURACY.md "Indexer logits"). kHigh, the default (DESIGN.md §2's contract):
  // exact fp8 products summed in f32. kFast, opt-in: FP8 tensor-core accumulation (14
  // significant bits per k32 step, truncated; cuda_wgmma), with its own, wider bound.
  Precision precision = Precision::kHigh;

  // Output.
  Tensor logits;  // f32 [M, N]; row stride ld >= N (m·ld is 64-bit: it passes 2^31 in real use)

  template <class Self, class F>
  static void Tensors(Self& self, F& f) {
    f("q", self.q, Role::kInput);
    f("k", self.k, Role::kInput);
    f("k_scale", self.k_scale, Role::kInput);
    f("weights", self.weights, Role::kInput);
    f("ks", self.ks, Role::kInput);
    f("ke", self.ke, Role::kInput);
    f("logits", self.logits, Role::kOutput);
  }
};

}  // namespace attnd::kernels::indexer_logits
