// Launcher of the Hopper dense MLA decode kernel (wgmma.cuh): picks the instance (d_qk and the
// precision) and runs it with `splits` splits, then the combine when split.
#if defined(ATTND_GPU_CUDA)  // CUDA-only (sm_90a wgmma)
#include <string>

#include "kernels/mla_decode/gpu/launch.h"
#include "kernels/mla_decode/gpu/plan.h"
#include "kernels/mla_decode/gpu/wgmma.cuh"

namespace attnd::kernels::mla_decode::gpu {

ATTND_MLA_DECODE_WGMMA_INSTANCE(extern, 512)
ATTND_MLA_DECODE_WGMMA_INSTANCE(extern, 576)

namespace {

template <bool kTma>
KernelShape ShapeOf(const Params& p) {
  if (p.kv_is_fp8() || p.q.dim(2) % kWgmmaBlockM != 0) return KernelShape{};
  const bool high = p.precision == Precision::kHigh;
  if (p.q.dim(3) == 576) {
    return high ? WgmmaDecodeShape<576, true, kTma>() : WgmmaDecodeShape<576, false, kTma>();
  }
  if (p.q.dim(3) == 512) {
    return high ? WgmmaDecodeShape<512, true, kTma>() : WgmmaDecodeShape<512, false, kTma>();
  }
  return KernelShape{};
}

}  // namespace

KernelShape WgmmaShape(const Params& p) { return ShapeOf<false>(p); }

::attnd::gpu::Error LaunchMlaDecodeWgmma(const Params& p, int splits, void* workspace,
                                         ::attnd::gpu::Stream stream) {
  return LaunchWgmmaDecode(
      p, [&p](bool tma) { return tma ? ShapeOf<true>(p) : ShapeOf<false>(p); }, splits, workspace,
      stream);
}

}  // namespace attnd::kernels::mla_decode::gpu

#endif  // defined(ATTND_GPU_CUDA)
