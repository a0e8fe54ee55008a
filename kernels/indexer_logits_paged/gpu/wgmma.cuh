// The Hopper paged (decode) indexer kernel (CUDA sm_90a: TMA, fp8 wgmma, mbarriers, setmaxnreg;
// docs/KERNELS.md "Paged indexer on Hopper (cuda_wgmma)"). H in {32, 64}, D = 128, block_size 64
// in the blocks layout, precision FAST.
//
// CTA = one query block of a request (kQueries = kColumns / H of its next_n tokens) × one key
// chunk (a run of whole 64-token pages), three warpgroups:
//   WG2 (producer)  thread 0 of warp 0: for each page of the chunk that some row sees, writes its
//                   id from the block table (read once) into the stage's slot and, when it is a
//                   valid page, a TMA of its 64 keys (64 rows × 128 bytes, 128-byte swizzle) and
//                   a bulk copy of their 64 scales into the stage; a masked page only arrives.
//                   At kColumns 64 the producer warp's lanes read the table entries, 32 pages
//                   at a time and one batch ahead, and thread 0 takes each by a shuffle.
//                   Warps 1-3: −inf on the chunk's columns past the computed pages (no row of
//                   the block sees them). kTwoProducers: lanes 0 of warps 0 and 1 load the even
//                   and the odd pages, warps 2-3 fill.
//   WG0, WG1        take the pages alternately (page i of the chunk goes to WG i % 2), so one's
//   (consumers)     epilogue runs under the other's MMA: S = K·Qᵀ for the page (m64nNk32 e4m3,
//                   N = kColumns = the block's (query, head) pairs, four k-steps over D = 128,
//                   both operands K-major in shared memory); a thread holds keys 16·warp + lane/4
//                   (+8) × kColumns / 4 columns: Σ_h w·relu(s) per query in registers, the sum
//                   over the lane quad, × the key's scale (from the stage), stored inside the
//                   row's window and −inf past it (or everywhere on a masked page).
// q is copied into shared memory by every thread before the roles split (swizzled by hand, rows
// of queries past the block zero), so no q tensor map is needed and a request's block never
// reads another request's q. Output offsets are 64-bit; the TMA page coordinate is 32-bit.
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/indexer_logits_paged/gpu/wgmma.cuh is CUDA-only"
#endif

#include <cuda.h>
#include <stdint.h>

#include "kernels/common/gpu/tiles.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/gpu/wgmma_fp8.cuh"
#include "kernels/common/math.h"
#include "kernels/indexer_logits/gpu/common.cuh"
#include "kernels/indexer_logits/gpu/problem.h"
#include "kernels/indexer_logits_paged/balanced_split.h"

