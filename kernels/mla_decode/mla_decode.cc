#include "kernels/mla_decode/mla_decode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/math.h"
#include "kernels/common/status.h"
#include "kernels/common/status_details.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/common/gpu/runtime.h"
#include "kernels/mla_decode/gpu/launch.h"
#endif

namespace attnd::kernels::mla_decode {
namespace {

// Readable tokens of request b among positions [0, n) for n <= its clamped length: tokens on
// pages whose id is in range. A prefix count over the pages makes each query O(1).
class ReadableCounter {
 public:
  ReadableCounter(const Params& p, int64_t b, int64_t seqlen) : page_size_(p.kv_cache.dim(1)) {
    const int64_t pages = CeilDiv(seqlen, page_size_);
    valid_before_.assign(static_cast<size_t>(pages + 1), 0);
    if (pages == 0) return;
    const int32_t* row = p.block_table.ptr_at<const int32_t>(b * p.block_table.stride(0));
    for (int64_t j = 0; j < pages; ++j) {
      const int32_t id = row[j * p.block_table.stride(1)];
      valid_before_[j + 1] = valid_before_[j] + (id >= 0 && id < p.kv_cache.dim(0) ? 1 : 0);
    }
  }
  int64_t Count(int64_t n) const {
    const int64_t full = n / page_size_, rest = n % page_size_;
    const bool last_valid = rest > 0 && valid_before_[full + 1] > valid_before_[full];
    return valid_before_[full] * page_size_ + (last_valid ? rest : 0);
  }

