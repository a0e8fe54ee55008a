// Host side of the sparse MLA GPU path: what each kernel supports on the current device, the
// split-K plan and its workspace, and the kernels' argument block. Portable CUDA/HIP.
#include <stdint.h>

#include <algorithm>
#include <string>

#include "kernels/common/gpu/device_checks.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/sparse_mla/gpu/common.cuh"
#include "kernels/sparse_mla/gpu/launch.h"
#include "kernels/sparse_mla/gpu/plan.h"

namespace attnd::kernels::sparse_mla::gpu {
KernelArgs MakeKernelArgs(const Params& p, int splits, void* workspace) {
  KernelArgs a{};
  a.q = p.q.ptr<const uint16_t>();
  a.q_stride_t = p.q.stride(0);
  a.q_stride_h = p.q.stride(1);
  if (p.kv_is_fp8() || p.kv_is_fp8_per_tensor()) {
    a.kv_fp8 = p.kv.ptr<const uint8_t>();
    a.kv_fp8_stride = p.kv.stride(0);
    if (p.kv_is_fp8_per_tensor()) a.kv_scale = p.kv_scale;
  } else {
    a.kv = p.kv.ptr<const uint16_t>();
    a.kv_stride = p.kv.stride(0);
  }
  a.kv_rows = p.kv.dim(0);
  ::attnd::gpu::DeviceFacts d;
  const int64_t pool_bytes = a.kv_rows * p.kv.stride(0) * DTypeSize(p.kv.dtype);
  a.prefetch_l2 = ::attnd::gpu::CurrentDeviceFacts(&d) && pool_bytes > d.l2_bytes;
  a.indices = p.indices.ptr<const int32_t>();
  if (p.is_csr()) {
    a.indptr = p.indptr.ptr<const int32_t>();
    a.width = p.indices.dim(0);
  } else {
    a.indices_stride = p.indices.stride(0);
    a.width = p.indices.dim(1);
    if (p.topk_length.present()) a.topk_length = p.topk_length.ptr<const int32_t>();
  }
  a.out = p.out.ptr<uint16_t>();
  a.out_stride_t = p.out.stride(0);
  a.out_stride_h = p.out.stride(1);
  if (p.lse.present()) {
    a.lse = p.lse.ptr<float>();
    a.lse_stride_t = p.lse.stride(0);
    a.lse_stride_h = p.lse.stride(1);
  }
  a.tokens = static_cast<int32_t>(p.q.dim(0));
  a.heads = static_cast<int32_t>(p.q.dim(1));
  a.splits = splits;
  a.scale_log2 = p.sm_scale * kLog2e;
  a.exact_p = p.precision == Precision::kHigh;
  a.invariant_splits = p.batch_invariant && !p.is_csr();  // CSR: one split (invariant_plan.h)
  if (splits > 1) {
    a.partial_o = static_cast<float*>(workspace);
    a.partial_lse = a.partial_o + static_cast<int64_t>(splits) * p.q.dim(0) * p.q.dim(1) * kDimV;
  }
  return a;
}

bool GpuSupports(GpuKernel kernel, const Params& p, std::string* why) {
  ::attnd::gpu::DeviceFacts d;
  if (!CurrentDevice(&d, why)) return false;
  if (!Bf16RowsAligned16(p.q)) {
    return Refuse(why, "q: needs 16-byte alignment (base and leading strides multiples of 8)");
  }
  if (p.kv_is_fp8_per_tensor() && kernel != GpuKernel::kSimt) {
    // The tensor-core kernels read bf16 and FlashMLA FP8 rows; dispatch falls back to kSimt.
    return Refuse(why, "kv: the per-tensor FP8 cache is read by the SIMT kernel only");
  }
  if (p.kv_is_fp8() || p.kv_is_fp8_per_tensor()) {
    if (p.kv.dim(0) > 0 && (!Aligned(p.kv.data, 16) || !StridesMultipleOf(p.kv, 16))) {
      return Refuse(why,
                    "kv: FP8 cache rows need 16-byte alignment (base and row stride "
                    "multiples of 16 bytes)");
    }
  } else if (p.kv.dim(0) > 0 && !Bf16RowsAligned16(p.kv)) {
    return Refuse(why, "kv: needs 16-byte alignment (base and row stride multiples of 8)");
  }
  if (!Aligned(p.out.data, 4) || !StridesMultipleOf(p.out, 2)) {
    return Refuse(why, "out: needs 4-byte alignment (base and leading strides even)");
  }
  if (p.q.dim(0) > kMaxInt32) return Refuse(why, "q: more than 2^31 - 1 tokens");
  if (kernel == GpuKernel::kMmaLowH) {
    if (p.batch_invariant) {
      return Refuse(why,
                    "batch_invariant: stacks neighbouring tokens into one CTA over the union "
                    "of their rows, so a token's result depends on its neighbours");
    }
#if defined(ATTND_GPU_CUDA)
    return MmaLowhSupports(p, why);
#else
    return Refuse(why, "the low-head mma.sync kernel is CUDA-only");
#endif
  }
  if (kernel == GpuKernel::kWgmma || kernel == GpuKernel::kWgmmaPp) {
#if defined(ATTND_GPU_CUDA)
    return kernel == GpuKernel::kWgmma ? WgmmaSupports(p, why) : WgmmaPpSupports(p, why);
#else
    return Refuse(why, "the wgmma kernels are CUDA-only");
#endif
  }
  if (kernel == GpuKernel::kMma && !RunsMmaSync(d, why)) return false;
  const KernelShape shape = kernel == GpuKernel::kSimt ? SimtShape(p)
#if defined(ATTND_GPU_CUDA)
                                                       : MmaShape(p);
#else
                                                       : KernelShape{};
#endif
  const int64_t groups = CeilDiv(p.q.dim(1), shape.block_m);
  if (p.q.dim(0) * groups > kMaxInt32) {
    return Refuse(why, "T x head blocks is ", p.q.dim(0) * groups, ", want < 2^31");
  }
  return FitsDevice(shape.smem_bytes, shape.ctas_per_sm, d, why);
}

int SplitsForItems(const Params& p, int64_t items, int64_t slots) {
  const int64_t width = p.is_csr() ? p.indices.dim(0) : p.indices.dim(1);
  const int64_t blocks = CeilDiv(width, kSplitAlign);
  const int max_splits = static_cast<int>(std::clamp<int64_t>(blocks / 2, 1, kMaxSplits));
  for (int s = 1; s < max_splits; ++s) {
    const int64_t ctas = items * s;
    const int64_t waves = CeilDiv(ctas, slots);
    if (4 * ctas >= 3 * slots * waves) return s;
  }
  return max_splits;
}

int GpuSplits(const Params& p, GpuKernel kernel) {
  if (p.batch_invariant) return InvariantGridSplits(p);  // the token's own length only
#if defined(ATTND_GPU_CUDA)
  if (kernel == GpuKernel::kMmaLowH) return MmaLowhSplits(p);
#endif
  const int64_t tokens = p.q.dim(0), heads = p.q.dim(1);
  ::attnd::gpu::DeviceFacts d;
  if (tokens == 0 || !::attnd::gpu::CurrentDeviceFacts(&d)) return 1;  // before any occupancy query
  const KernelShape shape = kernel == GpuKernel::kSimt ? SimtShape(p)
#if defined(ATTND_GPU_CUDA)
                            : kernel == GpuKernel::kWgmma   ? WgmmaShape(p)
                            : kernel == GpuKernel::kWgmmaPp ? WgmmaPpShape(p)
                                                            : MmaShape(p);
#else
                                                       : KernelShape{};
#endif
  if (shape.block_m == 0) return 1;
  const int64_t items = tokens * CeilDiv(heads, shape.block_m);
  const int64_t slots = static_cast<int64_t>(d.sm_count) * std::max(shape.ctas_per_sm, 1);
  return SplitsForItems(p, items, slots);
}

int64_t SplitWorkspaceBytes(const Params& p, int splits) {
  if (splits <= 1) return 0;
  return static_cast<int64_t>(splits) * p.q.dim(0) * p.q.dim(1) * (kDimV + 1) *
         static_cast<int64_t>(sizeof(float));
}

int SplitsThatFit(const Params& p, int splits, int64_t bytes) {
  while (splits > 1 && SplitWorkspaceBytes(p, splits) > bytes) --splits;
  return std::max(splits, 1);
}

}  // namespace attnd::kernels::sparse_mla::gpu