namespace attnd::kernels::indexer_logits_paged::gpu {

using indexer_logits::gpu::IndexerProblem;

// The kernel's argument block: the cache's tensor map (u8 {128 bytes, 64 slots, pages}, boxes
// of one page's keys, 128-byte swizzle) and the problem.
struct WgmmaPagedArgs {
  CUtensorMap k_map;
  IndexerProblem p;
};

inline constexpr int kWgmmaPagedDim = 128;       // head dim: one swizzled 128-byte row
inline constexpr int64_t kWgmmaPagedBlock = 64;  // tokens per page = keys per tile (wgmma M)

template <int kHeads, int kColumns>
struct WgmmaPagedTile {
  static_assert(kHeads == 32 || kHeads == 64, "the paged wgmma indexer needs H in {32, 64}");
  static_assert(kColumns == 64 || kColumns == 128 || kColumns == 256, "wgmma N in {64,128,256}");
  static_assert(kColumns % kHeads == 0, "whole queries per block");
  static constexpr int kThreads = 384;                // WG0, WG1 consumers; WG2 producer and filler
  static constexpr int kQueries = kColumns / kHeads;  // query rows per CTA (1 to 8)
  static constexpr int kGroups = kColumns / 8;        // 8-column groups (j) of the accumulator
  // Queries whose logits a lane stores: with four or more, query 4v + t4 of each group of four
  // (the quad transpose-sum leaves it in lane t4); with fewer, query t4 in lanes t4 < kQueries.
  static constexpr int kOut = kQueries >= 4 ? kQueries / 4 : 1;
  // N 64 (one token of H64, or of H32 padded): two CTAs per SM (more pages in flight per SM,
  // every SM busy at B128: docs/KERNELS.md "Paged indexer on Hopper"), 12 stages each and no
  // register reallocation (the whole kernel fits 80 registers); wider N: one CTA, 16 stages.
  static constexpr int kCtasPerSm = kColumns == 64 ? 2 : 1;
  static constexpr int kStages = kCtasPerSm == 2 ? 12 : 16;
  static constexpr int kSteps = kWgmmaPagedDim / 32;  // k32 steps
  static constexpr uint32_t kQBytes = kColumns * kWgmmaPagedDim;
  static constexpr uint32_t kTileBytes = kWgmmaPagedBlock * kWgmmaPagedDim;  // 8 KiB
  static constexpr uint32_t kScaleBytes = kWgmmaPagedBlock * 4;  // the page's 64 f32 scales
  // Shared memory (bytes; q and tiles 1024-byte aligned): q | k stages | scale stages |
  // mbarriers full[kStages], empty[kStages] | page id per stage.
  static constexpr uint32_t kQOffset = 0;
  static constexpr uint32_t kKOffset = kQBytes;
  static constexpr uint32_t kScaleOffset = kKOffset + kStages * kTileBytes;
  static constexpr uint32_t kBarOffset = kScaleOffset + kStages * kScaleBytes;
  static constexpr uint32_t kPageOffset = kBarOffset + 2 * kStages * 8;
  static constexpr int kSmemBytes = static_cast<int>(kPageOffset + kStages * 4);
  static constexpr int kProducerRegs = 56, kConsumerRegs = 224;
  static constexpr uint32_t kEmptyCount = 4;  // one arrival per warp of the page's consumer
  // setmaxnreg moves registers within the launch allocation only (tiles.h kSm90Regs384).
  static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * kSm90Regs384, "register budget");
  static_assert(kStages % 2 == 0, "a stage always serves the same consumer");
};

// Σ over the lane quad of v[0..kN) for kN in {1, 2}: every lane of the quad ends with the sums.
template <int kN>
__device__ __forceinline__ void QuadSum(float (&v)[kN]) {
#pragma unroll
  for (int u = 0; u < kN; ++u) {
    v[u] += ::attnd::gpu::ShflXor(v[u], 1);
    v[u] += ::attnd::gpu::ShflXor(v[u], 2);
  }
}

// v[u] for a lane-dependent u < kN without a local-memory array (kN in {1, 2}).
template <int kN>
__device__ __forceinline__ float SelectQuery(const float (&v)[kN], int u) {
  float r = v[0];
#pragma unroll
  for (int i = 1; i < kN; ++i) r = u == i ? v[i] : r;
  return r;
}

