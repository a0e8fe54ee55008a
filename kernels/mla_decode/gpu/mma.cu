// Launcher of the tensor-core MLA decode kernel (CUDA only): picks the instance (rows per CTA
// from s_q · H, d_qk, precision, bf16 or per-tensor FP8 cache) and runs it with `splits`
// splits, then the combine when split.
#if defined(ATTND_GPU_CUDA)
#include "kernels/mla_decode/gpu/launch.h"
#include "kernels/mla_decode/gpu/mma.cuh"
#include "kernels/mla_decode/gpu/plan.h"

namespace attnd::kernels::mla_decode::gpu {

ATTND_MLA_DECODE_MMA_INSTANCE(extern, 1, 512, true)
ATTND_MLA_DECODE_MMA_INSTANCE(extern, 2, 512, true)
ATTND_MLA_DECODE_MMA_INSTANCE(extern, 4, 512, true)
ATTND_MLA_DECODE_MMA_INSTANCE(extern, 1, 576, true)
ATTND_MLA_DECODE_MMA_INSTANCE(extern, 2, 576, true)
ATTND_MLA_DECODE_MMA_INSTANCE(extern, 4, 576, true)
ATTND_MLA_DECODE_MMA_INSTANCE(extern, 1, 512, false)
ATTND_MLA_DECODE_MMA_INSTANCE(extern, 2, 512, false)
ATTND_MLA_DECODE_MMA_INSTANCE(extern, 4, 512, false)
ATTND_MLA_DECODE_MMA_INSTANCE(extern, 1, 576, false)
ATTND_MLA_DECODE_MMA_INSTANCE(extern, 2, 576, false)
ATTND_MLA_DECODE_MMA_INSTANCE(extern, 4, 576, false)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(extern, 1, 512, true)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(extern, 2, 512, true)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(extern, 4, 512, true)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(extern, 1, 576, true)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(extern, 2, 576, true)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(extern, 4, 576, true)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(extern, 1, 512, false)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(extern, 2, 512, false)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(extern, 4, 512, false)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(extern, 1, 576, false)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(extern, 2, 576, false)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(extern, 4, 576, false)

namespace {

// m16 tiles per CTA: the fewest that cover s_q · H up to 64 (16, 32 or 64 rows; more rows take
// several 64-row blocks, each reading the request's pages).
template <int kDqk, bool kExactP, bool kFp8>
KernelShape ShapeFor(int64_t rows) {
  if (rows <= 16) return MmaInstanceShape<1, kDqk, kExactP, kFp8>();
  if (rows <= 32) return MmaInstanceShape<2, kDqk, kExactP, kFp8>();
  return MmaInstanceShape<4, kDqk, kExactP, kFp8>();
}

// The instance of p's precision (HIGH: P hi + lo; FAST: bf16 P) and cache (bf16 or per-tensor
// FP8).
template <int kDqk>
KernelShape ShapeFor(const Params& p, int64_t rows) {
  const bool high = p.precision == Precision::kHigh;
  if (p.kv_is_fp8()) {
    return high ? ShapeFor<kDqk, true, true>(rows) : ShapeFor<kDqk, false, true>(rows);
  }
  return high ? ShapeFor<kDqk, true, false>(rows) : ShapeFor<kDqk, false, false>(rows);
}

}  // namespace

KernelShape MmaShape(const Params& p) {
  const int64_t rows = p.q.dim(1) * p.q.dim(2);
  if (p.q.dim(3) == 576) return ShapeFor<576>(p, rows);
  if (p.q.dim(3) == 512) return ShapeFor<512>(p, rows);
  return KernelShape{};
}

::attnd::gpu::Error LaunchMlaDecodeMma(const Params& p, int splits, void* workspace,
                                       ::attnd::gpu::Stream stream) {
  return LaunchDecode(p, MmaShape(p), splits, workspace, stream);
}

}  // namespace attnd::kernels::mla_decode::gpu
#endif  // ATTND_GPU_CUDA
