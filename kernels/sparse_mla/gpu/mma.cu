// Launcher of the tensor-core sparse MLA kernel: picks the instance (heads per CTA from H,
// d_qk), launches it with `splits` splits, then the combine when splits > 1.
#if defined(ATTND_GPU_CUDA)  // CUDA-only (mma.sync); compiles to nothing for HIP
#include "kernels/sparse_mla/gpu/launch.h"
#include "kernels/sparse_mla/gpu/mma.cuh"

namespace attnd::kernels::sparse_mla::gpu {

ATTND_SPARSE_MLA_MMA_INSTANCE(extern, 1, 512)
ATTND_SPARSE_MLA_MMA_INSTANCE(extern, 2, 512)
ATTND_SPARSE_MLA_MMA_INSTANCE(extern, 4, 512)
ATTND_SPARSE_MLA_MMA_INSTANCE(extern, 1, 576)
ATTND_SPARSE_MLA_MMA_INSTANCE(extern, 2, 576)
ATTND_SPARSE_MLA_MMA_INSTANCE(extern, 4, 576)
ATTND_SPARSE_MLA_MMA_FP8_INSTANCE(extern, 1)
ATTND_SPARSE_MLA_MMA_FP8_INSTANCE(extern, 2)
ATTND_SPARSE_MLA_MMA_FP8_INSTANCE(extern, 4)

namespace {

// m16 tiles per CTA: the fewest that cover H up to 64 (16, 32 or 64 heads; larger H takes
// several 64-head blocks).
int MTilesFor(int64_t heads) { return heads <= 16 ? 1 : heads <= 32 ? 2 : 4; }

template <int kDqk, bool kFp8, bool kExactP>
::attnd::gpu::Error LaunchInstance(const KernelArgs& a, ::attnd::gpu::Stream stream) {
  switch (MTilesFor(a.heads)) {
    case 1: return LaunchMmaInstance<1, kDqk, kFp8, kExactP>(a, stream);
    case 2: return LaunchMmaInstance<2, kDqk, kFp8, kExactP>(a, stream);
    default: return LaunchMmaInstance<4, kDqk, kFp8, kExactP>(a, stream);
  }
}

// The instance of a.exact_p's precision (HIGH: P hi + lo; FAST: bf16 P).
template <int kDqk, bool kFp8 = false>
::attnd::gpu::Error LaunchFor(const KernelArgs& a, ::attnd::gpu::Stream stream) {
  return a.exact_p ? LaunchInstance<kDqk, kFp8, true>(a, stream)
                   : LaunchInstance<kDqk, kFp8, false>(a, stream);
}

template <int kDqk, bool kFp8 = false>
KernelShape ShapeFor(int64_t heads) {
  switch (MTilesFor(heads)) {
    case 1: return MmaInstanceShape<1, kDqk, kFp8>();
    case 2: return MmaInstanceShape<2, kDqk, kFp8>();
    default: return MmaInstanceShape<4, kDqk, kFp8>();
  }
}

}  // namespace

KernelShape MmaShape(const Params& p) {
  if (p.kv_is_fp8()) return ShapeFor<576, true>(p.q.dim(1));
  return p.q.dim(2) == 576 ? ShapeFor<576>(p.q.dim(1)) : ShapeFor<512>(p.q.dim(1));
}

::attnd::gpu::Error LaunchSparseMlaMma(const Params& p, int splits, void* workspace,
                                       ::attnd::gpu::Stream stream, const int32_t* gate,
                                       int32_t gate_open) {
  if (p.q.dim(0) == 0) return ::attnd::gpu::kSuccess;
  KernelArgs a = MakeKernelArgs(p, splits, workspace);
  a.gate = gate;
  a.gate_open = gate_open;
  const ::attnd::gpu::Error e = p.kv_is_fp8()       ? LaunchFor<576, true>(a, stream)
                                : p.q.dim(2) == 576 ? LaunchFor<576>(a, stream)
                                                    : LaunchFor<512>(a, stream);
  if (e != ::attnd::gpu::kSuccess || splits == 1) return e;
  return LaunchSparseMlaCombine(p, splits, workspace, stream, gate, gate_open);
}

}  // namespace attnd::kernels::sparse_mla::gpu

#endif  // defined(ATTND_GPU_CUDA)
