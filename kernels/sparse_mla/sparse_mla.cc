#include "kernels/sparse_mla/sparse_mla.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/common/status.h"
#include "kernels/common/status_details.h"
#include "kernels/common/supports.h"
#include "kernels/sparse_mla/cpu.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/common/gpu/runtime.h"
#include "kernels/sparse_mla/gpu/launch.h"
#endif

namespace attnd::kernels::sparse_mla {
namespace {

// Number of selection slots (T·K or nnz); valid after Validate.
int64_t SlotCount(const Params& p) {
  if (p.is_csr()) return p.indices.dim(0);
  return p.q.dim(0) * p.indices.dim(1);
}

WorkCount CountWith(const Params& p, int64_t valid) {
  const double t = static_cast<double>(p.q.dim(0));
  const double h = static_cast<double>(p.q.dim(1));
  const double d_qk = static_cast<double>(p.q.dim(2));
  const double e = static_cast<double>(valid);
  WorkCount w;
  w.flops = 2.0 * h * (d_qk + kDimV) * e;  // Σ_t 2·H·(d_qk + 512)·K_valid(t)
  double index_bytes = 4.0 * static_cast<double>(SlotCount(p));
  if (p.is_csr()) {
    index_bytes += 4.0 * (t + 1);
  } else if (p.topk_length.present()) {
    index_bytes += 4.0 * t;
  }
  // One gathered KV row per valid selection: 2·d_qk bytes (bf16), 656 (FP8 cache) or d_qk
  // (per-tensor FP8).
  const double row_bytes = p.kv_is_fp8()              ? static_cast<double>(kFp8RowBytes)
                           : p.kv_is_fp8_per_tensor() ? d_qk
                                                      : 2.0 * d_qk;
  w.bytes = 2.0 * t * h * d_qk + row_bytes * e + index_bytes + 2.0 * t * h * kDimV;
  if (p.lse.present()) w.bytes += 4.0 * t * h;
  return w;
}

// kv in any format (params.h): bf16 [S, d_qk], the FP8 cache u8 [S, 656] with d_qk 576 and
// f32-aligned rows, or the per-tensor FP8 cache u8 [S, d_qk] with a finite positive kv_scale
// (which every other format leaves 0).
absl::Status ValidateKv(const Tensor& kv, int64_t d_qk, float kv_scale) {
  if (kv.present() && kv.dtype != DType::kBF16 && kv.dtype != DType::kU8) {
    return InvalidField(
        "kv", absl::StrCat("kv: dtype is ", DTypeName(kv.dtype), ", want bf16 [S, d_qk], u8 [S, ",
                           kFp8RowBytes,
                           "] (the FP8 cache) or u8 [S, d_qk] (per-tensor FP8 codes, kv_scale)"));
  }
  const bool per_tensor =
      kv.present() && kv.dtype == DType::kU8 && kv.shape[kv.rank - 1] != kFp8RowBytes;
  if (per_tensor) {
    if (kv.rank == 2 && kv.shape[1] != d_qk) {
      return InvalidField(
          TensorDimField("kv", 1),
          absl::StrCat("kv: dim 1 is ", kv.shape[1], ", want ", kFp8RowBytes,
                       " (CACHE_LAYOUT_FLASHMLA_FP8_656) or ", d_qk, " (CACHE_LAYOUT_FP8_", d_qk,
                       "_PER_TENSOR: q's d_qk, with kv_scale)"));
    }
    ATTND_RETURN_IF_ERROR(CheckTensor(kv, "kv", DType::kU8, {kAnyDim, d_qk}));
    if (kv_scale == 0.0f) {
      return InvalidField("kv_scale",
                          absl::StrCat("kv_scale: missing: kv is per-tensor FP8 (u8 [S, ", d_qk,
                                       "]), whose values are e4m3 x kv_scale"));
    }
    if (!std::isfinite(kv_scale) || !(kv_scale > 0.0f)) {
      return InvalidField("kv_scale",
                          absl::StrCat("kv_scale: is ", kv_scale, ", want finite and > 0"));
    }
    return absl::OkStatus();
  }
  if (kv_scale != 0.0f) {
    return InvalidField(
        "kv_scale",
        absl::StrCat("kv_scale: is ", kv_scale,
                     ", but kv is not a per-tensor FP8 cache (u8 [S, d_qk]): leave it unset (0)"));
  }
  if (kv.present() && kv.dtype == DType::kU8) {
    if (d_qk != kFp8DimQk) {
      return InvalidField("kv", absl::StrCat("kv: the FP8 cache (u8 [S, ", kFp8RowBytes,
                                             "]) needs d_qk ", kFp8DimQk, ", q dim 2 is ", d_qk));
    }
    ATTND_RETURN_IF_ERROR(CheckTensor(kv, "kv", DType::kU8, {kAnyDim, kFp8RowBytes}));
    if (kv.dim(0) > 1 && kv.stride(0) % 4 != 0) {
      return InvalidField("kv",
                          absl::StrCat("kv: stride of dim 0 is ", kv.stride(0),
                                       " bytes, want a multiple of 4 (FP8 rows hold f32 scales)"));
    }
    if (kv.dim(0) > 0 && !Aligned(kv.data, 4)) {
      return InvalidField("kv",
                          "kv: data pointer is not 4-byte aligned (FP8 rows hold f32 scales)");
    }
    return absl::OkStatus();
  }
  return CheckTensor(kv, "kv", DType::kBF16, {kAnyDim, d_qk});
}

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
// A GPU implementation (registry.h's GpuImpl, named "<vendor>_<kind>"): Supports from the
// kernel's device checks, run = launch (split-K sized to the workspace the caller provides),
// workspace = the split partials. Never reads the selection on the host (Count would: it is not
// called here). A CSR indptr cannot be checked on the host: the kernels clamp each row to
// [clamp(indptr[t], 0, nnz), clamp(indptr[t+1], that, nnz)).
Impl<Params> KernelImpl(absl::string_view kind, gpu::GpuKernel kernel) {
  return GpuImpl<Params>(
      kind,
      [kernel](const Params& p, std::string* why) { return gpu::GpuSupports(kernel, p, why); },
      [kernel](const Params& p, const ExecContext& ctx) -> absl::Status {
        const int64_t bytes = ctx.workspace != nullptr ? ctx.workspace_bytes : 0;
        const int planned = gpu::GpuSplits(p, kernel);
        const int splits = gpu::SplitsThatFit(p, planned, bytes);
        if (p.batch_invariant && splits != planned) {  // fewer splits would change the result
          return absl::ResourceExhaustedError(absl::StrCat(
              "workspace: batch_invariant needs ", gpu::SplitWorkspaceBytes(p, planned),
              " bytes for its ", planned, " splits, got ", bytes));
        }
        const auto stream = static_cast<::attnd::gpu::Stream>(ctx.stream);
#if defined(ATTND_GPU_CUDA)
        if (kernel == gpu::GpuKernel::kWgmma) {
          GPU_RETURN_IF_ERROR(gpu::LaunchSparseMlaWgmma(p, splits, ctx.workspace, stream));
          return absl::OkStatus();
        }
        if (kernel == gpu::GpuKernel::kWgmmaPp) {
          GPU_RETURN_IF_ERROR(gpu::LaunchSparseMlaWgmmaPp(p, splits, ctx.workspace, stream));
          return absl::OkStatus();
        }
        if (kernel == gpu::GpuKernel::kMma) {
          GPU_RETURN_IF_ERROR(gpu::LaunchSparseMlaMma(p, splits, ctx.workspace, stream));
          return absl::OkStatus();
        }
        if (kernel == gpu::GpuKernel::kMmaLowH) {
          GPU_RETURN_IF_ERROR(gpu::LaunchSparseMlaMmaLowh(p, splits, ctx.workspace, stream));
          return absl::OkStatus();
        }
#endif
        GPU_RETURN_IF_ERROR(gpu::LaunchSparseMlaSimt(p, splits, ctx.workspace, stream));
        return absl::OkStatus();
      },
      [kernel](const Params& p) { return gpu::SplitWorkspaceBytes(p, gpu::GpuSplits(p, kernel)); });
}
#endif

#if defined(ATTND_GPU_CUDA)
// cuda_mma_auto (gpu/launch.h): kMmaLowH or kMma, chosen on the device from a sample of the
// selection; its workspace holds the decision and both kernels' split partials.
Impl<Params> MmaAutoImpl() {
  return GpuImpl<Params>(
      "mma_auto", [](const Params& p, std::string* why) { return gpu::MmaAutoSupports(p, why); },
      [](const Params& p, const ExecContext& ctx) -> absl::Status {
        const int64_t bytes = ctx.workspace != nullptr ? ctx.workspace_bytes : 0;
        GPU_RETURN_IF_ERROR(gpu::LaunchSparseMlaMmaAuto(
            p, ctx.workspace, bytes, static_cast<::attnd::gpu::Stream>(ctx.stream)));
        return absl::OkStatus();
      },
      [](const Params& p) { return gpu::MmaAutoWorkspaceBytes(p); });
}
#endif

}  // namespace

absl::Status Validate(const Params& p) {
  ATTND_RETURN_IF_ERROR(CheckCacheLayout("kv_layout", "kv", p.kv_layout, p.kv, kKvLayouts));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.q, "q", DType::kBF16, {kAnyDim, kAnyDim, kAnyDim}));
  const int64_t t = p.q.dim(0), h = p.q.dim(1), d_qk = p.q.dim(2);
  if (h < 1 || h > kMaxHeads) {
    return InvalidField(TensorDimField("q", 1),
                        absl::StrCat("q: dim 1 is ", h, ", want 1..", kMaxHeads, " (heads)"));
  }
  if (d_qk != 512 && d_qk != 576) {
    return InvalidField(TensorDimField("q", 2),
                        absl::StrCat("q: dim 2 is ", d_qk, ", want 512 or 576 (d_qk)"));
  }
  ATTND_RETURN_IF_ERROR(ValidateKv(p.kv, d_qk, p.kv_scale));
  if (p.is_csr()) {
    ATTND_RETURN_IF_ERROR(CheckTensor(p.indptr, "indptr", DType::kI32, {t + 1}));
    ATTND_RETURN_IF_ERROR(CheckTensor(p.indices, "indices", DType::kI32, {kAnyDim}));
    if (p.topk_length.present()) {
      return InvalidField(
          "topk_length",
          "topk_length: present with the CSR form (indptr); it belongs to the table form only");
    }
  } else {
    ATTND_RETURN_IF_ERROR(CheckTensor(p.indices, "indices", DType::kI32, {t, kAnyDim}));
    ATTND_RETURN_IF_ERROR(CheckOptionalTensor(p.topk_length, "topk_length", DType::kI32, {t}));
  }
  if (!(p.sm_scale > 0.0f) || !std::isfinite(p.sm_scale)) {
    return InvalidField("sm_scale",
                        absl::StrCat("sm_scale: is ", p.sm_scale, ", want finite and > 0"));
  }
  ATTND_RETURN_IF_ERROR(CheckTensor(p.out, "out", DType::kBF16, {t, h, kDimV}));
  // lse in any non-overlapping layout (docs/CONTRACTS.md "Strided lse"), e.g. a view of [H, T].
  ATTND_RETURN_IF_ERROR(CheckOptionalStridedTensor(p.lse, "lse", DType::kF32, {t, h}));
  ATTND_RETURN_IF_ERROR(CheckPrecision(p.precision));
  return absl::OkStatus();
}

