// The request of a row in top-k's KV-slot mapping (docs/CONTRACTS.md "topk", "Request of a
// row"): by a per-row request id, or by a search of cu_seqlens_q. Plain C++ shared by the CPU
// implementation and the GPU kernels, so both resolve hostile data the same way. The values are
// untrusted data: every read stays inside the tensors whatever they hold.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define ATTND_TOPK_RM_HD __host__ __device__ __forceinline__
#else
#define ATTND_TOPK_RM_HD inline
#endif

namespace attnd::kernels::topk {

// A per-row request id: itself when in [0, num_requests), else -1 (no request).
ATTND_TOPK_RM_HD int64_t RequestById(int32_t id, int64_t num_requests) {
  return id >= 0 && static_cast<int64_t>(id) < num_requests ? static_cast<int64_t>(id) : -1;
}

// The request b of row `row` by cu_seqlens_q (num_requests + 1 entries, element stride `stride`):
// a binary search keeping cu[lo] <= row < cu[hi] (lo = 0, hi = num_requests), then b = lo when
// cu[lo] <= row < cu[lo + 1], else -1. For a non-decreasing cu_seqlens_q that is the b with
// cu[b] <= row < cu[b + 1]; for any other data it is -1 or some b that satisfies those two
// reads. Indices read are always in [0, num_requests].
ATTND_TOPK_RM_HD int64_t RequestByCuSeqlens(const int32_t* cu, int64_t stride, int64_t num_requests,
                                            int64_t row) {
  if (num_requests <= 0) return -1;
  int64_t lo = 0, hi = num_requests;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(cu[mid * stride]) <= row) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int64_t first = cu[lo * stride];
  const int64_t next = cu[(lo + 1) * stride];
  return first <= row && row < next ? lo : -1;
}

}  // namespace attnd::kernels::topk
