// Split-K combine of the MLA decode (portable CUDA/HIP): one 128-thread block per query row, 4 of
// the 512 columns per thread. Split s left O_s (already divided by its own sum) and lse_s in log2
// units (-inf: it saw nothing; its O_s was never written and is not read). With M = max_s lse_s
// and w_s = exp2(lse_s - M): out = Σ w_s·O_s / Σ w_s, lse = (M + log2 Σ w_s)·ln 2; every split
// empty → out 0, lse -inf.
// Built for latency (decode at small batch runs few rows over many splits): thread s loads
// lse_s, so every split's LSE is one load in flight at once; the weights go through shared
// memory, and the partial rows are read kLoadBatch splits at a time with no load waiting on
// another (docs/KERNELS.md "Split-K and the combine").
#include <math.h>
#include <stdint.h>

#include <algorithm>

#include "kernels/common/gpu/attention.cuh"
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
static_assert(kMaxSplits <= kThreads, "one split's LSE per thread");

// The value of every 32-lane group reduced over the block (max or sum), through red_s.
template <bool kMax>
__device__ __forceinline__ float BlockReduce(float v, float* red_s) {
  v = kMax ? GroupMax<32>(v) : GroupSum<32>(v);
  if (threadIdx.x % 32 == 0) red_s[threadIdx.x / 32] = v;
  __syncthreads();
  v = red_s[0];
#pragma unroll
  for (int g = 1; g < kGroups; ++g) v = kMax ? fmaxf(v, red_s[g]) : v + red_s[g];
  return v;
}

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
    if (tid < 4) live_s[tid] = 0;  // published by the reductions' barriers
    // Thread s holds lse_s; the row max M (-inf when every split is empty).
    const float lse = tid < splits ? a.partial_lse[at0 + tid * split_rows] : -INFINITY;
    const float max_lse = BlockReduce<true>(lse, red_s[0]);
    const float w = max_lse == -INFINITY || lse == -INFINITY ? 0.0f : exp2f(lse - max_lse);
    if (tid < splits) {
      weight_s[tid] = w;
      if (w != 0.0f) atomicOr(&live_s[tid / 32], 1u << (tid % 32));
    }
    const float sum = BlockReduce<false>(w, red_s[1]);  // its barrier publishes weight_s, live_s
    // Σ w_s·O_s over the splits with w_s != 0 (empty ones are never read). Which splits to read
    // comes from registers (the live bits, shifted down kLoadBatch per step), so that no load
    // waits on a shared-memory read and all kLoadBatch are issued before the first use.
    static_assert(kMaxSplits <= 128 && kLoadBatch <= 32, "live bits in two 64-bit words");
    uint64_t live_lo = live_s[0] | static_cast<uint64_t>(live_s[1]) << 32;
    uint64_t live_hi = live_s[2] | static_cast<uint64_t>(live_s[3]) << 32;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const float* o_row = a.partial_o + at0 * kDimV + col;
    for (int s0 = 0; s0 < splits; s0 += kLoadBatch) {
      const uint32_t bits = static_cast<uint32_t>(live_lo) & ((1u << kLoadBatch) - 1);
      live_lo = live_lo >> kLoadBatch | live_hi << (64 - kLoadBatch);
      live_hi >>= kLoadBatch;
      float4 o[kLoadBatch];
#pragma unroll
      for (int i = 0; i < kLoadBatch; ++i) {
        o[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if ((bits >> i) & 1u) {
          o[i] = *reinterpret_cast<const float4*>(o_row + (s0 + i) * split_rows * kDimV);
        }
      }
#pragma unroll
      for (int i = 0; i < kLoadBatch; ++i) {
        const float ws = (bits >> i) & 1u ? weight_s[s0 + i] : 0.0f;
        acc[0] = fmaf(ws, o[i].x, acc[0]);
        acc[1] = fmaf(ws, o[i].y, acc[1]);
        acc[2] = fmaf(ws, o[i].z, acc[2]);
        acc[3] = fmaf(ws, o[i].w, acc[3]);
      }
    }
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
