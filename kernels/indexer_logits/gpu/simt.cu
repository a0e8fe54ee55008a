// The prefill operator's SIMT kernel instantiation and launcher (portable CUDA/HIP).
#include "absl/strings/str_cat.h"
#include "kernels/indexer_logits/gpu/device_info.h"
#include "kernels/indexer_logits/gpu/launch.h"
#include "kernels/indexer_logits/gpu/prefill_problem.h"
#include "kernels/indexer_logits/gpu/simt.cuh"

namespace attnd::kernels::indexer_logits::gpu_impl {
namespace {

constexpr int64_t kMaxGridCtas = int64_t{1} << 31;  // exclusive
constexpr int kSimtCtasPerSm = 4;                   // for the key-chunk split

IndexerProblem SplitSimt(const Params& p) {
  IndexerProblem x = MakePrefillProblem(p);
  ChooseSplit(&x, kSimtColumns / x.heads, kSimtKeys,
              int64_t{kSimtCtasPerSm} * CurrentDeviceSmCount());
  return x;
}

}  // namespace

bool SimtSupports(const Params& p, std::string* why) {
  if (p.q.dim(0) == 0 || p.k.dim(0) == 0) return true;  // nothing to launch
  const IndexerProblem x = SplitSimt(p);
  if (GridCtas(x) >= kMaxGridCtas) {
    *why = absl::StrCat("grid of ", GridCtas(x), " CTAs does not fit one dimension");
    return false;
  }
  return true;
}

gpu::Error LaunchSimt(const Params& p, gpu::Stream stream) {
  if (p.q.dim(0) == 0 || p.k.dim(0) == 0) return gpu::kSuccess;
  const IndexerProblem x = SplitSimt(p);
  IndexerSimtKernel<false>
      <<<static_cast<unsigned>(GridCtas(x)), kSimtThreads, sizeof(SimtShared), stream>>>(x);
  return gpu::GetLastError();
}

}  // namespace attnd::kernels::indexer_logits::gpu_impl
