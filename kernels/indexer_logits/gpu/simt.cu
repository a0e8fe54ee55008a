// The prefill operator's SIMT kernel instantiation and launcher (portable CUDA/HIP).
#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/supports.h"
#include "kernels/indexer_logits/gpu/launch.h"
#include "kernels/indexer_logits/gpu/prefill_problem.h"
#include "kernels/indexer_logits/gpu/simt.cuh"

namespace attnd::kernels::indexer_logits::gpu {
namespace {
using ::attnd::gpu::CurrentDeviceSmCount;

IndexerProblem SplitSimt(const Params& p) {
  IndexerProblem x = MakePrefillProblem(p);
  ChooseSplit(&x, kSimtBlockM / x.heads, kSimtBlockN,
              int64_t{kSimtCtasPerSm} * CurrentDeviceSmCount());
  return x;
}

}  // namespace

bool SimtSupports(const Params& p, std::string* why) {
  if (p.q.dim(0) == 0 || p.k.dim(0) == 0) return true;  // nothing to launch
  const IndexerProblem x = SplitSimt(p);
  if (GridCtas(x) >= kMaxGridCtas) {
    return Refuse(why, "grid of ", GridCtas(x), " CTAs does not fit one dimension");
  }
  return true;
}

::attnd::gpu::Error LaunchSimt(const Params& p, ::attnd::gpu::Stream stream) {
  if (p.q.dim(0) == 0 || p.k.dim(0) == 0) return ::attnd::gpu::kSuccess;
  const IndexerProblem x = SplitSimt(p);
  IndexerSimtKernel<false>
      <<<static_cast<unsigned>(GridCtas(x)), kSimtThreads, sizeof(SimtShared), stream>>>(x);
  return ::attnd::gpu::GetLastError();
}

}  // namespace attnd::kernels::indexer_logits::gpu
