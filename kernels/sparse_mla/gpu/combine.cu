// Split-K combine for sparse MLA (portable CUDA/HIP): a 128-thread block per (token, head) row,
// 4 of the 512 columns per thread. The merge of a row is the shared one (kernels/common/gpu/
// attention/combine.cuh, mla_decode's too: every split's LSE loaded at once, the live partial
// rows kLoadBatch at a time; an empty split, lse -inf, is never read; all empty: out 0, lse
// -inf; docs/KERNELS.md "Split-K and the combine").
#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/attention/combine.cuh"
#include "kernels/common/gpu/convert.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/sparse_mla/gpu/common.cuh"
#include "kernels/sparse_mla/gpu/launch.h"
#include "kernels/sparse_mla/gpu/plan.h"

namespace attnd::kernels::sparse_mla::gpu {
namespace {

constexpr int kCombineThreads = kDimV / 4;
constexpr int kLoadBatch = 16;  // partial rows whose loads are in flight together

// At most 4 blocks per SM, as mla_decode's combine: up to 128 registers, so that ptxas keeps
// kLoadBatch loads in flight (without the bound it chose 72 and two loads at a time).
__global__ void __launch_bounds__(kCombineThreads, 4) SparseMlaCombineKernel(const KernelArgs a) {
  __shared__ float weight_s[kMaxSplits];            // w_s, 0 for an empty split
  __shared__ float red_s[2][kCombineThreads / 32];  // per-group max, then per-group sum
  __shared__ uint32_t live_s[4];                    // bit s % 32 of word s / 32: w_s != 0
  if (GateClosed(a)) return;       // its kernel was not chosen for this call (common.cuh)
  const int64_t row = blockIdx.x;  // t·H + h
  const int64_t t = row / a.heads, h = row % a.heads;
  const int col = 4 * threadIdx.x;
  // Split s of row (t, h) is partial row PartialRow(a, s, t, h) = that of split 0 + s·T·H.
  float acc[4], sum, max_lse;
  SplitCombineRow<kCombineThreads, kDimV, kLoadBatch, kMaxSplits>(
      a.partial_lse, a.partial_o, PartialRow(a, 0, t, h), static_cast<int64_t>(a.tokens) * a.heads,
      a.splits, weight_s, red_s, live_s, acc, &sum, &max_lse);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  uint32_t* dst =
      reinterpret_cast<uint32_t*>(a.out + t * a.out_stride_t + h * a.out_stride_h + col);
  dst[0] = static_cast<uint32_t>(::attnd::gpu::FloatToBf16(acc[0] * inv)) |
           (static_cast<uint32_t>(::attnd::gpu::FloatToBf16(acc[1] * inv)) << 16);
  dst[1] = static_cast<uint32_t>(::attnd::gpu::FloatToBf16(acc[2] * inv)) |
           (static_cast<uint32_t>(::attnd::gpu::FloatToBf16(acc[3] * inv)) << 16);
  if (threadIdx.x == 0 && a.lse != nullptr) {
    a.lse[t * a.lse_stride_t + h * a.lse_stride_h] =
        sum > 0.0f ? (max_lse + log2f(sum)) * kLn2 : -INFINITY;
  }
}

}  // namespace

::attnd::gpu::Error LaunchSparseMlaCombine(const Params& p, int splits, const void* workspace,
                                           ::attnd::gpu::Stream stream, const int32_t* gate,
                                           int32_t gate_open) {
  const int64_t rows = p.q.dim(0) * p.q.dim(1);
  if (rows == 0) return ::attnd::gpu::kSuccess;
  // The merge stages one weight per split (kMaxSplits) and loads one LSE per thread.
  if (splits < 1 || splits > kMaxSplits) return ::attnd::gpu::kErrorInvalidValue;
  KernelArgs a = MakeKernelArgs(p, splits, const_cast<void*>(workspace));
  a.gate = gate;
  a.gate_open = gate_open;
  SparseMlaCombineKernel<<<static_cast<unsigned>(rows), kCombineThreads, 0, stream>>>(a);
  return ::attnd::gpu::GetLastError();
}

}  // namespace attnd::kernels::sparse_mla::gpu
