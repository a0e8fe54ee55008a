// Launcher, Supports and split plan of the low-head sparse MLA kernel (mma_lowh.cuh): picks the
// instance (head slots from H, d_qk), launches it with `splits` splits, then the combine when
// splits > 1.
#if defined(ATTND_GPU_CUDA)  // CUDA-only (mma.sync); compiles to nothing for HIP
#include <algorithm>
#include <string>

#include "kernels/common/gpu/device_checks.h"
#include "kernels/common/math.h"
#include "kernels/sparse_mla/gpu/launch.h"
#include "kernels/sparse_mla/gpu/mma_lowh.cuh"
#include "kernels/sparse_mla/gpu/plan.h"

namespace attnd::kernels::sparse_mla::gpu {

ATTND_SPARSE_MLA_LOWH_INSTANCE(extern, 8, 512)
ATTND_SPARSE_MLA_LOWH_INSTANCE(extern, 16, 512)
ATTND_SPARSE_MLA_LOWH_INSTANCE(extern, 32, 512)
ATTND_SPARSE_MLA_LOWH_INSTANCE(extern, 8, 576)
ATTND_SPARSE_MLA_LOWH_INSTANCE(extern, 16, 576)
ATTND_SPARSE_MLA_LOWH_INSTANCE(extern, 32, 576)

namespace {

constexpr int64_t kLowhMaxHeads = 32;
constexpr int kLowhRows = 64;  // stacked (token, head) rows per CTA

// Head slots per token: H rounded up to 8, 16 or 32.
int SlotsFor(int64_t heads) { return heads <= 8 ? 8 : heads <= 16 ? 16 : 32; }

template <int kDqk, bool kExactP>
::attnd::gpu::Error LaunchInstance(const KernelArgs& a, ::attnd::gpu::Stream stream) {
  switch (SlotsFor(a.heads)) {
    case 8: return LaunchLowhInstance<8, kDqk, kExactP>(a, stream);
    case 16: return LaunchLowhInstance<16, kDqk, kExactP>(a, stream);
    default: return LaunchLowhInstance<32, kDqk, kExactP>(a, stream);
  }
}

// The instance of a.exact_p's precision (HIGH: P hi + lo; FAST: bf16 P).
template <int kDqk>
::attnd::gpu::Error LaunchFor(const KernelArgs& a, ::attnd::gpu::Stream stream) {
  return a.exact_p ? LaunchInstance<kDqk, true>(a, stream) : LaunchInstance<kDqk, false>(a, stream);
}

template <int kDqk>
KernelShape ShapeFor(int64_t heads) {
  switch (SlotsFor(heads)) {
    case 8: return LowhInstanceShape<8, kDqk>();
    case 16: return LowhInstanceShape<16, kDqk>();
    default: return LowhInstanceShape<32, kDqk>();
  }
}

KernelShape LowhShape(const Params& p) {
  return p.q.dim(2) == 576 ? ShapeFor<576>(p.q.dim(1)) : ShapeFor<512>(p.q.dim(1));
}

}  // namespace

bool MmaLowhSupports(const Params& p, std::string* why) {
  ::attnd::gpu::DeviceFacts d;
  if (!CurrentDevice(&d, why) || !RunsMmaSync(d, why)) return false;
  if (p.kv_is_fp8()) return Refuse(why, "kv: the low-head kernel reads a bf16 cache only");
  if (p.q.dim(1) > kLowhMaxHeads) {
    return Refuse(why, "q: dim 1 is ", p.q.dim(1), ", the low-head kernel takes at most 32 heads");
  }
  const KernelShape shape = LowhShape(p);
  return FitsDevice(shape.smem_bytes, shape.ctas_per_sm, d, why);
}

// GpuSplits' heuristic (launch.h) with work items = CTAs = ceil(T / tokens per CTA).
int MmaLowhSplits(const Params& p) {
  ::attnd::gpu::DeviceFacts d;
  if (p.q.dim(0) == 0 || !::attnd::gpu::CurrentDeviceFacts(&d))
    return 1;  // before the occupancy query
  const int64_t per_cta = kLowhRows / SlotsFor(p.q.dim(1));
  const int64_t slots = static_cast<int64_t>(d.sm_count) * std::max(LowhShape(p).ctas_per_sm, 1);
  return SplitsForItems(p, CeilDiv(p.q.dim(0), per_cta), slots);
}

::attnd::gpu::Error LaunchSparseMlaMmaLowh(const Params& p, int splits, void* workspace,
                                           ::attnd::gpu::Stream stream, const int32_t* gate,
                                           int32_t gate_open) {
  if (p.q.dim(0) == 0) return ::attnd::gpu::kSuccess;
  KernelArgs a = MakeKernelArgs(p, splits, workspace);
  a.gate = gate;
  a.gate_open = gate_open;
  const ::attnd::gpu::Error e =
      p.q.dim(2) == 576 ? LaunchFor<576>(a, stream) : LaunchFor<512>(a, stream);
  if (e != ::attnd::gpu::kSuccess || splits == 1) return e;
  return LaunchSparseMlaCombine(p, splits, workspace, stream, gate, gate_open);
}

}  // namespace attnd::kernels::sparse_mla::gpu

#endif  // defined(ATTND_GPU_CUDA)
