// Helpers of the implementations' Supports() predicates (registry.h: false with the reason in
// *why): alignment of views and the refusal itself.
//   if (!Aligned(p.q.data, 16)) return Refuse(why, "q: needs 16-byte alignment");
//   if (h > 64) return Refuse(why, "H is ", h, ", want <= 64");
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/common/tensor.h"

namespace attnd::kernels {

inline constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// Whether p is a multiple of `bytes` (> 0).
inline bool Aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Whether every leading stride of x (all but the last, contiguous, dimension) is a multiple of
// `elements`.
inline bool StridesMultipleOf(const Tensor& x, int64_t elements) {
  for (int d = 0; d + 1 < x.rank; ++d) {
    if (x.stride(d) % elements != 0) return false;
  }
  return true;
}

// Whether every row of bf16 tensor x starts 16-byte aligned (base 16-byte aligned, leading
// strides multiples of 8 elements): the condition of 16-byte vector loads and cp.async.
inline bool Bf16RowsAligned16(const Tensor& x) {
  return Aligned(x.data, 16) && StridesMultipleOf(x, 8);
}

// Sets *why (when not null) to the pieces written one after the other; returns false.
template <class... Pieces>
bool Refuse(std::string* why, const Pieces&... pieces) {
  if (why != nullptr) *why = absl::StrCat(pieces...);
  return false;
}

}  // namespace attnd::kernels
