// The paged operator's Hopper kernel (wgmma.cuh): instantiations for H 64 × wgmma N {64, 128,
// 256} and H 32 × N {64, 128}, the Supports rules, the cache's tensor map, the work split (even,
// or from the lengths in the balanced form) and the launchers. CUDA only; the kernels trap off
// sm_90a.
#if defined(ATTND_GPU_CUDA)

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/tma.h"
#include "kernels/common/supports.h"
#include "kernels/indexer_logits/gpu/wgmma_supports.h"
#include "kernels/indexer_logits_paged/balanced_split.h"
#include "kernels/indexer_logits_paged/gpu/launch.h"
#include "kernels/indexer_logits_paged/gpu/paged_problem.h"
#include "kernels/indexer_logits_paged/gpu/wgmma.cuh"

namespace attnd::kernels::indexer_logits_paged::gpu {
namespace {

using ::attnd::gpu::EncodeU8Map;

// The wgmma N of a query block: next_n · H (the (query, head) pairs of a request's tokens)
// rounded up to 64, 128 or 256 (128 at most for H32: eight queries' weights and accumulators
// would spill); more tokens than fit take several blocks.
int Columns(int64_t heads, int64_t next_n) {
  const int64_t pairs = heads * next_n;
  return pairs <= 64 ? 64 : (pairs <= 128 || heads == 32 ? 128 : 256);
}

// The cache's keys as {128 bytes, 64 slots, pages} with boxes of one page's 64 keys (the scales
// after them are read by the consumers directly). A single page gets the packed page stride.
bool EncodeCacheMap(const Params& p, WgmmaPagedArgs* args, std::string* why) {
  const uint64_t pages = static_cast<uint64_t>(p.kv_cache.dim(0));
  const cuuint64_t dims[3] = {kWgmmaPagedDim, kWgmmaPagedBlock, pages};
  constexpr uint64_t kPackedRow = kWgmmaPagedBlock * (kWgmmaPagedDim + 4);  // 8448, 16 · 528
  const cuuint64_t strides[2] = {
      kWgmmaPagedDim, pages > 1 ? static_cast<uint64_t>(p.kv_cache.stride(0)) : kPackedRow};
  const cuuint32_t box[3] = {kWgmmaPagedDim, kWgmmaPagedBlock, 1};
  return EncodeU8Map(&args->k_map, 3, p.kv_cache.data, dims, strides, box, why);
}

// Query blocks of Columns / H tokens; each request's columns cut into chunks of whole pages so
// that the grid fills the SMs (one CTA per SM) with the least wave quantisation: among chunk
// counts c giving at least 90 % of a wave, the one minimising waves(c) · (1/c + o), o ≈ 1.5 %
// the per-CTA pipeline fill relative to a whole 32K-token request (docs/KERNELS.md "Paged
// indexer on Hopper"). Shapes only: the same split for every replay.
IndexerProblem SplitWgmma(const Params& p, int columns) {
  IndexerProblem x = MakePagedProblem(p);
  x.queries_per_block = columns / x.heads;
  x.blocks_per_group = CeilDiv(x.rows_per_group, int64_t{x.queries_per_block});
  const int64_t blocks = x.num_groups * x.blocks_per_group;
  // CTA slots: kCtasPerSm per SM (two at N 64).
  const int64_t sms = ::attnd::gpu::CurrentDeviceSmCount() * (columns == 64 ? 2 : 1);
  const int64_t max_chunks = CeilDiv(x.num_cols, kWgmmaPagedBlock);  // one page at least
  int64_t best = 1;
  double best_cost = 0;
  for (int64_t c = 1; c <= max_chunks && blocks > 0; ++c) {
    const int64_t ctas = blocks * c;
    const double waves = static_cast<double>(CeilDiv(ctas, sms));
    const double cost = waves * (1.0 / static_cast<double>(c) + 0.015);
    const bool fills = 10 * ctas >= 9 * sms || c == max_chunks;
    if (fills && (best_cost == 0 || cost < best_cost)) {
      best = c;
      best_cost = cost;
    }
    if (10 * ctas >= 9 * sms && waves > 8) break;  // more chunks only add fills
  }
  x.key_chunk = CeilDiv(CeilDiv(x.num_cols, best), kWgmmaPagedBlock) * kWgmmaPagedBlock;
  x.num_chunks = CeilDiv(x.num_cols, x.key_chunk);
  return x;
}

// The balanced form's grid (balanced_split.h): the CTA slots, or one CTA a query block where
// the blocks are more; 0 where the blocks are past what its CTAs stage (the form refuses).
int64_t BalancedCtas(const IndexerProblem& x, int columns) {
  const int64_t blocks = x.num_groups * x.blocks_per_group;
  if (blocks < 1 || blocks > kPagedBalancedMaxBlocks) return 0;
  const int64_t slots = ::attnd::gpu::CurrentDeviceSmCount() * (columns == 64 ? 2 : 1);
  return blocks > slots ? blocks : slots;
}

template <int kHeads, int kColumns, bool kTwoProducers, bool kBalanced>
::attnd::gpu::Error LaunchInstance(const WgmmaPagedArgs& args, int64_t ctas,
                                   ::attnd::gpu::Stream stream) {
  using T = WgmmaPagedTile<kHeads, kColumns>;
  const auto kernel = IndexerPagedWgmmaKernel<kHeads, kColumns, kTwoProducers, kBalanced>;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  if (e != cudaSuccess) return e;
  // All of the unified L1 / shared storage as shared memory, so that kCtasPerSm CTAs fit.
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  kernel<<<static_cast<unsigned>(ctas), T::kThreads, T::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

bool Empty(const Params& p) { return p.q.dim(0) == 0 || p.logits.dim(1) == 0; }

}  // namespace

bool WgmmaSupports(const Params& p, std::string* why) {
  ::attnd::gpu::DeviceFacts facts;
  if (!indexer_logits::gpu::SupportsFp8WgmmaIndexer(p.precision, &facts, why)) return false;
  const int64_t h = p.q.dim(2), d = p.q.dim(3);
  if (KeyTileTokens(p.kv_cache_layout) != 1) {
    return Refuse(why, "kv_cache_layout is ", CacheLayoutName(p.kv_cache_layout),
                  ", want CACHE_LAYOUT_INDEXER_FP8_BLOCKS");
  }
  if (h != 32 && h != 64) return Refuse(why, "H is ", h, ", want 32 or 64");
  if (d != kWgmmaPagedDim) return Refuse(why, "D is ", d, ", want ", kWgmmaPagedDim);
  if (p.block_size != kWgmmaPagedBlock) {
    return Refuse(why, "block_size is ", p.block_size, ", want ", kWgmmaPagedBlock);
  }
  if (!Aligned(p.q.data, 16) || p.q.stride(0) % 16 != 0 || p.q.stride(1) % 16 != 0 ||
      p.q.stride(2) % 16 != 0 || !Aligned(p.kv_cache.data, 16) || p.kv_cache.stride(0) % 16 != 0) {
    return Refuse(why, "q and kv_cache must be 16-byte aligned (pointers and row strides: TMA)");
  }
  if (p.kv_cache.dim(0) < 1) return Refuse(why, "kv_cache has no blocks");
  // TMA page coordinates are 32-bit.
  if (p.kv_cache.dim(0) > kMaxInt32) {
    return Refuse(why, "kv_cache has ", p.kv_cache.dim(0), " blocks, want < 2^31 (TMA)");
  }
  const int columns = Columns(h, p.q.dim(1));
  const int smem = h == 32 ? (columns == 64 ? WgmmaPagedTile<32, 64>::kSmemBytes
                                            : WgmmaPagedTile<32, 128>::kSmemBytes)
                           : (columns == 64    ? WgmmaPagedTile<64, 64>::kSmemBytes
                              : columns == 128 ? WgmmaPagedTile<64, 128>::kSmemBytes
                                               : WgmmaPagedTile<64, 256>::kSmemBytes);
  if (facts.smem_optin < smem) {
    return Refuse(why, "needs ", smem, " bytes of shared memory per block, device allows ",
                  facts.smem_optin);
  }
  if (!Empty(p)) {
    WgmmaPagedArgs args;
    if (!EncodeCacheMap(p, &args, why)) return false;
    if (GridCtas(SplitWgmma(p, columns)) >= indexer_logits::gpu::kMaxGridCtas) {
      return Refuse(why, "grid does not fit one dimension");
    }
  }
  return true;
}

bool WgmmaBalSupports(const Params& p, std::string* why) {
  if (!WgmmaSupports(p, why)) return false;
  if (Empty(p)) return true;
  const int columns = Columns(p.q.dim(2), p.q.dim(1));
  const IndexerProblem x = SplitWgmma(p, columns);
  if (BalancedCtas(x, columns) == 0) {
    return Refuse(why, "the split from the lengths takes at most ", kPagedBalancedMaxBlocks,
                  " query blocks, the call has ", x.num_groups * x.blocks_per_group);
  }
  return true;
}

namespace {

template <bool kTwoProducers, bool kBalanced = false>
::attnd::gpu::Error LaunchForm(const Params& p, ::attnd::gpu::Stream stream) {
  if (Empty(p)) return cudaSuccess;
  WgmmaPagedArgs args;
  if (!EncodeCacheMap(p, &args, nullptr)) return cudaErrorInvalidValue;  // refused by Supports
  const int columns = Columns(p.q.dim(2), p.q.dim(1));
  args.p = SplitWgmma(p, columns);
  // The balanced kernel ignores the chunks of the even split and takes its grid's CTAs.
  const int64_t ctas = kBalanced ? BalancedCtas(args.p, columns) : GridCtas(args.p);
  if (ctas < 1) return cudaErrorInvalidValue;  // refused by WgmmaBalSupports
  switch (args.p.heads * 1000 + columns) {
    case 32064: return LaunchInstance<32, 64, kTwoProducers, kBalanced>(args, ctas, stream);
    case 32128: return LaunchInstance<32, 128, kTwoProducers, kBalanced>(args, ctas, stream);
    case 64064: return LaunchInstance<64, 64, kTwoProducers, kBalanced>(args, ctas, stream);
    case 64128: return LaunchInstance<64, 128, kTwoProducers, kBalanced>(args, ctas, stream);
    case 64256: return LaunchInstance<64, 256, kTwoProducers, kBalanced>(args, ctas, stream);
  }
  return cudaErrorInvalidValue;  // refused by WgmmaSupports
}

}  // namespace

::attnd::gpu::Error LaunchWgmma(const Params& p, ::attnd::gpu::Stream stream) {
  return LaunchForm<false>(p, stream);
}

::attnd::gpu::Error LaunchWgmma2p(const Params& p, ::attnd::gpu::Stream stream) {
  return LaunchForm<true>(p, stream);
}

::attnd::gpu::Error LaunchWgmmaBal(const Params& p, ::attnd::gpu::Stream stream) {
  return LaunchForm</*kTwoProducers=*/false, /*kBalanced=*/true>(p, stream);
}

}  // namespace attnd::kernels::indexer_logits_paged::gpu

#endif  // defined(ATTND_GPU_CUDA)
