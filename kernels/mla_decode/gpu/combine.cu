// Split-K combine of the MLA decode (portable CUDA/HIP): one 128-thread block per query row, 4 of
// the 512 columns per thread, grid-stride over the rows; the merge of a row is the shared one
// (kernels/common/gpu/attention/combine.cuh: out = Σ w_s·O_s / Σ w_s, lse = (M + log2 Σ w_s)·ln 2,
// every split empty → out 0, lse -inf; docs/KERNELS.md "Split-K and the combine"). Here: which
// partial slots a row's splits are in (even splits, the balanced plan or the schedule) and
// where its output goes.
#include <math.h>
#include <stdint.h>

#include <algorithm>

#include "kernels/common/gpu/attention/combine.cuh"
#include "kernels/common/gpu/convert.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/mla_decode/gpu/common.cuh"
#include "kernels/mla_decode/gpu/launch.h"
#include "kernels/mla_decode/gpu/plan.h"

namespace attnd::kernels::mla_decode::gpu {
namespace {

constexpr int kThreads = kDimV / 4;               // one float4 of the row per thread
constexpr int kGroups = kThreads / 32;            // 32-lane groups (a warp, or half a HIP wave64)
constexpr int kLoadBatch = 16;                    // partial rows whose loads are in flight together
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride beyond this

// At most 4 blocks per SM: up to 128 registers, so that ptxas keeps kLoadBatch loads in flight
// (at 64 it interleaves them with the FMAs, two at a time).
__global__ void __launch_bounds__(kThreads, 4) MlaDecodeCombineKernel(const DecodeArgs a) {
  __shared__ float weight_s[kMaxSplits];  // w_s, 0 for an empty split
  __shared__ float red_s[2][kGroups];     // per-group max, then per-group sum
  __shared__ uint32_t live_s[4];          // bit s % 32 of word s / 32: w_s != 0
  const int tid = threadIdx.x;
  const int col = tid * 4;
  const int64_t total = static_cast<int64_t>(a.batch) * a.rows;
  for (int64_t r = blockIdx.x; r < total; r += gridDim.x) {
    const int64_t b = r / a.rows;
    const int32_t row = static_cast<int32_t>(r % a.rows);
    // The balanced plan fills BalancedPiecesOf slots of request b (the rest are not written);
    // the schedule the slots [sched_first[b], + sched_pieces[b]), one request's rows each.
    int32_t splits = a.splits;
    int64_t at0 = PartialRow(a, 0, b, row);
    int64_t split_rows = total;  // partial rows between two splits
    if (a.sched != nullptr) {
      splits = a.sched_pieces[b];
      // A request in one piece wrote out and lse itself (WorkItem::direct). The same answer
      // for the whole block: none of its threads reaches a barrier this row.
      if (splits == 1) continue;
      at0 = PartialRow(a, a.sched_first[b], b, row);
      split_rows = a.rows;
    } else if (a.bal.ranges > 0) {
      splits = BalancedPiecesOf(a.bal, b);
    }
    float acc[4], sum, max_lse;
    SplitCombineRow<kThreads, kDimV, kLoadBatch, kMaxSplits>(a.partial_lse, a.partial_o, at0,
                                                             split_rows, splits, weight_s, red_s,
                                                             live_s, acc, &sum, &max_lse);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    uint16_t* out = OutRow(a, b, row) + col;
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = ::attnd::gpu::FloatToBf16(acc[i] * inv);
    if (tid == 0 && a.lse != nullptr) {
      *LseAt(a, b, row) = sum > 0.0f ? (max_lse + log2f(sum)) * kLn2 : -INFINITY;
    }
    __syncthreads();  // weight_s, red_s and live_s are rewritten for the next row
  }
}

}  // namespace

::attnd::gpu::Error LaunchMlaDecodeCombine(const DecodeArgs& a, ::attnd::gpu::Stream stream) {
  const int64_t rows = static_cast<int64_t>(a.batch) * a.rows;
  if (rows == 0) return ::attnd::gpu::kSuccess;
  if (a.splits < 1 || a.splits > kMaxSplits) return ::attnd::gpu::kErrorInvalidValue;
  const int64_t blocks = std::min(rows, kMaxBlocks);
  MlaDecodeCombineKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  return ::attnd::gpu::GetLastError();
}

}  // namespace attnd::kernels::mla_decode::gpu
