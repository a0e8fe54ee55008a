// Launcher of the self-fed Hopper dense MLA decode (wgmma_sf.cuh; `cuda_wgmma_sf`): FAST, bf16
// cache of page size 64 that the driver maps as a tensor map, d_qk 512 / 576, H a multiple of 64
// or below 64 where the rows of a block share their positions (padded to 64).
#if defined(ATTND_GPU_CUDA)  // CUDA-only (sm_90a wgmma, TMA)
#include <cuda.h>

#include <string>

#include "kernels/mla_decode/gpu/launch.h"
#include "kernels/mla_decode/gpu/plan.h"
#include "kernels/mla_decode/gpu/wgmma.cuh"
#include "kernels/mla_decode/gpu/wgmma_sf.cuh"

namespace attnd::kernels::mla_decode::gpu {
namespace {

template <int kDqk>
KernelShape SfShape() {
  return WgmmaKernelShape<WgmmaSfTile<kDqk>>(
      reinterpret_cast<const void*>(&MlaDecodeWgmmaSfKernel<kDqk>));
}

}  // namespace

KernelShape WgmmaSfShape(const Params& p) {
  const int64_t heads = p.q.dim(2);
  if (p.kv_is_fp8() || p.precision != Precision::kFast || p.kv_cache.dim(1) != 64 ||
      (heads % kWgmmaBlockM != 0 && !(heads < kWgmmaBlockM && WgmmaPpRowsShareLimit(p)))) {
    return KernelShape{};
  }
  if (p.q.dim(3) == 576) return SfShape<576>();
  if (p.q.dim(3) == 512) return SfShape<512>();
  return KernelShape{};
}

bool WgmmaSfMapsKv(const Params& p, std::string* why) {
  CUtensorMap map;
  if (EncodeWgmmaKvMap(p, &map)) return true;
  return Refuse(why,
                "kv_cache: no TMA tensor map of it (the columns contiguous, slot and page strides "
                "positive multiples of 16 bytes, the driver's limits)");
}

::attnd::gpu::Error LaunchMlaDecodeWgmmaSfWith(const Params& p, int splits, void* workspace,
                                               ::attnd::gpu::Stream stream,
                                               const DecodeLaunchOptions& options) {
  CUtensorMap map;
  if (!EncodeWgmmaKvMap(p, &map)) return ::attnd::gpu::kErrorInvalidValue;
  return LaunchDecode(p, WgmmaSfShape(p), splits, workspace, stream, &map, options);
}

::attnd::gpu::Error LaunchMlaDecodeWgmmaSf(const Params& p, int splits, void* workspace,
                                           ::attnd::gpu::Stream stream) {
  return LaunchMlaDecodeWgmmaSfWith(p, splits, workspace, stream, DecodeLaunchOptions{});
}

}  // namespace attnd::kernels::mla_decode::gpu

#endif  // defined(ATTND_GPU_CUDA)
