// Launcher of the Hopper sparse MLA kernel: picks the instance (d_qk, or the FP8 cache, and the
// precision), launches it with `splits` splits, then the combine when splits > 1.
#if defined(ATTND_GPU_CUDA)  // CUDA-only (sm_90a wgmma); compiles to nothing for HIP
#include <stdint.h>

#include <string>

#include "kernels/common/gpu/device_checks.h"
#include "kernels/sparse_mla/gpu/launch.h"
#include "kernels/sparse_mla/gpu/wgmma.cuh"

namespace attnd::kernels::sparse_mla::gpu {

ATTND_SPARSE_MLA_WGMMA_INSTANCE(extern, 512)
ATTND_SPARSE_MLA_WGMMA_INSTANCE(extern, 576)
ATTND_SPARSE_MLA_WGMMA_FP8_INSTANCE(extern)

KernelShape WgmmaShape(const Params& p) {
  if (p.kv_is_fp8()) return WgmmaInstanceShape<576, true>();
  return p.q.dim(2) == 576 ? WgmmaInstanceShape<576>() : WgmmaInstanceShape<512>();
}

bool WgmmaSupports(const Params& p, std::string* why) {
  ::attnd::gpu::DeviceFacts d;
  if (!CurrentDevice(&d, why)) return false;
  if (d.cc_major != 9 || d.cc_minor != 0) {
    return Refuse(why, "needs compute capability 9.0 (sm_90a wgmma), device has ", d.cc_major, ".",
                  d.cc_minor);
  }
  if (p.kv_is_fp8() && p.q.dim(2) != kFp8DimQk) {  // Validate refuses it too
    return Refuse(why, "q: dim 2 is ", p.q.dim(2), ", the FP8 cache needs ", kFp8DimQk);
  }
  const int64_t heads = p.q.dim(1);
  if (heads % 64 != 0) {
    return Refuse(why, "q: dim 1 is ", heads, ", want a multiple of 64 (heads)");
  }
  if (p.q.dim(0) * (heads / 64) > kMaxInt32) {
    return Refuse(why, "T x head blocks is ", p.q.dim(0) * (heads / 64), ", want < 2^31");
  }
  const KernelShape shape = WgmmaShape(p);
  return FitsDevice(shape.smem_bytes, shape.ctas_per_sm, d, why);
}

namespace {

// The instance of a.exact_p's precision: HIGH (P hi + lo) or FAST (bf16 P).
template <int kDqk, bool kFp8 = false>
::attnd::gpu::Error LaunchWithPrecision(const KernelArgs& a, ::attnd::gpu::Stream stream) {
  return a.exact_p ? LaunchWgmmaInstance<kDqk, true, kFp8>(a, stream)
                   : LaunchWgmmaInstance<kDqk, false, kFp8>(a, stream);
}

}  // namespace

::attnd::gpu::Error LaunchSparseMlaWgmma(const Params& p, int splits, void* workspace,
                                         ::attnd::gpu::Stream stream) {
  if (p.q.dim(0) == 0) return ::attnd::gpu::kSuccess;
  const KernelArgs a = MakeKernelArgs(p, splits, workspace);
  const ::attnd::gpu::Error e = p.kv_is_fp8()       ? LaunchWithPrecision<576, true>(a, stream)
                                : p.q.dim(2) == 576 ? LaunchWithPrecision<576>(a, stream)
                                                    : LaunchWithPrecision<512>(a, stream);
  if (e != ::attnd::gpu::kSuccess || splits == 1) return e;
  return LaunchSparseMlaCombine(p, splits, workspace, stream);
}

}  // namespace attnd::kernels::sparse_mla::gpu

#endif  // defined(ATTND_GPU_CUDA)
