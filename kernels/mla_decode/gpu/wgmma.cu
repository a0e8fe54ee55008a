// Launcher of the Hopper dense MLA decode kernel (wgmma.cuh): picks the instance (d_qk and the
// precision) and runs it with `splits` splits, then the combine when split.
#if defined(ATTND_GPU_CUDA)  // CUDA-only (sm_90a wgmma)
#include <string>

#include "kernels/common/gpu/tma.h"
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

// The cache as a tensor map for PagedRowsTma (wgmma.cuh): page size 64, fewer than 2^31 pages
// (the kernel's page coordinate is an int32), bf16 [num_pages][64][d_qk] with the innermost
// dimension dense; the strides (bytes) multiples of 16, which GpuSupports' alignment rules
// already give. False (the cp.async kernel runs) when any of that fails or the driver refuses.
bool EncodeKvMap(const Params& p, CUtensorMap* map) {
  const Tensor& kv = p.kv_cache;
  if (kv.dim(1) != 64 || kv.dim(0) < 1 || kv.dim(0) > int64_t{0x7fffffff} || kv.stride(2) != 1) {
    return false;
  }
  const uint64_t slot_bytes = static_cast<uint64_t>(kv.stride(1)) * 2;
  const uint64_t page_bytes = static_cast<uint64_t>(kv.stride(0)) * 2;
  if (kv.stride(1) <= 0 || kv.stride(0) <= 0 || slot_bytes % 16 != 0 || page_bytes % 16 != 0) {
    return false;
  }
  std::string why;
  return ::attnd::gpu::EncodeBf16Map3d(
      map, kv.data, {static_cast<uint64_t>(kv.dim(2)), 64, static_cast<uint64_t>(kv.dim(0))},
      {slot_bytes, page_bytes}, {64, 64, 1}, &why);
}

}  // namespace

KernelShape WgmmaShape(const Params& p) { return ShapeOf<false>(p); }

::attnd::gpu::Error LaunchMlaDecodeWgmma(const Params& p, int splits, void* workspace,
                                         ::attnd::gpu::Stream stream) {
  CUtensorMap map;
  if (EncodeKvMap(p, &map)) {
    return LaunchDecode(p, ShapeOf<true>(p), splits, workspace, stream, &map);
  }
  return LaunchDecode(p, ShapeOf<false>(p), splits, workspace, stream);
}

}  // namespace attnd::kernels::mla_decode::gpu

#endif  // defined(ATTND_GPU_CUDA)