 private:
  const int64_t page_size_;
  std::vector<int64_t> valid_before_;  // [j]: valid pages among the first j
};

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
// GPU implementations: the kernel's split plan is shapes-only (lengths are device data), so
// workspace(p) and run(p) agree; run() lowers the split count to what the caller's workspace
// holds. Count(p) reads block_table / cache_seqlens on the host and is never called here.
template <gpu::GpuKernel kKernel>
bool SupportsGpu(const Params& p, std::string* why) {
  return gpu::GpuSupports(kKernel, p, why);
}

template <gpu::GpuKernel kKernel>
int64_t GpuWorkspace(const Params& p) {
  return gpu::SplitWorkspaceBytes(p, gpu::GpuSplits(p, kKernel));
}

template <gpu::GpuKernel kKernel>
absl::Status RunGpu(const Params& p, const ExecContext& ctx) {
  const int64_t bytes = ctx.workspace == nullptr ? 0 : ctx.workspace_bytes;
  const int planned = gpu::GpuSplits(p, kKernel);
  const int splits = gpu::SplitsThatFit(p, planned, bytes);
  if (p.batch_invariant && splits != planned) {  // fewer splits would change the result
    return absl::ResourceExhaustedError(
        absl::StrCat("workspace: batch_invariant needs ", gpu::SplitWorkspaceBytes(p, planned),
                     " bytes for its ", planned, " splits, got ", bytes));
  }
  const auto stream = static_cast<::attnd::gpu::Stream>(ctx.stream);
#if defined(ATTND_GPU_CUDA)
  if constexpr (kKernel == gpu::GpuKernel::kMma) {
    GPU_RETURN_IF_ERROR(gpu::LaunchMlaDecodeMma(p, splits, ctx.workspace, stream));
    return absl::OkStatus();
  }
  if constexpr (kKernel == gpu::GpuKernel::kWgmma) {
    GPU_RETURN_IF_ERROR(gpu::LaunchMlaDecodeWgmma(p, splits, ctx.workspace, stream));
    return absl::OkStatus();
  }
  if constexpr (kKernel == gpu::GpuKernel::kWgmmaPp) {
    GPU_RETURN_IF_ERROR(gpu::LaunchMlaDecodeWgmmaPp(p, splits, ctx.workspace, stream));
    return absl::OkStatus();
  }
  if constexpr (kKernel == gpu::GpuKernel::kWgmmaSf) {
    GPU_RETURN_IF_ERROR(gpu::LaunchMlaDecodeWgmmaSf(p, splits, ctx.workspace, stream));
    return absl::OkStatus();
  }
#endif
  GPU_RETURN_IF_ERROR(gpu::LaunchMlaDecodeSimt(p, splits, ctx.workspace, stream));
  return absl::OkStatus();
}
#endif

}  // namespace

namespace internal {

int64_t ClampedSeqlen(const Params& p, int64_t b) {
  const int64_t raw = p.cache_seqlens.ptr<const int32_t>()[b * p.cache_seqlens.stride(0)];
  int64_t capacity;
  if (MulOverflow(p.block_table.dim(1), p.kv_cache.dim(1), &capacity)) {
    capacity = std::numeric_limits<int64_t>::max();
  }
  return std::clamp<int64_t>(raw, 0, capacity);
}

}  // namespace internal

absl::Status Validate(const Params& p) {
  ATTND_RETURN_IF_ERROR(CheckCacheLayout("kv_cache_layout", "kv_cache", p.kv_cache_layout,
                                         p.kv_cache, kKvCacheLayouts));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.q, "q", DType::kBF16, {kAnyDim, kAnyDim, kAnyDim, kAnyDim}));
  const int64_t batch = p.q.dim(0), s_q = p.q.dim(1), heads = p.q.dim(2), d_qk = p.q.dim(3);
  if (heads < 1 || heads > kMaxHeads) {
    return InvalidField(TensorDimField("q", 2),
                        absl::StrCat("q: dim 2 (heads) is ", heads, ", want 1..", kMaxHeads));
  }
  if (d_qk != kDqkRope && d_qk != kDqkNoRope) {
    return InvalidField(TensorDimField("q", 3), absl::StrCat("q: dim 3 is ", d_qk, ", want ",
                                                             kDqkRope, " or ", kDqkNoRope));
  }
  if (p.kv_cache.present() && p.kv_cache.dtype != DType::kBF16 && p.kv_cache.dtype != DType::kU8) {
    return InvalidField("kv_cache", absl::StrCat("kv_cache: dtype is ", DTypeName(p.kv_cache.dtype),
                                                 ", want bf16, or u8 (per-tensor FP8 e4m3 codes "
                                                 "with kv_scale)"));
  }
  ATTND_RETURN_IF_ERROR(CheckTensor(
      p.kv_cache, "kv_cache", p.kv_is_fp8() ? DType::kU8 : DType::kBF16, {kAnyDim, kAnyDim, d_qk}));
  if (p.kv_is_fp8()) {
    if (p.kv_scale == 0.0f) {
      return InvalidField(
          "kv_scale", absl::StrCat("kv_scale: missing: kv_cache is per-tensor FP8 (u8 [..., ", d_qk,
                                   "]), whose values are e4m3 x kv_scale"));
    }
    if (!std::isfinite(p.kv_scale) || !(p.kv_scale > 0.0f)) {
      return InvalidField("kv_scale",
                          absl::StrCat("kv_scale: is ", p.kv_scale, ", want finite and > 0"));
    }
  } else if (p.kv_scale != 0.0f) {
    return InvalidField("kv_scale",
                        absl::StrCat("kv_scale: is ", p.kv_scale,
                                     ", but kv_cache is bf16 (no scale): leave it unset (0)"));
  }
  if (p.kv_cache.dim(1) < 1) {
    return InvalidField(
        TensorDimField("kv_cache", 1),
        absl::StrCat("kv_cache: dim 1 (page_size) is ", p.kv_cache.dim(1), ", want >= 1"));
  }
  ATTND_RETURN_IF_ERROR(CheckTensor(p.block_table, "block_table", DType::kI32, {batch, kAnyDim}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.cache_seqlens, "cache_seqlens", DType::kI32, {batch}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.out, "out", DType::kBF16, {batch, s_q, heads, kDv}));
  // lse in any non-overlapping layout (docs/CONTRACTS.md "Strided lse"), e.g. a view of
  // FlashMLA's [B, H, s_q].
  ATTND_RETURN_IF_ERROR(CheckOptionalStridedTensor(p.lse, "lse", DType::kF32, {batch, s_q, heads}));
  if (!std::isfinite(p.sm_scale) || p.sm_scale <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sm_scale is ", p.sm_scale, ", want finite and > 0"));
  }
  ATTND_RETURN_IF_ERROR(CheckPrecision(p.precision));
  return absl::OkStatus();
}