// The balanced split (kBalanced, the opt-in `cuda_wgmma_bal` form; balanced_split.h and docs/
// KERNELS.md "A split from the lengths"): this CTA's query block and chunk, computed from the
// lengths by every CTA alike (all kThreads threads; `scratch`: 4 · (blocks + 1) + 296 bytes of
// shared memory, 8-byte aligned, that nothing else uses yet). `*none` when the pieces are fewer
// than the CTAs and this one has no piece. Each block's page count is read once into shared memory,
// so the CTA's plan is consistent even if the lengths change while it runs (a client racing its own
// inputs gets wrong logits, never a write outside its rows and [0, N)).
template <int kThreads>
__device__ __forceinline__ indexer_logits::gpu::BlockWork BalancedBlock(const IndexerProblem& p,
                                                                        int32_t* scratch,
                                                                        bool* none) {
  using indexer_logits::gpu::RowWindow;
  static_assert(kThreads == 32 * kPagedSearchWarps, "a search candidate per warp");
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Block counts fit 32 bits here (<= kPagedBalancedMaxBlocks), so the divisions below do too.
  const int32_t blocks = static_cast<int32_t>(p.num_groups * p.blocks_per_group);
  const int32_t per_group = static_cast<int32_t>(p.blocks_per_group);
  int32_t* pages = scratch;  // n_j
  // Per-warp totals and maxima, then the search's verdicts: 3 × 12 int64.
  int64_t* red = reinterpret_cast<int64_t*>(scratch + ((blocks + 1) & ~1));
  // n_j = ceil(longest window of block j / 64), and their total and maximum.
  int64_t total = 0, longest = 0;
  for (int32_t j = tid; j < blocks; j += kThreads) {
    const int32_t g = j / per_group;
    const int64_t first = int64_t{j - g * per_group} * p.queries_per_block;
    const int64_t left = p.rows_per_group - first;
    const int count = static_cast<int>(left < p.queries_per_block ? left : p.queries_per_block);
    int64_t hi_max = 0;
    for (int u = 0; u < count; ++u) {
      int64_t lo = 0, hi = 0;
      RowWindow</*kPaged=*/true>(p, g, first + u, &lo, &hi);
      hi_max = hi > hi_max ? hi : hi_max;
    }
    const int32_t n = static_cast<int32_t>((hi_max + kWgmmaPagedBlock - 1) / kWgmmaPagedBlock);
    pages[j] = n;
    total += n;
    longest = n > longest ? n : longest;
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    total += ::attnd::gpu::ShflXor(total, o);
    const int64_t other = ::attnd::gpu::ShflXor(longest, o);
    longest = other > longest ? other : longest;
  }
  if (lane == 0) {
    red[warp] = total;
    red[kPagedSearchWarps + warp] = longest;
  }
  __syncthreads();
  total = 0;
  longest = 0;
#pragma unroll
  for (int w = 0; w < kPagedSearchWarps; ++w) {
    total += red[w];
    longest = red[kPagedSearchWarps + w] > longest ? red[kPagedSearchWarps + w] : longest;
  }
  // The smallest width that fits the grid: each pass, warp w sums the pieces at its candidate.
  const int64_t ctas = gridDim.x;  // >= blocks (the launcher's grid)
  PagedWidthRange r = PagedWidthBounds(total, longest, blocks, ctas);
  uint32_t guess = PagedWidthGuess(longest, blocks, ctas);
  int64_t* fit = red + 2 * kPagedSearchWarps;
  while (r.lo < r.hi) {  // uniform: every thread holds the same r
    const uint32_t t = PagedSearchCandidate(r.lo, r.hi, warp, guess);
    int64_t pieces = 0;
    for (int32_t j = lane; j < blocks; j += 32) pieces += PagedPiecesOf(pages[j], t);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) pieces += ::attnd::gpu::ShflXor(pieces, o);
    __syncthreads();  // the previous pass's reads of fit[] are done
    if (lane == 0) fit[warp] = pieces <= ctas ? 1 : 0;
    __syncthreads();
    // Lane w takes warp w's verdict: the smallest fitting candidate and one past the largest
    // that does not, over the warp.
    uint32_t lo = r.lo, hi = r.hi;
    if (lane < kPagedSearchWarps) {
      const uint32_t c = PagedSearchCandidate(r.lo, r.hi, lane, guess);
      if (fit[lane] != 0) {
        hi = c;
      } else {
        lo = c + 1;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      const uint32_t other_hi = ::attnd::gpu::ShflXor(hi, o),
                     other_lo = ::attnd::gpu::ShflXor(lo, o);
      hi = other_hi < hi ? other_hi : hi;
      lo = other_lo > lo ? other_lo : lo;
    }
    r.lo = lo;
    r.hi = hi;
    guess = 0;
  }
  const uint32_t t = r.lo;
  // This CTA's piece: the blocks' piece counts scanned in contiguous runs of `per` blocks a
  // thread; the thread whose run holds piece blockIdx.x names the block and the piece.
  const int32_t per = (blocks + kThreads - 1) / kThreads;
  const int32_t j0 = tid * per, j1 = j0 + per < blocks ? j0 + per : blocks;
  int64_t mine = 0;
  for (int32_t j = j0; j < j1; ++j) mine += PagedPiecesOf(pages[j], t);
  int64_t incl = mine;  // inclusive scan over the warp, then over the warps
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int64_t v = ::attnd::gpu::Shfl(incl, lane - o < 0 ? 0 : lane - o);
    if (lane >= o) incl += v;
  }
  __syncthreads();  // the search's reads of red[] are done
  if (lane == 31) red[warp] = incl;
  int32_t* found = scratch + ((blocks + 1) & ~1) + 2 * 3 * kPagedSearchWarps;  // j, piece
  if (tid == 0) found[0] = -1;
  __syncthreads();
  int64_t before = incl - mine, all = 0;
