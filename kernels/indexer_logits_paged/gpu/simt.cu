// The paged operator's SIMT kernel instantiation and launcher (portable CUDA/HIP).
#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/supports.h"
#include "kernels/indexer_logits/gpu/simt.cuh"
#include "kernels/indexer_logits_paged/gpu/launch.h"
#include "kernels/indexer_logits_paged/gpu/paged_problem.h"

namespace attnd::kernels::indexer_logits_paged::gpu {
namespace {

using ::attnd::gpu::CurrentDeviceSmCount;
using indexer_logits::gpu::ChooseSplit;
using indexer_logits::gpu::GridCtas;
using indexer_logits::gpu::IndexerSimtKernel;
using indexer_logits::gpu::kSimtBlockM;
using indexer_logits::gpu::kSimtBlockN;
using indexer_logits::gpu::kSimtThreads;
using indexer_logits::gpu::SimtShared;

bool Empty(const Params& p) { return p.q.dim(0) == 0 || p.logits.dim(1) == 0; }

IndexerProblem SplitSimt(const Params& p) {
  IndexerProblem x = MakePagedProblem(p);
  ChooseSplit(&x, kSimtBlockM / x.heads, kSimtBlockN,
              int64_t{indexer_logits::gpu::kSimtCtasPerSm} * CurrentDeviceSmCount());
  return x;
}

}  // namespace

bool SimtSupports(const Params& p, std::string* why) {
  if (p.block_size > kMaxBlockSize) {
    return Refuse(why, "block_size is ", p.block_size, ", want < 2^31");
  }
  if (!Empty(p) && GridCtas(SplitSimt(p)) >= indexer_logits::gpu::kMaxGridCtas) {
    return Refuse(why, "grid does not fit one dimension");
  }
  return true;
}

::attnd::gpu::Error LaunchSimt(const Params& p, ::attnd::gpu::Stream stream) {
  if (Empty(p)) return ::attnd::gpu::kSuccess;
  const IndexerProblem x = SplitSimt(p);
  IndexerSimtKernel<true>
      <<<static_cast<unsigned>(GridCtas(x)), kSimtThreads, sizeof(SimtShared), stream>>>(x);
  return ::attnd::gpu::GetLastError();
}

}  // namespace attnd::kernels::indexer_logits_paged::gpu
