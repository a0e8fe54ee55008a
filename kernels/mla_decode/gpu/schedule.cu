// The length-aware schedule of the MLA decode (portable CUDA/HIP; schedule_plan.h has the
// arithmetic and docs/KERNELS.md "A schedule from the lengths" the scheme): one CTA reads
// cache_seqlens (clamped as DecodeWorkItem clamps them), cuts the requests' tiles laid end to
// end into pieces of at most `width` tiles (or each request alone, as the even plan of
// `even_splits` would, where that cut gains too little: ScheduleEvenWidth), and writes into the
// workspace each launched group's piece, longest first, and each request's first piece slot and
// piece count for the combine. Runs on the stream before the decode kernel, which reads its group's
// entry.
#include <stdint.h>

#include "kernels/common/gpu/attention.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/mla_decode/gpu/common.cuh"
#include "kernels/mla_decode/gpu/plan.h"
#include "kernels/mla_decode/schedule_plan.h"

namespace attnd::kernels::mla_decode::gpu {
namespace {

constexpr int kThreads = kScheduleMaxLaunched;    // a request per thread
constexpr int kMaxPieces = kScheduleMaxLaunched;  // ranges + requests - 1 at most

// Inclusive scan of v over the block through buf (kThreads entries); every thread calls it.
template <class T>
__device__ __forceinline__ T BlockInclusiveScan(T v, T* buf) {
  const int tid = threadIdx.x;
  buf[tid] = v;
  __syncthreads();
  for (int d = 1; d < kThreads; d *= 2) {
    const T add = tid >= d ? buf[tid - d] : T{0};
    __syncthreads();
    buf[tid] += add;
    __syncthreads();
  }
  return buf[tid];
}

__global__ void __launch_bounds__(kThreads)
    MlaDecodeScheduleKernel(const DecodeArgs a, int32_t groups, int32_t block_n,
                            int32_t even_splits) {
  __shared__ int64_t scan64_s[kThreads];
  __shared__ int32_t scan32_s[kThreads];
  __shared__ int32_t lo_s[kMaxPieces], hi_s[kMaxPieces], req_s[kMaxPieces];
  __shared__ int32_t longest_s;
  const int b = threadIdx.x;
  if (b == 0) longest_s = 0;
  // The tiles of request b: the positions its widest row block sees (the last MTP token sees
  // the whole clamped length).
  int64_t tiles = 0;
  if (b < a.batch) {
    const int64_t raw = a.seqlens[b * a.seqlens_stride];
    const int64_t seqlen = Min64(Max64(raw, 0), a.capacity);
    tiles = (seqlen + block_n - 1) / block_n;
  }
  __syncthreads();  // longest_s
  atomicMax(&longest_s, static_cast<int32_t>(Min64(tiles, INT32_MAX)));
  const int64_t end = BlockInclusiveScan<int64_t>(tiles, scan64_s);  // also orders longest_s
  const int64_t total = scan64_s[kThreads - 1];
  const int64_t prefix = end - tiles;
  const int64_t e2e = ScheduleWidth(total, longest_s, groups, kScheduleMinWidth, kMaxSplits);
  const int64_t even = ScheduleEvenWidth(e2e, longest_s, a.batch, groups, a.sched_groups,
                                         even_splits, kScheduleMinWidth);
  const int64_t width = even > 0 ? even : e2e;
  const int64_t at = even > 0 ? 0 : prefix;  // the even cut starts every request afresh
  const int32_t n = b < a.batch ? SchedulePiecesOf(at, tiles, width) : 0;
  const int32_t first = BlockInclusiveScan<int32_t>(n, scan32_s) - n;
  const int32_t count = scan32_s[kThreads - 1];
  for (int32_t k = 0; k < n; ++k) {
    const ScheduleSpan s = SchedulePiece(at, tiles, width, k);
    lo_s[first + k] = static_cast<int32_t>(s.lo);
    hi_s[first + k] = static_cast<int32_t>(s.hi);
    req_s[first + k] = b;
  }
  if (b < a.batch) {
    a.sched_first[b] = first;
    a.sched_pieces[b] = n;
  }
  __syncthreads();
  // Piece i goes to group rank(i): the pieces longer than it, or as long and earlier.
  for (int32_t i = b; i < count; i += kThreads) {
    const int32_t len = hi_s[i] - lo_s[i];
    int32_t rank = 0;
    for (int32_t j = 0; j < count; ++j) {
      const int32_t lj = hi_s[j] - lo_s[j];
      rank += lj > len || (lj == len && j < i) ? 1 : 0;
    }
    int32_t* e = a.sched + 4 * static_cast<int64_t>(rank);
    e[0] = req_s[i];
    e[1] = lo_s[i];
    e[2] = hi_s[i];
    e[3] = i;
  }
  // Groups past the pieces: request 0, nothing to read, a slot no request's combine reads.
  for (int32_t g = count + b; g < a.sched_groups; g += kThreads) {
    int32_t* e = a.sched + 4 * static_cast<int64_t>(g);
    e[0] = 0;
    e[1] = 0;
    e[2] = 0;
    e[3] = g;
  }
}

}  // namespace

::attnd::gpu::Error LaunchMlaDecodeSchedule(const DecodeArgs& a, int32_t groups, int32_t block_n,
                                            int32_t even_splits, ::attnd::gpu::Stream stream) {
  if (a.sched == nullptr || a.batch < 1 || groups < 1 || a.sched_groups < groups + a.batch ||
      a.sched_groups > kScheduleMaxLaunched || block_n < 1) {
    return ::attnd::gpu::kErrorInvalidValue;
  }
  MlaDecodeScheduleKernel<<<1, kThreads, 0, stream>>>(a, groups, block_n, even_splits);
  return ::attnd::gpu::GetLastError();
}

}  // namespace attnd::kernels::mla_decode::gpu
