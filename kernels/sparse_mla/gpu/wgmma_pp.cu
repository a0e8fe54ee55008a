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

// GpuSupports' common checks (alignment, the FP8 layouts) ran before this.
bool WgmmaPpSupports(const Params& p, std::string* why) {
  if (p.precision != Precision::kFast) {
    return Refuse(why, "precision HIGH runs on cuda_wgmma (this kernel rounds P to bf16 once)");
  }
  if (p.kv_is_fp8()) return Refuse(why, "the FP8 cache runs on cuda_wgmma");
  ::attnd::gpu::DeviceFacts d;
  if (!CurrentDevice(&d, why)) return false;
  if (d.cc_major != 9 || d.cc_minor != 0) {
    return Refuse(why, "needs compute capability 9.0 (sm_90a wgmma), device has ", d.cc_major, ".",
                  d.cc_minor);
  }
  const int64_t heads = p.q.dim(1);
  if (heads > 64 && heads % 64 != 0) {
    return Refuse(why, "q: dim 1 is ", heads, ", want a multiple of 64 or at most 64 (heads)");
  }
  const int64_t groups = heads >= 64 ? heads / 64 : 1;
  if (p.q.dim(0) * groups > kMaxInt32) {
    return Refuse(why, "T x head blocks is ", p.q.dim(0) * groups, ", want < 2^31");
  }
  const KernelShape shape = WgmmaPpShape(p);
  return FitsDevice(shape.smem_bytes, shape.ctas_per_sm, d, why);
}

::attnd::gpu::Error LaunchSparseMlaWgmmaPp(const Params& p, int splits, void* workspace,
                                           ::attnd::gpu::Stream stream, const int32_t* gate,
                                           int32_t gate_open) {
  if (p.q.dim(0) == 0) return ::attnd::gpu::kSuccess;
  KernelArgs a = MakeKernelArgs(p, splits, workspace);
  a.gate = gate;
  a.gate_open = gate_open;
  const ::attnd::gpu::Error e = p.q.dim(2) == 576 ? LaunchWgmmaPpInstance<576>(a, stream)
                                                  : LaunchWgmmaPpInstance<512>(a, stream);
  if (e != ::attnd::gpu::kSuccess || splits == 1) return e;
  return LaunchSparseMlaCombine(p, splits, workspace, stream, gate, gate_open);
}

}  // namespace attnd::kernels::sparse_mla::gpu

#endif  // defined(ATTND_GPU_CUDA)