absl::Status CheckSelectionData(const Params& p) {
  if (!p.is_csr()) return absl::OkStatus();
  const int32_t* ptr = p.indptr.ptr<const int32_t>();
  const int64_t t = p.q.dim(0), nnz = p.indices.dim(0);
  if (ptr[0] != 0) {
    return InvalidField("indptr", absl::StrCat("indptr: element 0 is ", ptr[0], ", want 0"));
  }
  for (int64_t i = 0; i < t; ++i) {
    if (ptr[i + 1] < ptr[i]) {
      return InvalidField("indptr", absl::StrCat("indptr: element ", i + 1, " is ", ptr[i + 1],
                                                 ", want >= element ", i, " (", ptr[i],
                                                 "): indptr must be monotone"));
    }
  }
  if (ptr[t] != nnz) {
    return InvalidField("indptr", absl::StrCat("indptr: element ", t, " is ", ptr[t], ", want ",
                                               nnz, " (indices dim 0, nnz)"));
  }
  return absl::OkStatus();
}

int64_t CountValidSelections(const Params& p) {
  if (!CheckSelectionData(p).ok()) return 0;
  const int64_t t_count = p.q.dim(0), s = p.kv.dim(0);
  int64_t valid = 0;
  for (int64_t t = 0; t < t_count; ++t) {
    const int32_t* row;
    int64_t len;
    if (p.is_csr()) {
      const int32_t* ptr = p.indptr.ptr<const int32_t>();
      row = p.indices.ptr_at<const int32_t>(ptr[t]);
      len = ptr[t + 1] - ptr[t];
    } else {
      const int64_t k = p.indices.dim(1);
      row = p.indices.ptr_at<const int32_t>(t * p.indices.stride(0));
      len = k;
      if (p.topk_length.present()) {
        len = std::clamp<int64_t>(p.topk_length.ptr<const int32_t>()[t], 0, k);
      }
    }
    for (int64_t i = 0; i < len; ++i) valid += (row[i] >= 0 && row[i] < s) ? 1 : 0;
  }
  return valid;
}

