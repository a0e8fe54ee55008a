// Launcher and instances of the ping-pong Hopper sparse MLA kernel (wgmma_pp.cuh): FAST
// precision, bf16 cache, d_qk 512 or 576; then the combine when splits > 1.
#if defined(ATTND_GPU_CUDA)  // CUDA-only (sm_90a wgmma); compiles to nothing for HIP
#include <stdint.h>

#include <string>

#include "kernels/common/gpu/device_checks.h"
#include "kernels/sparse_mla/gpu/launch.h"
#include "kernels/sparse_mla/gpu/wgmma_pp.cuh"

namespace attnd::kernels::sparse_mla::gpu {

KernelShape WgmmaPpShape(const Params& p) {
  return p.q.dim(2) == 576 ? WgmmaPpInstanceShape<576>() : WgmmaPpInstanceShape<512>();
}

bool WgmmaPpSupports(const Params& p, std::string* why) {
  if (p.precision != Precision::kFast) {
    return Refuse(why, "precision HIGH runs on cuda_wgmma (this kernel rounds P to bf16 once)");
  }
  if (p.kv_is_fp8()) return Refuse(why, "the FP8 cache runs on cuda_wgmma");
  if (!WgmmaSupports(p, why)) return false;  // device, heads, T x head blocks, the FP8 layouts
  ::attnd::gpu::DeviceFacts d;
  if (!CurrentDevice(&d, why)) return false;
  const KernelShape shape = WgmmaPpShape(p);
  return FitsDevice(shape.smem_bytes, shape.ctas_per_sm, d, why);
}

::attnd::gpu::Error LaunchSparseMlaWgmmaPp(const Params& p, int splits, void* workspace,
                                           ::attnd::gpu::Stream stream, int keep_kv_in_l2) {
  if (p.q.dim(0) == 0) return ::attnd::gpu::kSuccess;
  KernelArgs a = MakeKernelArgs(p, splits, workspace);
  if (keep_kv_in_l2 >= 0) a.keep_kv_in_l2 = keep_kv_in_l2 != 0;
  const ::attnd::gpu::Error e = p.q.dim(2) == 576 ? LaunchWgmmaPpInstance<576>(a, stream)
                                                  : LaunchWgmmaPpInstance<512>(a, stream);
  if (e != ::attnd::gpu::kSuccess || splits == 1) return e;
  return LaunchSparseMlaCombine(p, splits, workspace, stream);
}

}  // namespace attnd::kernels::sparse_mla::gpu

#endif  // defined(ATTND_GPU_CUDA)
