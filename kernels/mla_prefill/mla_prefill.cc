#include "kernels/mla_prefill/mla_prefill.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/common/status.h"
#include "kernels/common/status_details.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/common/gpu/runtime.h"
#include "kernels/mla_prefill/gpu/launch.h"
#endif

namespace attnd::kernels::mla_prefill {
namespace {

int64_t CuAt(const Tensor& cu, int64_t i) { return cu.ptr<const int32_t>()[i * cu.stride(0)]; }

absl::Status CheckOneCuSeqlens(const Tensor& cu, const char* name, int64_t total) {
  const int64_t n = cu.dim(0);
  if (CuAt(cu, 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": entry 0 is ", CuAt(cu, 0), ", want 0"));
  }
  for (int64_t i = 1; i < n; ++i) {
    if (CuAt(cu, i) < CuAt(cu, i - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": entry ", i, " is ", CuAt(cu, i),
                                                     ", want >= entry ", i - 1, " (",
                                                     CuAt(cu, i - 1), ")"));
    }
  }
  if (CuAt(cu, n - 1) > total) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": last entry is ", CuAt(cu, n - 1), ", want <= ", total, " (tokens)"));
  }
  return absl::OkStatus();
}

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
// GPU implementations. cu_seqlens live on the device: the kernels clamp them instead of running
// CheckCuSeqlens (well-formed input gives the CPU's output; malformed input stays memory-safe,
// output unspecified: gpu/common.cuh). Count(p) reads cu_seqlens on the host and is never called
// here.
template <gpu::GpuKernel kKernel>
bool SupportsGpu(const Params& p, std::string* why) {
  return gpu::GpuSupports(kKernel, p, why);
}

int64_t GpuWorkspace(const Params& p) { return gpu::WorkspaceBytes(p); }

template <gpu::GpuKernel kKernel>
absl::Status RunGpu(const Params& p, const ExecContext& ctx) {
  if (ctx.workspace == nullptr || ctx.workspace_bytes < gpu::WorkspaceBytes(p)) {
    return absl::InvalidArgumentError(absl::StrCat("mla_prefill: workspace of ",
                                                   ctx.workspace_bytes, " bytes, want ",
                                                   gpu::WorkspaceBytes(p)));
  }
  const auto stream = static_cast<::attnd::gpu::Stream>(ctx.stream);
#if defined(ATTND_GPU_CUDA)
  if constexpr (kKernel == gpu::GpuKernel::kMma) {
    GPU_RETURN_IF_ERROR(gpu::LaunchMlaPrefillMma(p, ctx.workspace, stream));
    return absl::OkStatus();
  }
  if constexpr (kKernel == gpu::GpuKernel::kWgmma) {
    GPU_RETURN_IF_ERROR(gpu::LaunchMlaPrefillWgmma(p, ctx.workspace, stream));
    return absl::OkStatus();
  }
#endif
  GPU_RETURN_IF_ERROR(gpu::LaunchMlaPrefillSimt(p, ctx.workspace, stream));
  return absl::OkStatus();
}
#endif

}  // namespace

