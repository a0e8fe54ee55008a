// The paged operator's SIMT kernel instantiation and launcher (portable CUDA/HIP).
#include "absl/strings/str_cat.h"
#include "kernels/indexer_logits/gpu/device_info.h"
#include "kernels/indexer_logits/gpu/simt.cuh"
#include "kernels/indexer_logits_paged/gpu/launch.h"
#include "kernels/indexer_logits_paged/gpu/paged_problem.h"

namespace attnd::kernels::indexer_logits_paged::gpu_impl {
namespace {

using indexer_logits::gpu_impl::ChooseSplit;
using indexer_logits::gpu_impl::CurrentDeviceSmCount;
using indexer_logits::gpu_impl::GridCtas;
using indexer_logits::gpu_impl::IndexerSimtKernel;
using indexer_logits::gpu_impl::kSimtColumns;
using indexer_logits::gpu_impl::kSimtKeys;
using indexer_logits::gpu_impl::kSimtThreads;
using indexer_logits::gpu_impl::SimtShared;

constexpr int64_t kMaxGridCtas = int64_t{1} << 31;  // exclusive
constexpr int kSimtCtasPerSm = 4;                   // for the key-chunk split

bool Empty(const Params& p) { return p.q.dim(0) == 0 || p.logits.dim(1) == 0; }

IndexerProblem SplitSimt(const Params& p) {
  IndexerProblem x = MakePagedProblem(p);
  ChooseSplit(&x, kSimtColumns / x.heads, kSimtKeys,
              int64_t{kSimtCtasPerSm} * CurrentDeviceSmCount());
  return x;
}

}  // namespace

bool SimtSupports(const Params& p, std::string* why) {
  if (p.block_size > kMaxBlockSize) {
    *why = absl::StrCat("block_size is ", p.block_size, ", want < 2^31");
    return false;
  }
  if (!Empty(p) && GridCtas(SplitSimt(p)) >= kMaxGridCtas) {
    *why = "grid does not fit one dimension";
    return false;
  }
  return true;
}

gpu::Error LaunchSimt(const Params& p, gpu::Stream stream) {
  if (Empty(p)) return gpu::kSuccess;
  const IndexerProblem x = SplitSimt(p);
  IndexerSimtKernel<true>
      <<<static_cast<unsigned>(GridCtas(x)), kSimtThreads, sizeof(SimtShared), stream>>>(x);
  return gpu::GetLastError();
}

}  // namespace attnd::kernels::indexer_logits_paged::gpu_impl