WorkCount Count(const Params& p) {
  const int64_t batch = p.q.dim(0), s_q = p.q.dim(1), heads = p.q.dim(2), d_qk = p.q.dim(3);
  const double rows = static_cast<double>(batch) * s_q * heads;
  WorkCount w;
  double tokens_read = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t seqlen = internal::ClampedSeqlen(p, b);
    const ReadableCounter readable(p, b, seqlen);
    int64_t max_limit = 0;
    for (int64_t i = 0; i < s_q; ++i) {
      const int64_t limit = internal::VisibleLimit(seqlen, s_q, i, p.causal);
      max_limit = std::max(max_limit, limit);
      w.flops += 2.0 * heads * (d_qk + kDv) * static_cast<double>(readable.Count(limit));
    }
    tokens_read += static_cast<double>(readable.Count(max_limit));
  }
  const double row_bytes = (p.kv_is_fp8() ? 1.0 : 2.0) * d_qk;  // u8 codes or bf16
  w.bytes = 2.0 * rows * d_qk + row_bytes * tokens_read + 2.0 * rows * kDv +
            (p.lse.present() ? 4.0 * rows : 0.0) +
            4.0 * static_cast<double>(batch) * (p.block_table.dim(1) + 1);
  return w;
}

#if defined(ATTND_GPU_CUDA)
namespace {
// cuda_wgmma: preferred at H < 64 (rows padded) only where the cache's bytes bound the call
// (gpu::WgmmaPrefers); elsewhere dispatch runs cuda_mma.
Impl<Params> WgmmaImpl() {
  Impl<Params> impl =
      GpuImpl<Params>("wgmma", SupportsGpu<gpu::GpuKernel::kWgmma>, RunGpu<gpu::GpuKernel::kWgmma>,
                      GpuWorkspace<gpu::GpuKernel::kWgmma>);
  impl.prefer = [](const Params& p, std::string* why) { return gpu::WgmmaPrefers(p, why); };
  return impl;
}
}  // namespace
#endif

const std::vector<Impl<Params>>& Implementations() {
  static const auto* impls = new std::vector<Impl<Params>> {
#if defined(ATTND_GPU_CUDA)
    WgmmaImpl(),
        GpuImpl<Params>("mma", SupportsGpu<gpu::GpuKernel::kMma>, RunGpu<gpu::GpuKernel::kMma>,
                        GpuWorkspace<gpu::GpuKernel::kMma>),
#endif
#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
        GpuImpl<Params>("simt", SupportsGpu<gpu::GpuKernel::kSimt>, RunGpu<gpu::GpuKernel::kSimt>,
                        GpuWorkspace<gpu::GpuKernel::kSimt>),
#endif
#if defined(ATTND_GPU_CUDA)
        // FAST, the consumers in ping-pong (also H < 64, padded). After the kernel that takes
        // any call, so dispatch never picks it: by name until measured (docs/KERNELS.md
        // "Sparse MLA in ping-pong").
        GpuImpl<Params>("wgmma_pp", SupportsGpu<gpu::GpuKernel::kWgmmaPp>,
                        RunGpu<gpu::GpuKernel::kWgmmaPp>, GpuWorkspace<gpu::GpuKernel::kWgmmaPp>),
        // The same math with no producer warpgroup, stages loaded by TMA (page size 64); by
        // name until measured (docs/KERNELS.md "Dense MLA decode, self-fed").
        GpuImpl<Params>("wgmma_sf", SupportsGpu<gpu::GpuKernel::kWgmmaSf>,
                        RunGpu<gpu::GpuKernel::kWgmmaSf>, GpuWorkspace<gpu::GpuKernel::kWgmmaSf>),
#endif
        CpuImpl(internal::RunCpu),
  };
  return *impls;
}

absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl) {
  ATTND_RETURN_IF_ERROR(Validate(p));
  return Dispatch(Implementations(), p, ctx, impl);
}

}  // namespace attnd::kernels::mla_decode
