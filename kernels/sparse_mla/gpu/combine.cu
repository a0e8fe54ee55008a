// Split-K combine for sparse MLA (portable CUDA/HIP): a 128-thread block per (token, head) row,
// 4 of the 512 columns per thread. Partial LSEs are log2; weights exp2(lse_i - max) over the
// non-empty splits (an empty split, lse -inf, is never read); all empty: out 0, lse -inf.
#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/convert.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/sparse_mla/gpu/common.cuh"
#include "kernels/sparse_mla/gpu/launch.h"
#include "kernels/sparse_mla/gpu/plan.h"

namespace attnd::kernels::sparse_mla::gpu {
namespace {

constexpr int kCombineThreads = kDimV / 4;

__global__ void __launch_bounds__(kCombineThreads) SparseMlaCombineKernel(const KernelArgs a) {
  if (GateClosed(a)) return;       // its kernel was not chosen for this call (common.cuh)
  const int64_t row = blockIdx.x;  // t·H + h
  const int64_t t = row / a.heads, h = row % a.heads;
  const int col = 4 * threadIdx.x;

  float max_lse = -INFINITY;
  for (int s = 0; s < a.splits; ++s)
    max_lse = fmaxf(max_lse, a.partial_lse[PartialRow(a, s, t, h)]);

  float sum = 0.0f;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (max_lse > -INFINITY) {
    for (int s = 0; s < a.splits; ++s) {
      const float lse = a.partial_lse[PartialRow(a, s, t, h)];
      if (!(lse > -INFINITY)) continue;  // empty split: its partial O was never written
      const float w = exp2f(lse - max_lse);
      const float4 o =
          *reinterpret_cast<const float4*>(a.partial_o + PartialRow(a, s, t, h) * kDimV + col);
      sum += w;
      acc[0] = fmaf(w, o.x, acc[0]);
      acc[1] = fmaf(w, o.y, acc[1]);
      acc[2] = fmaf(w, o.z, acc[2]);
      acc[3] = fmaf(w, o.w, acc[3]);
    }
  }
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
  KernelArgs a = MakeKernelArgs(p, splits, const_cast<void*>(workspace));
  a.gate = gate;
  a.gate_open = gate_open;
  SparseMlaCombineKernel<<<static_cast<unsigned>(rows), kCombineThreads, 0, stream>>>(a);
  return ::attnd::gpu::GetLastError();
}

}  // namespace attnd::kernels::sparse_mla::gpu