#pragma unroll
  for (int w = 0; w < kPagedSearchWarps; ++w) {
    before += w < warp ? red[w] : 0;
    all += red[w];
  }
  const int64_t b = blockIdx.x;
  if (b >= before && b < before + mine) {
    int64_t at = before;
    for (int32_t j = j0; j < j1; ++j) {
      const int64_t k = PagedPiecesOf(pages[j], t);
      if (b < at + k) {
        found[0] = j;
        found[1] = static_cast<int32_t>(b - at);
        break;
      }
      at += k;
    }
  }
  __syncthreads();
  indexer_logits::gpu::BlockWork w{};
  const int32_t j = found[0];
  *none = b >= all || j < 0;
  if (*none) return w;
  const uint32_t n = static_cast<uint32_t>(pages[j]), k = PagedPiecesOf(n, t);
  const uint32_t piece = static_cast<uint32_t>(found[1]);
  w.group = j / per_group;
  w.first = int64_t{j - static_cast<int32_t>(w.group) * per_group} * p.queries_per_block;
  const int64_t left = p.rows_per_group - w.first;
  w.count = static_cast<int>(left < p.queries_per_block ? left : p.queries_per_block);
  w.c0 = int64_t{PagedPieceStart(n, k, piece)} * kWgmmaPagedBlock;
  w.c1 = piece + 1 == k ? p.num_cols : int64_t{PagedPieceStart(n, k, piece + 1)} * kWgmmaPagedBlock;
  return w;
}

