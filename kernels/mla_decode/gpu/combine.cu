// Split-K combine of the MLA decode (portable CUDA/HIP): 128 threads per query row, 4 of the
// 512 columns each. Split s left O_s (already divided by its own sum) and lse_s in log2 units
// (-inf: it saw nothing; its O_s was never written and is not read). With M = max_s lse_s and
// w_s = exp2(lse_s - M): out = Σ w_s·O_s / Σ w_s, lse = (M + log2 Σ w_s)·ln 2; every split
// empty → out 0, lse -inf.
#include <math.h>
#include <stdint.h>

#include <algorithm>

#include "kernels/common/gpu/convert.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/mla_decode/gpu/common.cuh"
#include "kernels/mla_decode/gpu/plan.h"

namespace attnd::kernels::mla_decode::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = kDimV / 4;  // threads per row, 4 columns each
constexpr int kRowsPerBlock = kThreads / kRowThreads;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride beyond this

__global__ void __launch_bounds__(kThreads) MlaDecodeCombineKernel(const DecodeArgs a) {
  const int col = (threadIdx.x % kRowThreads) * 4;
  const int64_t total = static_cast<int64_t>(a.batch) * a.rows;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
       r < total; r += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t b = r / a.rows;
    const int32_t row = static_cast<int32_t>(r % a.rows);
    float max_lse = -INFINITY;
    for (int s = 0; s < a.splits; ++s) {
      max_lse = fmaxf(max_lse, a.partial_lse[PartialRow(a, s, b, row)]);
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float sum = 0.0f;
    if (max_lse != -INFINITY) {
      for (int s = 0; s < a.splits; ++s) {
        const int64_t at = PartialRow(a, s, b, row);
        const float lse_s = a.partial_lse[at];
        if (lse_s == -INFINITY) continue;
        const float w = exp2f(lse_s - max_lse);
        sum += w;
        const float4 o = *reinterpret_cast<const float4*>(a.partial_o + at * kDimV + col);
        acc[0] = fmaf(w, o.x, acc[0]);
        acc[1] = fmaf(w, o.y, acc[1]);
        acc[2] = fmaf(w, o.z, acc[2]);
        acc[3] = fmaf(w, o.w, acc[3]);
      }
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    uint16_t* out = OutRow(a, b, row) + col;
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = ::attnd::gpu::FloatToBf16(acc[i] * inv);
    if (col == 0 && a.lse != nullptr) {
      *LseAt(a, b, row) = sum > 0.0f ? (max_lse + log2f(sum)) * kLn2 : -INFINITY;
    }
  }
}

}  // namespace

::attnd::gpu::Error LaunchMlaDecodeCombine(const DecodeArgs& a, ::attnd::gpu::Stream stream) {
  const int64_t rows = static_cast<int64_t>(a.batch) * a.rows;
  if (rows == 0) return ::attnd::gpu::kSuccess;
  const int64_t blocks = std::min(CeilDiv(rows, kRowsPerBlock), kMaxBlocks);
  MlaDecodeCombineKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  return ::attnd::gpu::GetLastError();
}

}  // namespace attnd::kernels::mla_decode::gpu
