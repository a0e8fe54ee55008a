// The Hopper dense MLA decode on the ping-pong body (kernels/sparse_mla/gpu/wgmma_pp.cuh):
// wgmma.cuh's row sources (PagedRows, and PagedRowsTma for whole pages by TMA), FAST precision,
// bf16 cache, d_qk 512 / 576; launched as wgmma.cu launches its kernel.
#if defined(ATTND_GPU_CUDA)  // CUDA-only (sm_90a wgmma)
#include <cuda.h>

#include <string>

#include "kernels/common/gpu/tma.h"
#include "kernels/mla_decode/gpu/launch.h"
#include "kernels/mla_decode/gpu/plan.h"
#include "kernels/mla_decode/gpu/wgmma.cuh"
#include "kernels/sparse_mla/gpu/wgmma_pp.cuh"

namespace attnd::kernels::mla_decode::gpu {
namespace {

template <int kDqk>
__global__ void __launch_bounds__(384, 1) MlaDecodeWgmmaPpKernel(const DecodeArgs a) {
  ::attnd::kernels::sparse_mla::gpu::WgmmaPingPong<kDqk, PaddedRows<PagedRows>>(a);
}
template <int kDqk>
__global__ void __launch_bounds__(384, 1)
    MlaDecodeWgmmaPpTmaKernel(const DecodeArgs a, const __grid_constant__ CUtensorMap kv_map) {
  ::attnd::kernels::sparse_mla::gpu::WgmmaPingPong<kDqk, PaddedRows<PagedRowsTma>>(a, &kv_map);
}

template <int kDqk, bool kTma>
KernelShape PpShape() {
  return WgmmaKernelShape<::attnd::kernels::sparse_mla::gpu::WgmmaPpTile<kDqk>>(
      kTma ? reinterpret_cast<const void*>(&MlaDecodeWgmmaPpTmaKernel<kDqk>)
           : reinterpret_cast<const void*>(&MlaDecodeWgmmaPpKernel<kDqk>));
}

template <bool kTma>
KernelShape ShapeOf(const Params& p) {
  const int64_t heads = p.q.dim(2);
  if (p.kv_is_fp8() || p.precision != Precision::kFast ||
      (heads % kWgmmaBlockM != 0 && !(heads < kWgmmaBlockM && WgmmaPpRowsShareLimit(p)))) {
    return KernelShape{};
  }
  if (p.q.dim(3) == 576) return PpShape<576, kTma>();
  if (p.q.dim(3) == 512) return PpShape<512, kTma>();
  return KernelShape{};
}

}  // namespace

KernelShape WgmmaPpShape(const Params& p) { return ShapeOf<false>(p); }

::attnd::gpu::Error LaunchMlaDecodeWgmmaPp(const Params& p, int splits, void* workspace,
                                           ::attnd::gpu::Stream stream) {
  return LaunchWgmmaDecode(
      p, [&p](bool tma) { return tma ? ShapeOf<true>(p) : ShapeOf<false>(p); }, splits, workspace,
      stream);
}

}  // namespace attnd::kernels::mla_decode::gpu

#endif  // defined(ATTND_GPU_CUDA)