// kTwoProducers (the opt-in `cuda_wgmma2p` form, docs/KERNELS.md "Paged indexer on Hopper"):
// lane 0 of WG2 warp 0 loads the even pages and lane 0 of warp 1 the odd ones, so each consumer's
// stages are refilled by a producer of its own (one slow page no longer holds up the other
// consumer's refills); warps 2-3 fill.
// kBalanced: the split from the lengths (BalancedBlock above) instead of DecodeBlock's.
template <int kHeads, int kColumns, bool kTwoProducers = false, bool kBalanced = false>
__global__ void __launch_bounds__(384, (kColumns == 64 ? 2 : 1))
    IndexerPagedWgmmaKernel(const __grid_constant__ WgmmaPagedArgs args) {
#if ATTND_SM90A
  using T = WgmmaPagedTile<kHeads, kColumns>;
  using namespace ::attnd::gpu::wgmma;
  using indexer_logits::gpu::BlockWork;
  using indexer_logits::gpu::DecodeBlock;
  using indexer_logits::gpu::RowWindow;
  const IndexerProblem& p = args.p;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = SmemAddr(smem);
  if ((base & (kSwizzleAtomBytes - 1)) != 0) __trap();  // swizzle atoms need 1024-B alignment

  const int tid = threadIdx.x;
  BlockWork w;
  if constexpr (kBalanced) {
    // The K stages are free until the producer's first copy, after the __syncthreads below.
    bool none = false;
    w = BalancedBlock<T::kThreads>(p, reinterpret_cast<int32_t*>(smem + T::kKOffset), &none);
    if (none) return;  // uniform: every thread read the same piece
  } else {
    w = DecodeBlock</*kLongestFirst=*/false>(p);
  }
  const uint32_t full = base + T::kBarOffset, empty = full + 8 * T::kStages;  // + 8·stage
  int32_t* stage_page = reinterpret_cast<int32_t*>(smem + T::kPageOffset);
  if (tid == 0) {
    for (int s = 0; s < T::kStages; ++s) {
      MbarInit(full + 8 * s, 1);
      MbarInit(empty + 8 * s, T::kEmptyCount);
    }
    FenceMbarInit();
  }
  // q of the block's queries into shared memory, K-major with the 128-byte swizzle: column
  // c = u·H + h (query u, head h) is row c; its 16-byte chunk k sits at chunk k ^ (c % 8).
  // Queries past the block are zero (their weights are zero too).
  for (int i = tid; i < kColumns * 8; i += T::kThreads) {
    const int c = i / 8, k = i % 8, u = c / kHeads, h = c % kHeads;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (u < w.count) {
      v = *reinterpret_cast<const uint4*>(p.q + w.group * p.q_group_stride +
                                          (w.first + u) * p.q_row_stride + h * p.q_head_stride +
                                          16 * k);
    }
    *reinterpret_cast<uint4*>(smem + T::kQOffset + SwizzledOffset(c, k)) = v;
  }
  FenceProxyAsync();  // the generic stores above before wgmma's async-proxy reads
  // Each row's window [0, len) (clamped, never trusted), and the block's longest within the
  // chunk: pages [c0 / 64, ceil(min(c1, longest) / 64)) are computed, the rest filled.
  int64_t longest = 0;
#pragma unroll
  for (int u = 0; u < T::kQueries; ++u) {
    int64_t lo = 0, hi = 0;
    if (u < w.count) RowWindow</*kPaged=*/true>(p, w.group, w.first + u, &lo, &hi);
    longest = hi > longest ? hi : longest;
  }
  const int64_t end = longest < w.c1 ? longest : w.c1;  // keys [c0, end) are computed
  // Pages of the chunk (c0 is a multiple of 64; c1 <= N < 2^31).
  const int32_t page0 = static_cast<int32_t>(w.c0 / kWgmmaPagedBlock);
  const int32_t n_pages =
      end > w.c0 ? static_cast<int32_t>((end - w.c0 + kWgmmaPagedBlock - 1) / kWgmmaPagedBlock) : 0;
  const int64_t row0 = w.group * p.rows_per_group + w.first;  // the CTA's first output row
  __syncthreads();                                            // barriers initialised, q stored

  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform role
  if (wg == 2) {
    if constexpr (T::kCtasPerSm == 1) SetMaxRegsDec<T::kProducerRegs>();
    const int ptid = tid - 256;
    // One producer (every page) or, kTwoProducers, two: lanes 0 of warps 0 and 1, each taking
    // the pages ≡ its warp (mod 2), i.e. the pages of one consumer (an even stage count keeps
    // stage parity = page parity, so each stage has one producer).
    constexpr int kProducers = kTwoProducers ? 2 : 1;
    // At N 64 (two CTAs per SM) the producer warps' lanes read the block table 32 of their
    // pages at a time, one batch ahead (coalesced, off the issue path), and lane 0 takes each
    // entry by a shuffle; wider N keeps one table read per page in the issuing lane, which
    // measured faster there (docs/KERNELS.md "Paged indexer on Hopper").
    constexpr bool kTableByWarp = kColumns == 64;
    const int pw = ptid / 32, plane = ptid % 32;
    const int32_t* table = p.block_table + w.group * p.table_stride;
    // Page i of the chunk (page id `page`, untrusted: masked unless in [0, num_pages)) into
    // stage i % kStages, by the issuing lane.
    auto issue = [&](int32_t i, int64_t page) {
      const int32_t s = i % T::kStages;
      // Stage s last held page i - kStages: completion (i / kStages) - 1 of its empty barrier.
      if (i >= T::kStages) MbarWait(empty + 8 * s, ((i / T::kStages) - 1) & 1);
      const bool valid = page >= 0 && page < p.num_pages;
      stage_page[s] = valid ? static_cast<int32_t>(page) : -1;
      if (valid) {
        MbarArriveExpectTx(full + 8 * s, T::kTileBytes + T::kScaleBytes);
        TmaLoad3d(base + T::kKOffset + s * T::kTileBytes, &args.k_map, full + 8 * s, 0, 0,
                  static_cast<int32_t>(page));
        // The scales right after the page's keys (16-byte aligned: Supports), a bulk copy on
        // the same barrier, so the epilogue never waits on a global load.
        BulkLoad(base + T::kScaleOffset + s * T::kScaleBytes,
                 p.cache + page * p.cache_stride + kWgmmaPagedBlock * kWgmmaPagedDim,
                 T::kScaleBytes, full + 8 * s);
      } else {
        MbarArrive(full + 8 * s);  // nothing to load; the consumer writes −inf
      }
    };
    if (kTableByWarp && ptid < 32 * kProducers) {
      // ---- Producer warp(s): warp pw takes the chunk's pages i ≡ pw (mod kProducers) in order.
      if (plane == 0) PrefetchTensorMap(&args.k_map);
      auto entry = [&](int32_t n) -> int32_t {  // the table entry of this producer's n-th page
        const int32_t i = pw + kProducers * n;
        return i < n_pages ? table[page0 + i] : -1;
      };
      int32_t cur = entry(plane), nxt = entry(32 + plane);
      for (int32_t n = 0, i = pw; i < n_pages; ++n, i += kProducers) {
        if (n > 0 && n % 32 == 0) {
          cur = nxt;
          nxt = entry(n + 32 + plane);
        }
        const int64_t page = __shfl_sync(0xffffffffu, cur, n % 32);
        if (plane == 0) issue(i, page);
        __syncwarp();
      }
    } else if (!kTableByWarp && (kTwoProducers ? (ptid == 0 || ptid == 32) : ptid == 0)) {
      // ---- Producer: the chunk's needed pages in order.
      PrefetchTensorMap(&args.k_map);
      for (int32_t i = kTwoProducers ? ptid / 32 : 0; i < n_pages; i += kProducers) {
        issue(i, table[page0 + i]);
      }
    } else if (ptid >= 32 * kProducers) {
      // ---- Filler (the warps after the producers'): −inf on the block's rows over
      // [max(c0, longest), c1).
      constexpr int kFillers = 128 - 32 * kProducers;
      const int64_t paged_end = w.c0 + int64_t{n_pages} * kWgmmaPagedBlock;  // consumers' part
      const int64_t f0 = paged_end < w.c1 ? paged_end : w.c1;
      for (int u = 0; u < w.count; ++u) {
        float* row = p.logits + (row0 + u) * p.ld;
        for (int64_t c = f0 + (ptid - 32 * kProducers); c < w.c1; c += kFillers) row[c] = kNegInf;
      }
    }
    return;
  }

  // ---- Consumers: warpgroup wg owns pages i ≡ wg (mod 2) of the chunk; warp `warp` the page's
  // keys 16·warp + lane/4 and + 8; lane quad position t4 the columns 8j + 2·t4 + e.
  if constexpr (T::kCtasPerSm == 1) SetMaxRegsInc<T::kConsumerRegs>();
  const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  // The weights of this thread's columns (0 for queries past the block: their q is zero).
  float wt[T::kGroups][2];
#pragma unroll
  for (int j = 0; j < T::kGroups; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int column = 8 * j + 2 * t4 + e;
      const int u = column / kHeads, head = column % kHeads;
      wt[j][e] = u < w.count ? p.weights[(row0 + u) * p.weights_stride + head] : 0.0f;
    }
  }
  // The windows' ends of the queries this lane stores (0: none, or not a query of the block).
  int64_t out_len[T::kOut];
