// Launcher of the tensor-core MLA prefill kernel (CUDA only): picks the instance for
// (d_qk, d_v) and runs the schedule, then the kernel.
#if defined(ATTND_GPU_CUDA)
#include "kernels/mla_prefill/gpu/launch.h"
#include "kernels/mla_prefill/gpu/mma.cuh"
#include "kernels/mla_prefill/gpu/plan.h"

namespace attnd::kernels::mla_prefill::gpu {

ATTND_MLA_PREFILL_MMA_INSTANCE(extern, 192, 128)
ATTND_MLA_PREFILL_MMA_INSTANCE(extern, 64, 64)
ATTND_MLA_PREFILL_MMA_INSTANCE(extern, 128, 128)

namespace {

// The instance of `precision` (HIGH: P hi + lo; FAST: bf16 P).
template <int kDqk, int kDv>
KernelShape ShapeFor(Precision precision) {
  return precision == Precision::kHigh ? MmaInstanceShape<kDqk, kDv, true>()
                                       : MmaInstanceShape<kDqk, kDv, false>();
}

}  // namespace

KernelShape MmaShape(const Params& p) {
  const int64_t d_qk = p.q.dim(2), d_v = p.v.dim(2);
  if (d_qk == 192 && d_v == 128) return ShapeFor<192, 128>(p.precision);
  if (d_qk == 64 && d_v == 64) return ShapeFor<64, 64>(p.precision);
  if (d_qk == 128 && d_v == 128) return ShapeFor<128, 128>(p.precision);
  return KernelShape{};
}

::attnd::gpu::Error LaunchMlaPrefillMma(const Params& p, void* workspace,
                                        ::attnd::gpu::Stream stream) {
  return LaunchPrefill(p, MmaShape(p), workspace, stream);
}

}  // namespace attnd::kernels::mla_prefill::gpu
#endif  // ATTND_GPU_CUDA
