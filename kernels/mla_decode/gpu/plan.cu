// Host side of the MLA decode GPU path: what each kernel supports, the split-K plan and its
// workspace, the kernels' argument block and the common launch sequence. Portable CUDA/HIP.
#include <stdint.h>

#include <algorithm>
#include <limits>
#include <string>

#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/mla_decode/gpu/launch.h"
#include "kernels/mla_decode/gpu/plan.h"

namespace attnd::kernels::mla_decode {
namespace {

constexpr int64_t kInt32Limit = std::numeric_limits<int32_t>::max();

std::string Str(int64_t v) { return std::to_string(v); }

bool Aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Leading strides (all but the last, contiguous, dimension) are multiples of `elements`.
bool StridesMultipleOf(const Tensor& x, int64_t elements) {
  for (int d = 0; d + 1 < x.rank; ++d) {
    if (x.stride(d) % elements != 0) return false;
  }
  return true;
}

bool Refuse(std::string* why, const std::string& reason) {
  if (why != nullptr) *why = reason;
  return false;
}

KernelShape ShapeOf(GpuKernel kernel, const Params& p) {
#if defined(ATTND_GPU_CUDA)
  if (kernel == GpuKernel::kMma) return MmaShape(p);
#endif
  if (kernel == GpuKernel::kSimt) return SimtShape(p);
  return KernelShape{};
}

int64_t Rows(const Params& p) { return p.q.dim(1) * p.q.dim(2); }

int64_t Capacity(const Params& p) {
  int64_t capacity;
  if (MulOverflow(p.block_table.dim(1), p.kv_cache.dim(1), &capacity)) {
    capacity = std::numeric_limits<int64_t>::max();
  }
  return capacity;
}

}  // namespace

int64_t WorkItems(const Params& p, int block_rows) {
  return p.q.dim(0) * ((Rows(p) + block_rows - 1) / block_rows);
}

DecodeArgs MakeDecodeArgs(const Params& p, int block_rows, int splits, void* workspace) {
  DecodeArgs a{};
  a.q = p.q.ptr<const uint16_t>();
  a.q_stride_b = p.q.stride(0);
  a.q_stride_s = p.q.stride(1);
  a.q_stride_h = p.q.stride(2);
  a.kv = p.kv_cache.ptr<const uint16_t>();
  a.kv_stride_page = p.kv_cache.stride(0);
  a.kv_stride_slot = p.kv_cache.stride(1);
  a.num_pages = p.kv_cache.dim(0);
  a.page_size = p.kv_cache.dim(1);
  a.block_table = p.block_table.ptr<const int32_t>();
  a.table_stride_b = p.block_table.stride(0);
  a.table_stride_page = p.block_table.stride(1);
  a.capacity = Capacity(p);
  a.seqlens = p.cache_seqlens.ptr<const int32_t>();
  a.seqlens_stride = p.cache_seqlens.stride(0);
  a.out = p.out.ptr<uint16_t>();
  a.out_stride_b = p.out.stride(0);
  a.out_stride_s = p.out.stride(1);
  a.out_stride_h = p.out.stride(2);
  if (p.lse.present()) {
    a.lse = p.lse.ptr<float>();
    a.lse_stride_b = p.lse.stride(0);
    a.lse_stride_s = p.lse.stride(1);
    a.lse_stride_h = p.lse.stride(2);
  }
  a.batch = static_cast<int32_t>(p.q.dim(0));
  a.s_q = static_cast<int32_t>(p.q.dim(1));
  a.heads = static_cast<int32_t>(p.q.dim(2));
  a.rows = static_cast<int32_t>(Rows(p));
  a.block_rows = block_rows;
  a.row_blocks = static_cast<int32_t>((Rows(p) + block_rows - 1) / block_rows);
  a.splits = splits;
  a.causal = p.causal ? 1 : 0;
  a.scale_log2 = p.sm_scale * kLog2e;
  a.exact_p = p.precision == Precision::kHigh;
  if (splits > 1) {
    a.partial_o = static_cast<float*>(workspace);
    a.partial_lse = a.partial_o + static_cast<int64_t>(splits) * p.q.dim(0) * Rows(p) * kDimV;
  }
  return a;
}

bool GpuSupports(GpuKernel kernel, const Params& p, std::string* why) {
  gpu::DeviceFacts d;
  if (!gpu::CurrentDeviceFacts(&d)) return Refuse(why, "no GPU device");
  if (p.q.dim(0) > kInt32Limit) return Refuse(why, "q: batch " + Str(p.q.dim(0)) + " >= 2^31");
  if (Rows(p) > kInt32Limit) {
    return Refuse(why, "q: s_q x H is " + Str(Rows(p)) + ", want < 2^31");
  }
  if (kernel == GpuKernel::kMma) {
#if defined(ATTND_GPU_CUDA)
    if (d.cc_major < 8) {
      return Refuse(why, "needs compute capability >= 8.0 (bf16 mma.sync), device has " +
                             Str(d.cc_major) + "." + Str(d.cc_minor));
    }
#else
    return Refuse(why, "the mma.sync kernel is CUDA-only");
#endif
    if (!Aligned(p.q.data, 16) || !StridesMultipleOf(p.q, 8)) {
      return Refuse(why, "q: needs 16-byte alignment (base and leading strides multiples of 8)");
    }
    if (!Aligned(p.kv_cache.data, 16) || !StridesMultipleOf(p.kv_cache, 8)) {
      return Refuse(why,
                    "kv_cache: needs 16-byte alignment (base and leading strides multiples of 8)");
    }
    if (!Aligned(p.out.data, 4) || !StridesMultipleOf(p.out, 2)) {
      return Refuse(why, "out: needs 4-byte alignment (base and leading strides even)");
    }
  }
  const KernelShape shape = ShapeOf(kernel, p);
  if (shape.kernel == nullptr) return Refuse(why, "no kernel instance for this shape");
  if (shape.smem_bytes > d.smem_optin) {
    return Refuse(why, "needs " + Str(shape.smem_bytes) +
                           " bytes of shared memory per block, device allows " + Str(d.smem_optin));
  }
  if (shape.blocks_per_sm < 1) return Refuse(why, "the kernel cannot be resident on this device");
  // With splits > 1 there are fewer than SMs x resident CTAs items, so B · row blocks bounds
  // the grid of every plan.
  const int64_t items = WorkItems(p, shape.block_rows);
  if (items > kInt32Limit / 2) {
    return Refuse(why, "B x row blocks is " + Str(items) + ", want < 2^30");
  }
  return true;
}

int GpuSplits(const Params& p, GpuKernel kernel) {
  gpu::DeviceFacts d;
  if (!gpu::CurrentDeviceFacts(&d)) return 1;
  const KernelShape shape = ShapeOf(kernel, p);
  if (shape.kernel == nullptr || shape.blocks_per_sm < 1) return 1;
  const int64_t items = WorkItems(p, shape.block_rows);
  const int64_t slots = static_cast<int64_t>(d.sm_count) * shape.blocks_per_sm;
  if (items == 0 || items >= slots) return 1;
  const int64_t lower = slots / items;  // >= 1
  int64_t splits = 4 * items * lower >= 3 * slots ? lower : (slots + items - 1) / items;
  const int64_t capacity_tiles = Capacity(p) / shape.tile_tokens;
  splits = std::min<int64_t>({splits, kMaxSplits, std::max<int64_t>(1, capacity_tiles / 2)});
  return static_cast<int>(std::max<int64_t>(splits, 1));
}

int64_t SplitWorkspaceBytes(const Params& p, int splits) {
  if (splits <= 1) return 0;
  return static_cast<int64_t>(splits) * p.q.dim(0) * Rows(p) * (kDimV + 1) * 4;
}

int SplitsThatFit(const Params& p, int splits, int64_t bytes) {
  while (splits > 1 && SplitWorkspaceBytes(p, splits) > bytes) --splits;
  return std::max(splits, 1);
}

gpu::Error LaunchDecode(const Params& p, const KernelShape& shape, int splits, void* workspace,
                        gpu::Stream stream) {
  if (shape.kernel == nullptr || shape.blocks_per_sm < 1) return kInvalidValue;
  if (splits > 1 && (workspace == nullptr || !Aligned(workspace, 16))) {
    return kInvalidValue;
  }
  const int64_t grid = WorkItems(p, shape.block_rows) * splits;
  if (grid == 0) return gpu::kSuccess;
  if (grid > kInt32Limit) return kInvalidValue;
  DecodeArgs a = MakeDecodeArgs(p, shape.block_rows, splits, workspace);
  void* args[] = {&a};
#if defined(ATTND_GPU_CUDA)
  gpu::Error e = cudaLaunchKernel(shape.kernel, dim3(static_cast<unsigned>(grid)),
                                  dim3(shape.threads), args, shape.smem_bytes, stream);
#else
  gpu::Error e = hipLaunchKernel(shape.kernel, dim3(static_cast<unsigned>(grid)),
                                 dim3(shape.threads), args, shape.smem_bytes, stream);
#endif
  if (e != gpu::kSuccess || splits == 1) return e;
  return LaunchMlaDecodeCombine(a, stream);
}

}  // namespace attnd::kernels::mla_decode
