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
ATTND_MLA_DECODE_WGMMA_INSTANCE_P(extern, 512, true)
ATTND_MLA_DECODE_WGMMA_INSTANCE_P(extern, 576, true)

namespace {

template <bool kTma, bool kPadded>
KernelShape ShapeOf(const Params& p) {
  const bool high = p.precision == Precision::kHigh;
  if (p.q.dim(3) == 576) {
    return high ? WgmmaDecodeShape<576, true, kTma, kPadded>()
                : WgmmaDecodeShape<576, false, kTma, kPadded>();
  }
  if (p.q.dim(3) == 512) {
    return high ? WgmmaDecodeShape<512, true, kTma, kPadded>()
                : WgmmaDecodeShape<512, false, kTma, kPadded>();
  }
  return KernelShape{};
}

// H a multiple of 64: the unpadded instances; H < 64 where every row of a block sees the same
// positions: the padded ones (rows past s_q · H are padding).
template <bool kTma>
KernelShape ShapeOf(const Params& p) {
  const int64_t heads = p.q.dim(2);
  if (p.kv_is_fp8()) return KernelShape{};
  if (heads % kWgmmaBlockM == 0) return ShapeOf<kTma, false>(p);
  if (heads < kWgmmaBlockM && WgmmaPpRowsShareLimit(p)) return ShapeOf<kTma, true>(p);
  return KernelShape{};
}

}  // namespace

KernelShape WgmmaShape(const Params& p) { return ShapeOf<false>(p); }

::attnd::gpu::Error LaunchMlaDecodeWgmmaWith(const Params& p, int splits, void* workspace,
                                             ::attnd::gpu::Stream stream,
                                             const DecodeLaunchOptions& options) {
  return LaunchWgmmaDecode(
      p, [&p](bool tma) { return tma ? ShapeOf<true>(p) : ShapeOf<false>(p); }, splits, workspace,
      stream, options);
}

::attnd::gpu::Error LaunchMlaDecodeWgmma(const Params& p, int splits, void* workspace,
                                         ::attnd::gpu::Stream stream) {
  return LaunchMlaDecodeWgmmaWith(p, splits, workspace, stream, DecodeLaunchOptions{});
}

::attnd::gpu::Error LaunchMlaDecodeWith(GpuKernel kernel, const Params& p, int splits,
                                        void* workspace, ::attnd::gpu::Stream stream,
                                        const DecodeLaunchOptions& options) {
  if (kernel == GpuKernel::kWgmma) {
    return LaunchMlaDecodeWgmmaWith(p, splits, workspace, stream, options);
  }
  if (kernel == GpuKernel::kWgmmaSf) {
    return LaunchMlaDecodeWgmmaSfWith(p, splits, workspace, stream, options);
  }
  return ::attnd::gpu::kErrorInvalidValue;
}

}  // namespace attnd::kernels::mla_decode::gpu

#endif  // defined(ATTND_GPU_CUDA)
