// Comparing the daemon's outputs with the local CPU run: floating outputs element-wise with a
// stated tolerance (relative L2 error and a per-element bound), index outputs as per-row sets
// (top-k order and tie-breaking are free: docs/CONTRACTS.md "topk").
//   Check c = CompareFloat("out", remote_out, local_out, kBf16Tolerance);
#pragma once

#include <cstdint>
#include <string>

#include "kernels/common/tensor.h"

namespace attnd::attnctl {

struct Tolerance {
  double rel_l2;  // ‖got − ref‖₂ / ‖ref‖₂ over finite reference elements
  double atol;    // per element: |got − ref| <= atol + rtol·|ref|
  double rtol;
};
// bf16 outputs (attention out): bf16's own rounding (2^-8) plus accumulation-order noise.
inline constexpr Tolerance kBf16Tolerance{1e-2, 1e-2, 1e-2};
// f32 outputs (logits, lse, top-k values).
inline constexpr Tolerance kF32Tolerance{1e-4, 1e-3, 1e-3};

struct Check {
  std::string name;  // the output ("out", "lse", "indices", ...)
  std::string kind;  // "float", "float_row_set", "index_set" or "missing"
  bool pass = false;
  int64_t elements = 0;
  int64_t mismatches = 0;  // elements (float) or rows (index_set) out of bounds
  double max_abs_err = 0;  // float: over finite reference elements
  double rel_l2_err = 0;   // float
  Tolerance tolerance{0, 0, 0};
  std::string detail;  // first mismatch, or why the check could not run
};

// Non-finite reference elements must match exactly (same infinity); NaN in `got` where the
// reference is finite is a mismatch (an unwritten, poisoned element).
Check CompareFloat(const std::string& name, const kernels::Tensor& got, const kernels::Tensor& ref,
                   const Tolerance& tol);
// The same after sorting each row (last dim) of both: values that follow a free order.
Check CompareFloatRows(const std::string& name, const kernels::Tensor& got,
                       const kernels::Tensor& ref, const Tolerance& tol);
// i32 [rows, k]: each row's multiset of entries (padding -1 included) must be equal.
Check CompareIndexRows(const std::string& name, const kernels::Tensor& got,
                       const kernels::Tensor& ref);
// A check that could not run (missing output, layout mismatch).
Check FailedCheck(const std::string& name, const std::string& detail);

}  // namespace attnd::attnctl
