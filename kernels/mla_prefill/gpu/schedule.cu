// The MLA prefill schedule kernel (portable CUDA/HIP), run before the attention kernel:
//   block 0      tile_start[b] = Σ_{b' < b} ceil(Lq_b' / block_m) for b in [0, B] (a block-wide
//                scan over the sequences, kThreads at a time), from the clamped cu_seqlens_q;
//                the work counter set to 0;
//   blocks 1..   out 0 and lse -inf for the rows past the last sequence (clamped
//                cu_seqlens_q[B] .. total_q), as the CPU implementation writes them.
#include <math.h>
#include <stdint.h>

#include <algorithm>

#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/mla_prefill/gpu/common.cuh"
#include "kernels/mla_prefill/gpu/plan.h"

namespace attnd::kernels::mla_prefill::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxFillBlocks = 512;

__device__ void ScanTiles(const PrefillArgs& a) {
  __shared__ int64_t part[kThreads];
  const int tid = threadIdx.x;
  int64_t carry = 0;
  for (int64_t base = 0; base < a.batch; base += kThreads) {
    const int64_t b = base + tid;
    int64_t tiles = 0;
    if (b < a.batch) {
      const SeqRange s = SequenceRange(a, b);
      tiles = (s.lq + a.block_m - 1) / a.block_m;
    }
    part[tid] = tiles;
    __syncthreads();
    for (int offset = 1; offset < kThreads; offset *= 2) {  // inclusive Hillis-Steele scan
      const int64_t x = tid >= offset ? part[tid - offset] : 0;
      __syncthreads();
      part[tid] += x;
      __syncthreads();
    }
    if (b < a.batch) a.tile_start[b] = carry + part[tid] - tiles;
    carry += part[kThreads - 1];
    __syncthreads();  // everyone read part before the next chunk overwrites it
  }
  if (tid == 0) {
    a.tile_start[a.batch] = carry;
    *a.work_counter = 0;  // the wgmma kernel's CTAs take their items from it
  }
}

__device__ void FillUncoveredRows(const PrefillArgs& a, int64_t worker, int64_t workers) {
  const int64_t covered =
      Min64(Max64(a.cu_q[static_cast<int64_t>(a.batch) * a.cu_q_stride], 0), a.total_q);
  const int64_t pairs = (a.total_q - covered) * a.heads;
  for (int64_t i = worker; i < pairs; i += workers) {
    WriteEmptyRows(a, covered + i / a.heads, 1, i % a.heads);
  }
}

__global__ void __launch_bounds__(kThreads) PrefillScheduleKernel(const PrefillArgs a) {
  if (blockIdx.x == 0) {
    ScanTiles(a);
  } else {
    FillUncoveredRows(a, blockIdx.x - 1, gridDim.x - 1);
  }
}

}  // namespace

::attnd::gpu::Error LaunchPrefillSchedule(const PrefillArgs& a, ::attnd::gpu::Stream stream) {
  const int64_t fill_blocks = std::min<int64_t>(a.total_q * a.heads, kMaxFillBlocks);
  PrefillScheduleKernel<<<static_cast<unsigned>(1 + std::max<int64_t>(fill_blocks, 1)), kThreads, 0,
                          stream>>>(a);
  return ::attnd::gpu::GetLastError();
}

}  // namespace attnd::kernels::mla_prefill::gpu