#pragma unroll
  for (int v = 0; v < T::kOut; ++v) {
    const int u = T::kQueries >= 4 ? 4 * v + t4 : t4;
    int64_t lo = 0, hi = 0;
    if (u < T::kQueries && u < w.count)
      RowWindow</*kPaged=*/true>(p, w.group, w.first + u, &lo, &hi);
    out_len[v] = hi;
  }
  const uint64_t q_desc = SmemDescKMajor(base + T::kQOffset);
  float acc[kColumns / 2];  // S: keys 16·warp + g (+8) × this thread's columns
  for (int32_t i = wg; i < n_pages; i += 2) {
    const int32_t s = i % T::kStages;
    MbarWait(full + 8 * s, (i / T::kStages) & 1);
    const int32_t page = stage_page[s];
    const int64_t key_base = w.c0 + int64_t{i} * kWgmmaPagedBlock;  // the page's first key
    // Only a CTA-uniform page id (read once by the producer) decides the MMA.
    const bool valid = __shfl_sync(0xffffffffu, page, 0) >= 0;
    float scale[2] = {0.0f, 0.0f};
    if (valid) {
      WgmmaFence();
      uint64_t k_desc = SmemDescKMajor(base + T::kKOffset + s * T::kTileBytes), qd = q_desc;
#pragma unroll
      for (int kk = 0; kk < T::kSteps; ++kk) {
        asm volatile("" : "+l"(k_desc), "+l"(qd));  // one live descriptor pair
        WgmmaFp8<kColumns>::Run(acc, k_desc, qd, kk > 0);
        k_desc = DescAdvance(k_desc, 32);  // next k32 step: 32 bytes on, inside the swizzle atom
        qd = DescAdvance(qd, 32);
      }
      WgmmaCommit();
      const float* scales =
          reinterpret_cast<const float*>(smem + T::kScaleOffset + s * T::kScaleBytes);
      scale[0] = scales[16 * warp + g];
      scale[1] = scales[16 * warp + g + 8];
      WgmmaWait<0>();
      FenceAccumulators(acc);
    }
    __syncwarp();
    if (lane == 0) MbarArrive(empty + 8 * s);  // this warp's share of the page is read

    // Σ_h w·relu(s) per (key, query) over this thread's columns, then over the quad.
    float part[2][T::kQueries];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
#pragma unroll
      for (int u = 0; u < T::kQueries; ++u) part[rr][u] = 0.0f;
    }
    if (valid) indexer_logits::gpu::AddWeightedRelu<kHeads, T::kGroups, T::kQueries>(acc, wt, part);
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int64_t key = key_base + 16 * warp + g + 8 * rr;
      if (key >= w.c1) continue;
      if constexpr (T::kQueries >= 4) {
        // Query 4v + t4 of each group of four ends in lane t4.
#pragma unroll
        for (int v = 0; v < T::kQueries / 4; ++v) {
          const float sum = indexer_logits::gpu::QuadTransposeSum(&part[rr][4 * v], t4);
          const int u = 4 * v + t4;
          if (u >= w.count) continue;
          p.logits[(row0 + u) * p.ld + key] = valid && key < out_len[v] ? sum * scale[rr] : kNegInf;
        }
      } else {
        QuadSum<T::kQueries>(part[rr]);
        const int u = t4;  // lane t4 of the quad stores query t4
        if (u < T::kQueries && u < w.count) {
          p.logits[(row0 + u) * p.ld + key] =
              valid && key < out_len[0] ? SelectQuery(part[rr], u) * scale[rr] : kNegInf;
        }
      }
    }
  }
#else
  __trap();  // sm_90a only: WgmmaSupports refuses other devices
#endif
}

}  // namespace attnd::kernels::indexer_logits_paged::gpu
