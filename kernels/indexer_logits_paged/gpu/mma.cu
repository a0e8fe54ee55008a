// The paged operator's tensor-core kernel: instantiations for H {32, 64} × D {64, 128}, the
// Supports rules and the launcher. CUDA only (inline PTX): compiles to nothing in the HIP check.
#if defined(ATTND_GPU_CUDA)

#include <cstdint>

#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/supports.h"
#include "kernels/indexer_logits/gpu/mma.cuh"
#include "kernels/indexer_logits_paged/gpu/launch.h"
#include "kernels/indexer_logits_paged/gpu/paged_problem.h"

namespace attnd::kernels::indexer_logits_paged::gpu {
namespace {

using ::attnd::gpu::CurrentDeviceCapability;
using ::attnd::gpu::CurrentDeviceSmCount;
using indexer_logits::gpu::ChooseSplit;
using indexer_logits::gpu::GridCtas;
using indexer_logits::gpu::IndexerMmaKernel;
using indexer_logits::gpu::kMmaBlockN;
using indexer_logits::gpu::kMmaThreads;
using indexer_logits::gpu::MmaLayout;

// Decode is memory-bound: fewer columns (next_n · H <= 128 per CTA at H64) leave room for four
// key stages (~100 KB of pages in flight per SM).
constexpr int kBlockM = 128;
constexpr int kStages = 4;

bool Empty(const Params& p) { return p.q.dim(0) == 0 || p.logits.dim(1) == 0; }

IndexerProblem SplitMma(const Params& p) {
  IndexerProblem x = MakePagedProblem(p);
  ChooseSplit(&x, kBlockM / x.heads, kMmaBlockN, int64_t{4} * CurrentDeviceSmCount());
  return x;
}

template <int kHeads, int kDim>
::attnd::gpu::Error Launch(const IndexerProblem& x, ::attnd::gpu::Stream stream) {
  using L = MmaLayout<kHeads, kDim, kBlockM, kStages>;
  const auto kernel = IndexerMmaKernel<kHeads, kDim, kBlockM, kStages, /*kPaged=*/true>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kBytes);
  if (e != cudaSuccess) return e;
  kernel<<<static_cast<unsigned>(GridCtas(x)), kMmaThreads, L::kBytes, stream>>>(x);
  return cudaGetLastError();
}

}  // namespace

bool MmaSupports(const Params& p, std::string* why) {
  const int64_t h = p.q.dim(2), d = p.q.dim(3);
  if (KeyTileTokens(p.kv_cache_layout) != 1) {  // a ROCm layout: the portable kernel reads it
    return Refuse(why, "kv_cache_layout is ", CacheLayoutName(p.kv_cache_layout),
                  ", want CACHE_LAYOUT_INDEXER_FP8_BLOCKS");
  }
  if (h != 32 && h != 64) {
    return Refuse(why, "H is ", h, ", want 32 or 64");
  }
  if (d != 64 && d != 128) {
    return Refuse(why, "D is ", d, ", want 64 or 128");
  }
  if (!Aligned(p.q.data, 16) || p.q.stride(0) % 16 != 0 || p.q.stride(1) % 16 != 0 ||
      p.q.stride(2) % 16 != 0 || !Aligned(p.kv_cache.data, 16) || p.kv_cache.stride(0) % 16 != 0) {
    return Refuse(why, "q and kv_cache must be 16-byte aligned (pointers and row strides)");
  }
  if (p.kv_cache.dim(0) < 1) {
    return Refuse(why, "kv_cache has no blocks");  // cp.async needs a mapped fallback address
  }
  if (p.block_size > kMaxBlockSize) {
    return Refuse(why, "block_size is ", p.block_size, ", want < 2^31");
  }
  const int capability = CurrentDeviceCapability();
  if (capability < indexer_logits::gpu::kMmaMinCapability) {
    return Refuse(why, "compute capability ", capability,
                  ", want >= ", indexer_logits::gpu::kMmaMinCapability);
  }
  if (!Empty(p) && GridCtas(SplitMma(p)) >= indexer_logits::gpu::kMaxGridCtas) {
    return Refuse(why, "grid does not fit one dimension");
  }
  return true;
}

::attnd::gpu::Error LaunchMma(const Params& p, ::attnd::gpu::Stream stream) {
  if (Empty(p)) return cudaSuccess;
  const IndexerProblem x = SplitMma(p);
  switch (x.heads * 1000 + x.dim) {
    case 32064: return Launch<32, 64>(x, stream);
    case 32128: return Launch<32, 128>(x, stream);
    case 64064: return Launch<64, 64>(x, stream);
    case 64128: return Launch<64, 128>(x, stream);
  }
  return cudaErrorInvalidValue;  // refused by MmaSupports
}

}  // namespace attnd::kernels::indexer_logits_paged::gpu

#endif  // defined(ATTND_GPU_CUDA)
