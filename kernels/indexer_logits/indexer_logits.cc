#include "kernels/indexer_logits/indexer_logits.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/common/status.h"
#include "kernels/common/status_details.h"
#include "kernels/indexer_logits/cpu.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/indexer_logits/gpu/launch.h"
#endif

namespace attnd::kernels::indexer_logits {

absl::Status CheckHeadShape(const Tensor& q, int heads_dim) {
  const int64_t h = q.dim(heads_dim), d = q.dim(heads_dim + 1);
  if (h < 1 || h > kMaxHeads) {
    return InvalidField(
        TensorDimField("q", heads_dim),
        absl::StrCat("q: dim ", heads_dim, " (heads) is ", h, ", want 1..", kMaxHeads));
  }
  if (d < kHeadDimAlign || d > kMaxHeadDim || d % kHeadDimAlign != 0) {
    return InvalidField(
        TensorDimField("q", heads_dim + 1),
        absl::StrCat("q: dim ", heads_dim + 1, " (head dim) is ", d, ", want a multiple of ",
                     kHeadDimAlign, " in [", kHeadDimAlign, ", ", kMaxHeadDim, "]"));
  }
  return absl::OkStatus();
}

absl::Status Validate(const Params& p) {
  ATTND_RETURN_IF_ERROR(CheckTensor(p.q, "q", DType::kFp8E4M3, {kAnyDim, kAnyDim, kAnyDim}));
  ATTND_RETURN_IF_ERROR(CheckHeadShape(p.q, 1));
  const int64_t m = p.q.dim(0), h = p.q.dim(1), d = p.q.dim(2);
  ATTND_RETURN_IF_ERROR(CheckTensor(p.k, "k", DType::kFp8E4M3, {kAnyDim, d}));
  const int64_t n = p.k.dim(0);
  ATTND_RETURN_IF_ERROR(CheckTensor(p.k_scale, "k_scale", DType::kF32, {n}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.weights, "weights", DType::kF32, {m, h}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.ks, "ks", DType::kI32, {m}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.ke, "ke", DType::kI32, {m}));
  ATTND_RETURN_IF_ERROR(CheckTensor(p.logits, "logits", DType::kF32, {m, n}));
  ATTND_RETURN_IF_ERROR(CheckPrecision(p.precision));
  return absl::OkStatus();
}

WorkCount Count(const Params& p) {
  const int64_t m = p.q.dim(0), h = p.q.dim(1), d = p.q.dim(2), n = p.k.dim(0);
  const int32_t* ks = p.ks.ptr<const int32_t>();
  const int32_t* ke = p.ke.ptr<const int32_t>();
  double pairs = 0;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t lo = std::max<int64_t>(ks[i * p.ks.stride(0)], 0);
    const int64_t hi = std::min<int64_t>(ke[i * p.ke.stride(0)], n);
    if (hi > lo) pairs += static_cast<double>(hi - lo);
  }
  const double written = p.clean_logits ? static_cast<double>(m) * static_cast<double>(n) : pairs;
  WorkCount w;
  w.flops = 2.0 * static_cast<double>(h * d) * pairs;
  w.bytes = static_cast<double>(m * h * d) + static_cast<double>(n) * static_cast<double>(d + 4) +
            4.0 * static_cast<double>(m * h) + 8.0 * static_cast<double>(m) + 4.0 * written;
  return w;
}

// GPU implementations first (dispatch picks by backend, then by Supports). They read ks/ke on
// the device only; nothing here calls Count (it reads ks/ke on the host). cuda_wgmma runs FAST
// only and refuses HIGH, so FAST picks it on sm_90 and HIGH falls through to cuda_mma; the others
// run both precisions the same way (exact products summed in f32: HIGH meets FAST's bound).
const std::vector<Impl<Params>>& Implementations() {
  static const auto* impls = new std::vector<Impl<Params>>{
      ATTND_IF_CUDA(GpuImpl("wgmma", gpu::WgmmaSupports, gpu::LaunchWgmma))  //
      ATTND_IF_CUDA(GpuImpl("mma", gpu::MmaSupports, gpu::LaunchMma))        //
      ATTND_IF_GPU(GpuImpl("simt", gpu::SimtSupports, gpu::LaunchSimt))      //
      CpuImpl(RunCpu)};
  return *impls;
}

absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl) {
  return ValidateAndDispatch(Validate, Implementations(), p, ctx, impl);
}

}  // namespace attnd::kernels::indexer_logits