WorkCount Count(const Params& p) { return CountWith(p, CountValidSelections(p)); }

WorkCount CountSlots(const Params& p) { return CountWith(p, SlotCount(p)); }

const std::vector<Impl<Params>>& Implementations() {
  static const std::vector<Impl<Params>>* impls = new std::vector<Impl<Params>> {
#if defined(ATTND_GPU_CUDA)
    // sm_90a, H % 64 == 0: first where it runs.
    KernelImpl("wgmma", gpu::GpuKernel::kWgmma),
        // H <= 32, bf16 cache: cuda_mma_lowh when the sampled neighbours share rows, else
        // cuda_mma, decided by a device-side estimate (gpu/mma_auto.cu).
        MmaAutoImpl(), KernelImpl("mma", gpu::GpuKernel::kMma),
        // H <= 32, several neighbouring tokens per CTA gathering the union of their rows once:
        // faster than cuda_mma when neighbours share rows (causal kpool4 on one cache), slower on
        // uniform or disjoint selections (docs/BENCHMARKS.md "Low head counts"). Listed after
        // cuda_mma: by name, or through cuda_mma_auto, which runs it where the overlap pays.
        KernelImpl("mma_lowh", gpu::GpuKernel::kMmaLowH),
#endif
#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
        KernelImpl("simt", gpu::GpuKernel::kSimt),
#endif
#if defined(ATTND_GPU_CUDA)
        // sm_90a, FAST, bf16 cache, H a multiple of 64 or below 64 (padded): the consumers in
        // ping-pong. After every kernel that takes any call, so dispatch never picks it: by
        // name until measured (docs/KERNELS.md "Sparse MLA in ping-pong").
        KernelImpl("wgmma_pp", gpu::GpuKernel::kWgmmaPp),
#endif
        CpuImpl(RunCpu),
  };
  return *impls;
}

absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl) {
  ATTND_RETURN_IF_ERROR(Validate(p));
  return Dispatch(Implementations(), p, ctx, impl);
}

}  // namespace attnd::kernels::sparse_mla
