// Host side of the MLA prefill GPU path: what each kernel supports, its workspace, the kernels'
// argument block and the launch sequence (schedule, then attention). Portable CUDA/HIP.
#include <stdint.h>

#include <string>

#include "kernels/common/gpu/device_checks.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/mla_prefill/gpu/launch.h"
#include "kernels/mla_prefill/gpu/plan.h"

namespace attnd::kernels::mla_prefill::gpu {
namespace {

KernelShape ShapeOf(GpuKernel kernel, const Params& p) {
#if defined(ATTND_GPU_CUDA)
  if (kernel == GpuKernel::kMma) return MmaShape(p);
  if (kernel == GpuKernel::kWgmma) return WgmmaShape(p);
#endif
  if (kernel == GpuKernel::kSimt) return SimtShape(p);
  return KernelShape{};
}

}  // namespace

KernelShape MakeKernelShape(const void* kernel, int block_m, int threads, int smem_bytes) {
  KernelShape s;
  s.kernel = kernel;
  s.block_m = block_m;
  s.threads = threads;
  s.smem_bytes = smem_bytes;
  s.blocks_per_sm = ::attnd::gpu::BlocksPerSm(kernel, threads, smem_bytes);
  return s;
}

bool TensorCoreOperandsAligned(const Params& p, std::string* why) {
  for (const auto& [name, t] :
       {std::pair<const char*, const Tensor*>{"q", &p.q}, {"k", &p.k}, {"v", &p.v}}) {
    if (!Bf16RowsAligned16(*t)) {
      return Refuse(why, name,
                    ": needs 16-byte alignment (base and leading strides multiples of 8)");
    }
  }
  if (!Aligned(p.out.data, 4) || !StridesMultipleOf(p.out, 2)) {
    return Refuse(why, "out: needs 4-byte alignment (base and leading strides even)");
  }
  return true;
}

int64_t SlotsPerHead(const Params& p, int block_m) {
  return CeilDiv(p.q.dim(0), block_m) + (p.cu_seqlens_q.dim(0) - 1);
}

PrefillArgs MakePrefillArgs(const Params& p, int block_m, void* workspace) {
  PrefillArgs a{};
  a.q = p.q.ptr<const uint16_t>();
  a.q_stride_t = p.q.stride(0);
  a.q_stride_h = p.q.stride(1);
  a.k = p.k.ptr<const uint16_t>();
  a.k_stride_t = p.k.stride(0);
  a.k_stride_h = p.k.stride(1);
  a.v = p.v.ptr<const uint16_t>();
  a.v_stride_t = p.v.stride(0);
  a.v_stride_h = p.v.stride(1);
  a.cu_q = p.cu_seqlens_q.ptr<const int32_t>();
  a.cu_q_stride = p.cu_seqlens_q.stride(0);
  a.cu_k = p.cu_seqlens_k.ptr<const int32_t>();
  a.cu_k_stride = p.cu_seqlens_k.stride(0);
  a.out = p.out.ptr<uint16_t>();
  a.out_stride_t = p.out.stride(0);
  a.out_stride_h = p.out.stride(1);
  if (p.lse.present()) {
    a.lse = p.lse.ptr<float>();
    a.lse_stride_t = p.lse.stride(0);
    a.lse_stride_h = p.lse.stride(1);
  }
  a.tile_start = static_cast<int64_t*>(workspace);
  a.work_counter = a.tile_start + p.cu_seqlens_q.dim(0);
  a.total_q = p.q.dim(0);
  a.total_k = p.k.dim(0);
  a.slots = SlotsPerHead(p, block_m);
  a.batch = static_cast<int32_t>(p.cu_seqlens_q.dim(0) - 1);
  a.heads = static_cast<int32_t>(p.q.dim(1));
  a.group = static_cast<int32_t>(p.q.dim(1) / p.k.dim(1));
  a.d_qk = static_cast<int32_t>(p.q.dim(2));
  a.d_v = static_cast<int32_t>(p.v.dim(2));
  a.block_m = block_m;
  a.head_group = 1;
  a.causal = p.causal ? 1 : 0;
  a.scale_log2 = p.sm_scale * kLog2e;
  a.exact_p = p.precision == Precision::kHigh;
  return a;
}

bool GpuSupports(GpuKernel kernel, const Params& p, std::string* why) {
  ::attnd::gpu::DeviceFacts d;
  if (!CurrentDevice(&d, why)) return false;
  const int64_t batch = p.cu_seqlens_q.dim(0) - 1;
  if (batch >= kMaxInt32) return Refuse(why, "cu_seqlens_q: batch ", batch, " >= 2^31");
  if (p.q.dim(1) >= kMaxInt32) return Refuse(why, "q: heads ", p.q.dim(1), " >= 2^31");
  if (kernel == GpuKernel::kWgmma) {
#if defined(ATTND_GPU_CUDA)
    if (!WgmmaSupports(p, why)) return false;
#else
    return Refuse(why, "the wgmma kernel is CUDA-only");
#endif
  }
  if (kernel == GpuKernel::kMma && (!RunsMmaSync(d, why) || !TensorCoreOperandsAligned(p, why))) {
    return false;
  }
  const KernelShape shape = ShapeOf(kernel, p);
  if (shape.kernel == nullptr) {
    return Refuse(why, "no kernel instance for d_qk ", p.q.dim(2), ", d_v ", p.v.dim(2));
  }
  if (!FitsDevice(shape.smem_bytes, shape.blocks_per_sm, d, why)) return false;
  const int64_t slots = SlotsPerHead(p, shape.block_m);
  if (slots > kMaxInt32 / p.q.dim(1)) {
    return Refuse(why, "(query tiles + B) x H is ", slots, " x ", p.q.dim(1), ", want < 2^31");
  }
  return true;
}

int64_t WorkspaceBytes(const Params& p) {
  return 8 * (p.cu_seqlens_q.dim(0) + 1);  // int64 per entry of cu_seqlens_q (B + 1), a counter
}

::attnd::gpu::Error LaunchPrefill(const Params& p, const KernelShape& shape, void* workspace,
                                  ::attnd::gpu::Stream stream) {
  if (shape.kernel == nullptr || shape.blocks_per_sm < 1) return ::attnd::gpu::kErrorInvalidValue;
  if (p.q.dim(0) == 0) return ::attnd::gpu::kSuccess;  // no query row: nothing to write
  if (workspace == nullptr || !Aligned(workspace, 8)) return ::attnd::gpu::kErrorInvalidValue;
  const int64_t grid = SlotsPerHead(p, shape.block_m) * p.q.dim(1);
  if (grid > kMaxInt32) return ::attnd::gpu::kErrorInvalidValue;
  PrefillArgs a = MakePrefillArgs(p, shape.block_m, workspace);
  ::attnd::gpu::Error e = LaunchPrefillSchedule(a, stream);
  if (e != ::attnd::gpu::kSuccess) return e;
  void* args[] = {&a};
  return ::attnd::gpu::LaunchKernel(shape.kernel, dim3(static_cast<unsigned>(grid)),
                                    dim3(shape.threads), args, shape.smem_bytes, stream);
}

}  // namespace attnd::kernels::mla_prefill::gpu
