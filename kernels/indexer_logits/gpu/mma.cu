// The prefill operator's tensor-core kernel: instantiations for H {32, 64} × D {64, 128}, the
// Supports rules and the launcher. CUDA only (inline PTX): compiles to nothing in the HIP check.
#if defined(ATTND_GPU_CUDA)

#include <cstdint>

#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/supports.h"
#include "kernels/indexer_logits/gpu/launch.h"
#include "kernels/indexer_logits/gpu/mma.cuh"
#include "kernels/indexer_logits/gpu/prefill_problem.h"

namespace attnd::kernels::indexer_logits::gpu {
namespace {
using ::attnd::gpu::CurrentDeviceCapability;
using ::attnd::gpu::CurrentDeviceSmCount;

constexpr int kBlockM = 256;  // 4 queries at H64, 8 at H32 share each key tile
constexpr int kStages = 3;

IndexerProblem SplitMma(const Params& p) {
  IndexerProblem x = MakePrefillProblem(p);
  // One CTA per SM (shared memory); split keys only when there are fewer than two waves.
  ChooseSplit(&x, kBlockM / x.heads, kMmaBlockN, int64_t{2} * CurrentDeviceSmCount());
  return x;
}

template <int kHeads, int kDim>
::attnd::gpu::Error Launch(const IndexerProblem& x, ::attnd::gpu::Stream stream) {
  using L = MmaLayout<kHeads, kDim, kBlockM, kStages>;
  const auto kernel = IndexerMmaKernel<kHeads, kDim, kBlockM, kStages, /*kPaged=*/false>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kBytes);
  if (e != cudaSuccess) return e;
  kernel<<<static_cast<unsigned>(GridCtas(x)), kMmaThreads, L::kBytes, stream>>>(x);
  return cudaGetLastError();
}

}  // namespace

bool MmaSupports(const Params& p, std::string* why) {
  const int64_t h = p.q.dim(1), d = p.q.dim(2);
  if (h != 32 && h != 64) {
    return Refuse(why, "H is ", h, ", want 32 or 64");
  }
  if (d != 64 && d != 128) {
    return Refuse(why, "D is ", d, ", want 64 or 128");
  }
  if (!Aligned(p.q.data, 16) || p.q.stride(0) % 16 != 0 || p.q.stride(1) % 16 != 0 ||
      !Aligned(p.k.data, 16) || p.k.stride(0) % 16 != 0) {
    return Refuse(why, "q and k must be 16-byte aligned (pointers and row strides)");
  }
  if (!Aligned(p.k_scale.data, 4)) {
    return Refuse(why, "k_scale must be 4-byte aligned");
  }
  const int capability = CurrentDeviceCapability();
  if (capability < kMmaMinCapability) {
    return Refuse(why, "compute capability ", capability, ", want >= ", kMmaMinCapability);
  }
  if (p.q.dim(0) > 0 && p.k.dim(0) > 0 && GridCtas(SplitMma(p)) >= kMaxGridCtas) {
    return Refuse(why, "grid does not fit one dimension");
  }
  return true;
}

::attnd::gpu::Error LaunchMma(const Params& p, ::attnd::gpu::Stream stream) {
  if (p.q.dim(0) == 0 || p.k.dim(0) == 0) return cudaSuccess;
  const IndexerProblem x = SplitMma(p);
  switch (x.heads * 1000 + x.dim) {
    case 32064: return Launch<32, 64>(x, stream);
    case 32128: return Launch<32, 128>(x, stream);
    case 64064: return Launch<64, 64>(x, stream);
    case 64128: return Launch<64, 128>(x, stream);
  }
  return cudaErrorInvalidValue;  // refused by MmaSupports
}

}  // namespace attnd::kernels::indexer_logits::gpu

#endif  // defined(ATTND_GPU_CUDA)
