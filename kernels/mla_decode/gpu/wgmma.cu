// Launcher of the Hopper dense MLA decode kernel (wgmma.cuh): picks the instance (d_qk and the
// precision) and runs it with `splits` splits, then the combine when split.
#if defined(ATTND_GPU_CUDA)  // CUDA-only (sm_90a wgmma)
#include "kernels/mla_decode/gpu/launch.h"
#include "kernels/mla_decode/gpu/plan.h"
#include "kernels/mla_decode/gpu/wgmma.cuh"

namespace attnd::kernels::mla_decode::gpu {

ATTND_MLA_DECODE_WGMMA_INSTANCE(extern, 512)
ATTND_MLA_DECODE_WGMMA_INSTANCE(extern, 576)

KernelShape WgmmaShape(const Params& p) {
  if (p.kv_is_fp8() || p.q.dim(2) % kWgmmaBlockM != 0) return KernelShape{};
  const bool high = p.precision == Precision::kHigh;
  if (p.q.dim(3) == 576)
    return high ? WgmmaDecodeShape<576, true>() : WgmmaDecodeShape<576, false>();
  if (p.q.dim(3) == 512)
    return high ? WgmmaDecodeShape<512, true>() : WgmmaDecodeShape<512, false>();
  return KernelShape{};
}

::attnd::gpu::Error LaunchMlaDecodeWgmma(const Params& p, int splits, void* workspace,
                                         ::attnd::gpu::Stream stream) {
  return LaunchDecode(p, WgmmaShape(p), splits, workspace, stream);
}

}  // namespace attnd::kernels::mla_decode::gpu

#endif  // defined(ATTND_GPU_CUDA)