absl::Status Validate(const Params& p) {
  ATTND_RETURN_IF_ERROR(CheckTensor(p.q, "q", DType::kBF16, {kAnyDim, kAnyDim, kAnyDim}));
  const int64_t total_q = p.q.dim(0), heads = p.q.dim(1), d_qk = p.q.dim(2);
  if (heads < 1) {
    return InvalidField(TensorDimField("q", 1),
                        absl::StrCat("q: dim 1 (heads) is ", heads, ", want >= 1"));
  }
  if (d_qk < 1 || d_qk > kMaxHeadDim) {
    return InvalidField(TensorDimField("q", 2),
                        absl::StrCat("q: dim 2 (d_qk) is ", d_qk, ", want 1..", kMaxHeadDim));
  }
  ATTND_RETURN_IF_ERROR(CheckTensor(p.k, "k", DType::kBF16, {kAnyDim, kAnyDim, d_qk}));
  const int64_t total_k = p.k.dim(0), heads_kv = p.k.dim(1);
  if (heads_kv < 1 || heads % heads_kv != 0) {
    return InvalidField(TensorDimField("k", 1),
                        absl::StrCat("k: dim 1 (kv heads) is ", heads_kv,
                                     ", want >= 1 and dividing q's ", heads, " heads"));
  }
  ATTND_RETURN_IF_ERROR(CheckTensor(p.v, "v", DType::kBF16, {total_k, heads_kv, kAnyDim}));
  const int64_t d_v = p.v.dim(2);
  if (d_v < 1 || d_v > kMaxHeadDim) {
    return InvalidField(TensorDimField("v", 2),
                        absl::StrCat("v: dim 2 (d_v) is ", d_v, ", want 1..", kMaxHeadDim));
  }
  ATTND_RETURN_IF_ERROR(CheckTensor(p.cu_seqlens_q, "cu_seqlens_q", DType::kI32, {kAnyDim}));
  const int64_t batch_plus_1 = p.cu_seqlens_q.dim(0);
  if (batch_plus_1 < 1) {
    return InvalidField(
        TensorDimField("cu_seqlens_q", 0),
        absl::StrCat("cu_seqlens_q: dim 0 is ", batch_plus_1, ", want >= 1 (batch + 1)"));
  }
  ATTND_RETURN_IF_ERROR(CheckTensor(p.cu_seqlens_k, "cu_seqlens_k", DType::kI32, {batch_plus_1}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.out, "out", DType::kBF16, {total_q, heads, d_v}));
  ATTND_RETURN_IF_ERROR(CheckOptionalTensor(p.lse, "lse", DType::kF32, {total_q, heads}));
  if (!std::isfinite(p.sm_scale) || p.sm_scale <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sm_scale is ", p.sm_scale, ", want finite and > 0"));
  }
  ATTND_RETURN_IF_ERROR(CheckPrecision(p.precision));
  return absl::OkStatus();
}

absl::Status CheckCuSeqlens(const Params& p) {
  ATTND_RETURN_IF_ERROR(CheckOneCuSeqlens(p.cu_seqlens_q, "cu_seqlens_q", p.q.dim(0)));
  return CheckOneCuSeqlens(p.cu_seqlens_k, "cu_seqlens_k", p.k.dim(0));
}

WorkCount Count(const Params& p) {
  const int64_t total_q = p.q.dim(0), heads = p.q.dim(1), d_qk = p.q.dim(2);
  const int64_t total_k = p.k.dim(0), heads_kv = p.k.dim(1), d_v = p.v.dim(2);
  const int64_t batch = p.cu_seqlens_q.dim(0) - 1;
  double pairs = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t lq = std::max<int64_t>(0, CuAt(p.cu_seqlens_q, b + 1) - CuAt(p.cu_seqlens_q, b));
    const int64_t lk = std::max<int64_t>(0, CuAt(p.cu_seqlens_k, b + 1) - CuAt(p.cu_seqlens_k, b));
    for (int64_t i = 0; i < std::min(lq, total_q); ++i) {
      pairs += static_cast<double>(internal::KeyLimit(i, lq, std::min(lk, total_k), p.causal));
    }
  }
  WorkCount w;
  w.flops = 2.0 * heads * (d_qk + d_v) * pairs;
  w.bytes = 2.0 * total_q * heads * d_qk + 2.0 * total_k * heads_kv * (d_qk + d_v) +
            2.0 * total_q * heads * d_v + (p.lse.present() ? 4.0 * total_q * heads : 0.0) +
            8.0 * (batch + 1);
  return w;
}

const std::vector<Impl<Params>>& Implementations() {
  static const auto* impls = new std::vector<Impl<Params>> {
#if defined(ATTND_GPU_CUDA)
    GpuImpl<Params>("wgmma", SupportsGpu<gpu::GpuKernel::kWgmma>, RunGpu<gpu::GpuKernel::kWgmma>,
                    GpuWorkspace),
        GpuImpl<Params>("mma", SupportsGpu<gpu::GpuKernel::kMma>, RunGpu<gpu::GpuKernel::kMma>,
                        GpuWorkspace),
#endif
#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
        GpuImpl<Params>("simt", SupportsGpu<gpu::GpuKernel::kSimt>, RunGpu<gpu::GpuKernel::kSimt>,
                        GpuWorkspace),
#endif
        CpuImpl(internal::RunCpu),
  };
  return *impls;
}

absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl) {
  ATTND_RETURN_IF_ERROR(Validate(p));
  return Dispatch(Implementations(), p, ctx, impl);
}

}  // namespace attnd::kernels::mla_prefill
