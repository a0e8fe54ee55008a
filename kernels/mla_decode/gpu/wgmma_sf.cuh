// The Hopper dense MLA decode with self-fed stages (CUDA sm_90a; `cuda_wgmma_sf`, FAST, bf16
// cache, page size 64; docs/KERNELS.md "Dense MLA decode, self-fed"). The math is the ping-pong
// kernel's (kernels/sparse_mla/gpu/wgmma_pp.cuh: blocks in pairs, block 2i in stage 0 and
// 2i + 1 in stage 1, each stage two halves by column, L = slabs 0..3 and R = slabs 4.., WG0 runs
// S0 = Q·Kᵀ(0) and its softmax while WG1's S1 = Q·Kᵀ(1) is on the tensor cores, one running max
// shared through shared memory, P exchanged both ways, each warpgroup P·V with its own V half
// of both blocks), but the CTA is two warpgroups and no producer:
//   - every block is one whole page, loaded by TMA through the cache's tensor map (an id outside
//     [0, num_pages), or a block past the work item's end, as a box wholly out of range: zeros);
//     each half has one full mbarrier (count 1: the issuing thread's expect-tx arrival) and is
//     refilled with the next pair's block by thread 0 of the warpgroup that reads it last, right
//     after its wait for that read (WG0: L of stage 0 after P0·V_L, L of stage 1 after P1·V_L;
//     WG1: R of stage 1 after P1·V_R, R of stage 0 after P0·V_R), so no empty barrier, no
//     producer hand-off and no register cap below 255 per thread;
//   - WG1 signals P1 only once it has issued both of its P·V, so WG0's P1·V_L and its next
//     Q·Kᵀ queue behind them on the tensor cores and the R halves WG1 refills land sooner;
//   - the validity of a block is a count of leading valid positions (64, fewer in the work
//     item's last block, 0 for a masked page), computed from the block table by every thread;
//     scores past it are selected to -inf, and where a page is partly valid the warpgroup that
//     reads a V half zeroes its rows past the count before its P·V (the cache past the request's
//     length may hold anything, NaN included).
// Work items, split-K partials and the combine are the other mla_decode kernels' (common.cuh).
// Instantiated in wgmma_sf.cu.
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/mla_decode/gpu/wgmma_sf.cuh is CUDA-only"
#endif

#include <cuda.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/common/gpu/attention/wgmma_softmax.cuh"
#include "kernels/common/gpu/tiles.h"
#include "kernels/common/gpu/wgmma.cuh"
#include "kernels/mla_decode/gpu/common.cuh"
#include "kernels/mla_decode/gpu/wgmma.cuh"
#include "kernels/sparse_mla/gpu/wgmma_pp.cuh"

namespace attnd::kernels::mla_decode::gpu {

// The ping-pong kernel's layout (PairTileLayout: Q | stage 0 | stage 1 | P1 | P0 at d512 |
// m | row sums) | full[stage][half] (u64 at + 8·(2·stage + half)), q (u64).
template <int kDqk>
struct WgmmaSfTile : ::attnd::kernels::sparse_mla::gpu::PairTileLayout<kDqk> {
  using Layout = ::attnd::kernels::sparse_mla::gpu::PairTileLayout<kDqk>;
  using Layout::kBlockM;
  using Layout::kBlockN;
  static constexpr int kThreads = 256;  // WG0, WG1; no producer
  static constexpr int kVSlabs = 4;     // V slabs of a half (the rope is not V)
  static constexpr uint32_t kBarOffset = Layout::kStatEnd;
  static constexpr int kSmemBytes = static_cast<int>(kBarOffset + 5 * 8);
  // q: one cp.async arrival (noinc) per thread.
  static constexpr uint32_t kQCount = kThreads;
  static_assert(kSmemBytes <= kSm90MaxSmemBytes, "fits sm_90's 227 KiB of shared memory per block");
};

// Named barriers (0 is __syncthreads): 1..4 between the warpgroups (256 threads), as in the
// ping-pong kernel; 5 the epilogue's row sums; 6 + wg inside one warpgroup (128 threads).
enum WgmmaSfBarrier : uint32_t {
  kSfBarMax0 = 1,   // WG0 -> WG1: m0 of the pair is in shared memory
  kSfBarMax1 = 2,   // WG1 -> WG0: m1 of the pair replaced it
  kSfBarP0 = 3,     // WG0 -> WG1: P0·2^(m0-m1) is in shared memory
  kSfBarP1 = 4,     // WG1 -> WG0: P1 is in shared memory and both of WG1's P·V are issued
  kSfBarStats = 5,  // both: the final row sums are written
  kSfBarWg = 6,     // + wg: a warpgroup's zero stores are done
};

// Rows: PaddedRows<PagedRows> (wgmma.cuh; blocks of fewer than 64 rows at H < 64 are padding
// past w.nrows). kv_map: the cache's tensor map (EncodeWgmmaKvMap).
template <int kDqk, class Rows>
__device__ __forceinline__ void WgmmaSelfFed(const DecodeArgs& a, const void* kv_map) {
#if ATTND_SM90A
  using Tile = WgmmaSfTile<kDqk>;
  using namespace ::attnd::gpu::wgmma;
  using ::attnd::kernels::sparse_mla::gpu::wgmma_pp_internal::AnyNotOne;
  using ::attnd::kernels::sparse_mla::gpu::wgmma_pp_internal::PairPvRegs;
  using ::attnd::kernels::sparse_mla::gpu::wgmma_pp_internal::PairPvSmem;
  using ::attnd::kernels::sparse_mla::gpu::wgmma_pp_internal::PairQk;
  using ::attnd::kernels::sparse_mla::gpu::wgmma_pp_internal::PairStoreP;
  using ::attnd::kernels::sparse_mla::gpu::wgmma_pp_internal::PairTakeMax1;
  using ::attnd::kernels::sparse_mla::gpu::wgmma_pp_internal::ScaleRows;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = SmemAddr(smem);
  if ((base & (kSwizzleAtomBytes - 1)) != 0) __trap();  // swizzle atoms need 1024-B alignment

  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform role
  const int wtid = tid % 128;
  const WorkItem w = Rows::Begin(a);
  // Uniform to ptxas: it decides which wgmmas are issued.
  const int n_blocks = __shfl_sync(0xffffffffu, Rows::Blocks(w), 0);
  const int n_pairs = (n_blocks + 1) / 2;

  const uint32_t bar = base + Tile::kBarOffset;
  auto full_bar = [&](int stage, int half) { return bar + 8 * (2 * stage + half); };
  const uint32_t q_bar = bar + 32;
  constexpr int kL = 0, kR = 1;
  auto stage_off = [](int stage) { return Tile::kKvOffset + stage * Tile::kStageBytes; };
  if (tid == 0) {
    PrefetchTensorMap(kv_map);
    for (int i = 0; i < 4; ++i) MbarInit(bar + 8 * i, 1);
    MbarInit(q_bar, Tile::kQCount);
    FenceMbarInit();
  }
  __syncthreads();

  // The TMA page id of block k (-1: past the work item's end, where the block table is not
  // read, or an id outside [0, num_pages); the box then reads as zeros). The block starts at
  // position w.begin + 64k < w.end <= capacity, so the entry is inside the request's row.
  auto block_id = [&](int k) -> int32_t {
    if (k >= n_blocks) return -1;
    const int64_t page = (w.begin >> 6) + k;  // w.begin is a multiple of 64 (whole tiles)
    const int64_t id = a.block_table[w.b * a.table_stride_b + page * a.table_stride_page];
    return id >= 0 && id < a.num_pages ? static_cast<int32_t>(id) : -1;
  };
  // Leading valid positions of block k whose id is `id` (0 when masked), warp-uniform.
  auto block_valid = [&](int k, int32_t id) -> int {
    if (id < 0) return 0;
    const int64_t left = w.end - w.begin - int64_t{64} * k;
    return left >= 64 ? 64 : static_cast<int>(left);
  };
  // One thread: slabs of half `half` of `stage` from page `id`, under one expect-tx arrival.
  auto issue_half = [&](int stage, int half, int32_t id) {
    const int first = half == kL ? 0 : Tile::kLSlabs;
    const int count = half == kL ? Tile::kLSlabs : Tile::kRSlabs;
    const uint32_t fb = full_bar(stage, half);
    MbarArriveExpectTx(fb, static_cast<uint32_t>(count) * Tile::kSlabBytes);
    for (int sl = 0; sl < count; ++sl) {
      TmaLoad3d(base + stage_off(stage) + static_cast<uint32_t>(first + sl) * Tile::kSlabBytes,
                kv_map, fb, 64 * (first + sl), 0, id);
    }
  };
  // Pools larger than the L2: page `id` into L2 ahead of its TMA (a hint; nothing waits).
  const uint64_t page_span = static_cast<uint64_t>(63 * a.kv_stride_slot + kDqk) * sizeof(uint16_t);
  const bool prefetch = a.prefetch_l2 && page_span < (uint64_t{1} << 31);
  auto prefetch_page = [&](int32_t id) {
    if (prefetch && id >= 0) {
      PrefetchL2(a.kv + id * a.kv_stride_page, static_cast<uint32_t>(page_span));
    }
  };

  // Q: thread t copies chunks 2(t % 4) and + 1 of every slab of row t / 4 (a padding row as
  // zeros: source size 0 from row 0, which reads nothing).
  {
    const int row = tid / 4;
    const uint16_t* q = Rows::QueryRowPtr(a, w, row);
    const uint32_t bytes = q != nullptr ? 16 : 0;
    const uint16_t* src = q != nullptr ? q : Rows::QueryRowPtr(a, w, 0);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int chunk = 2 * (tid % 4) + c;
      const uint32_t dst = base + Tile::kQOffset + SwizzledOffset(row, chunk);
#pragma unroll
      for (int s = 0; s < Tile::kSlabs; ++s) {
        CpAsync16(dst + s * Tile::kSlabBytes, src + s * 64 + chunk * 8, bytes);
      }
    }
    CpAsyncArriveNoinc(q_bar);
  }

  // Page ids of the current pair, the next (refilled during this one) and the one after
  // (prefetched into L2 during this one), every thread (the same entries: broadcast loads).
  int32_t id_cur[2], id_next[2], id_pf[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    id_cur[k] = __shfl_sync(0xffffffffu, block_id(k), 0);
    id_next[k] = __shfl_sync(0xffffffffu, block_id(2 + k), 0);
  }
  if (n_pairs > 0) {
    if (tid == 0) {
      issue_half(0, kL, id_cur[0]);
      issue_half(0, kR, id_cur[0]);
    } else if (tid == 128) {
      issue_half(1, kR, id_cur[1]);
      issue_half(1, kL, id_cur[1]);
      prefetch_page(id_next[0]);
      prefetch_page(id_next[1]);
    }
  }

  // ---- Warp w of a warpgroup owns rows 16w + lane/4 and + 8 of S and O.
  const int warp = wtid / 32, lane = tid % 32;
  const int r0 = 16 * warp + lane / 4, cq = 2 * (lane % 4);
  float* max_s = reinterpret_cast<float*>(smem + Tile::kMaxOffset);
  float* sum0_s = reinterpret_cast<float*>(smem + Tile::kSum0Offset);
  float* sum1_s = reinterpret_cast<float*>(smem + Tile::kSum1Offset);
  float o[128];  // O[:, 0:256] (WG0) or O[:, 256:512] (WG1)
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_run[2] = {kInitialMax, kInitialMax};  // log2 units
  float l_run[2] = {0.0f, 0.0f};                // this warpgroup's P only
  float s[32];
  uint32_t p[4][4];  // this warpgroup's P as A fragments
  const uint64_t q_desc = SmemDescKMajor(base + Tile::kQOffset);
  constexpr uint32_t kRBytes = Tile::kLSlabs * Tile::kSlabBytes;

  // The ping-pong kernel's MMA steps (kernels/sparse_mla/gpu/wgmma_pp.cuh): S (+)= Q·Kᵀ over
  // the L or R slabs of `stage` (no commit), O += P·V with P from registers or a slab (one
  // commit group each).
  auto qk_l = [&](int stage, auto accumulate) {
    PairQk<Tile::kLSlabs, decltype(accumulate)::value>(s, q_desc, base + stage_off(stage),
                                                       Tile::kSlabBytes);
  };
  auto qk_r = [&](int stage, auto accumulate) {
    PairQk<Tile::kRSlabs, decltype(accumulate)::value>(
        s, DescAdvance(q_desc, kRBytes), base + stage_off(stage) + kRBytes, Tile::kSlabBytes);
  };
  auto pv_regs = [&](uint32_t v_addr) { PairPvRegs(o, p, v_addr, Tile::kSlabBytes); };
  auto pv_smem = [&](uint32_t p_addr, uint32_t v_addr) {
    PairPvSmem(o, p_addr, v_addr, Tile::kSlabBytes);
  };
  // This thread's maxima of the completed S with the positions from `valid` on at -inf
  // (a select: the scores of unread or stale rows never enter arithmetic).
  auto mask_max = [&](int valid, float(&mx)[2]) {
    mx[0] = -INFINITY;
    mx[1] = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + cq + (e & 1);
        if (col >= valid) s[4 * j + e] = -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
      }
    }
  };
  auto store_p = [&](uint32_t off) { PairStoreP(smem, off, p, r0, lane); };
  // A partly valid page: this warpgroup zeroes the V rows from `valid` on of the four V slabs
  // from `first_slab` of `stage` (whose TMA has landed: `parity` of its full barrier), then
  // makes the stores visible to its wgmmas. Called with no wgmma of this warpgroup in flight.
  // The pair's valid counts (ids of the current pair) and the ids two pairs on (id_pf).
  auto pair_blocks = [&](int pair, int& valid0, int& valid1) {
    valid0 = __shfl_sync(0xffffffffu, block_valid(2 * pair, id_cur[0]), 0);
    valid1 = __shfl_sync(0xffffffffu, block_valid(2 * pair + 1, id_cur[1]), 0);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      id_pf[k] = __shfl_sync(0xffffffffu, block_id(2 * pair + 4 + k), 0);
    }
  };
  auto zero_tail = [&](int stage, int half, int first_slab, int valid, uint32_t parity) {
    MbarWait(full_bar(stage, half), parity);
    const int chunks = (64 - valid) * 8 * Tile::kVSlabs;
    for (int i = wtid; i < chunks; i += 128) {
      const int row = valid + i / (8 * Tile::kVSlabs);
      const int slab = first_slab + (i / 8) % Tile::kVSlabs;
      *reinterpret_cast<uint4*>(smem + stage_off(stage) + slab * Tile::kSlabBytes +
                                SwizzledOffset(row, i % 8)) = make_uint4(0, 0, 0, 0);
    }
    FenceProxyAsync();  // the zeros (generic stores) before the wgmmas that read them
    NamedBarSync(kSfBarWg + wg, 128);
  };
  using Zero = std::integral_constant<bool, false>;
  using Acc = std::integral_constant<bool, true>;
  uint32_t unused_lo[4][4];

  if (wg == 0) {
    if (n_pairs > 0) {
      MbarWait(q_bar, 0);
      FenceProxyAsync();  // Q's cp.async fills (generic proxy) before wgmma reads them
      MbarWait(full_bar(0, kL), 0);
      WgmmaFence();
      qk_l(0, Zero{});
      WgmmaCommit();
      MbarWait(full_bar(0, kR), 0);
      WgmmaFence();  // (ptxas puts one here otherwise: the accumulators cross the wait's loop)
      qk_r(0, Acc{});
      WgmmaCommit();
      WgmmaWait<0>();
      FenceAccumulators(s);
    }
    for (int pair = 0; pair < n_pairs; ++pair) {
      const uint32_t parity = pair & 1;
      int valid0, valid1;
      pair_blocks(pair, valid0, valid1);
      float mx[2], alpha[2];
      mask_max(valid0, mx);
      WgmmaSoftmaxStep<32, true>(s, mx, a.scale_log2, m_run, l_run, alpha);
      if (AnyNotOne(alpha)) ScaleRows(o, alpha);
      if (lane % 4 == 0) {
        max_s[r0] = m_run[0];
        max_s[r0 + 8] = m_run[1];
      }
      NamedBarArrive(kSfBarMax0, 256);
      WgmmaPackP<4, false>(s, p, unused_lo);
      if (valid0 > 0 && valid0 < 64) zero_tail(0, kL, 0, valid0, parity);
      WgmmaFence();
      pv_regs(base + stage_off(0));
      WgmmaWait<0>();
      FenceAccumulators(o);
      // L of stage 0 is read: the next pair's first block into it.
      if (wtid == 0 && pair + 1 < n_pairs) issue_half(0, kL, id_next[0]);
      // WG1's max of the pair: P0 and O to it.
      NamedBarSync(kSfBarMax1, 256);
      float beta[2];
      const bool rescale = PairTakeMax1(max_s, r0, m_run, l_run, s, p, beta);
      store_p(Tile::kP0Offset);
      FenceProxyAsync();  // P0 (generic stores) before WG1's wgmma reads it
      NamedBarArrive(kSfBarP0, 256);
      // WG1's Q·Kᵀ of stage 1 is complete (it passed kSfBarMax1 after it).
      if (valid1 > 0 && valid1 < 64) zero_tail(1, kL, 0, valid1, parity);
      NamedBarSync(kSfBarP1, 256);
      if (rescale) ScaleRows(o, beta);
      WgmmaFence();
      pv_smem(base + Tile::kP1Offset, base + stage_off(1));
      if (pair + 1 < n_pairs) {
        // The next pair's S0 behind P1·V_L(1).
        const uint32_t next = parity ^ 1u;
        MbarWait(full_bar(0, kL), next);
        WgmmaFence();
        qk_l(0, Zero{});
        WgmmaCommit();
        WgmmaWait<1>();
        FenceAccumulators(o);
        // L of stage 1 is read: the next pair's second block into it.
        if (wtid == 0) {
          issue_half(1, kL, id_next[1]);
          prefetch_page(id_pf[0]);
          prefetch_page(id_pf[1]);
        }
        MbarWait(full_bar(0, kR), next);
        WgmmaFence();
        qk_r(0, Acc{});
        WgmmaCommit();
        WgmmaWait<0>();
        FenceAccumulators(s);
      } else {
        WgmmaWait<0>();
        FenceAccumulators(o);
      }
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        id_cur[k] = id_next[k];
        id_next[k] = id_pf[k];
      }
    }
  } else {
    if (n_pairs > 0) {
      MbarWait(q_bar, 0);
      FenceProxyAsync();
    }
    for (int pair = 0; pair < n_pairs; ++pair) {
      const uint32_t parity = pair & 1;
      int valid0, valid1;
      pair_blocks(pair, valid0, valid1);
      MbarWait(full_bar(1, kR), parity);
      WgmmaFence();
      qk_r(1, Zero{});
      MbarWait(full_bar(1, kL), parity);
      WgmmaFence();
      qk_l(1, Acc{});
      WgmmaCommit();
      WgmmaWait<0>();
      FenceAccumulators(s);
      float mx[2], alpha[2];
      mask_max(valid1, mx);
      NamedBarSync(kSfBarMax0, 256);
      float m0[2];
      m0[0] = max_s[r0];
      m0[1] = max_s[r0 + 8];
      WgmmaSoftmaxStepFrom<32, true>(s, mx, a.scale_log2, m0, m_run, l_run, alpha);
      __syncwarp();  // the quad's reads of m0 before its writer's store
      if (lane % 4 == 0) {
        max_s[r0] = m_run[0];
        max_s[r0 + 8] = m_run[1];
      }
      NamedBarArrive(kSfBarMax1, 256);
      if (AnyNotOne(alpha)) ScaleRows(o, alpha);
      WgmmaPackP<4, false>(s, p, unused_lo);
      // P1 to shared memory before the wgmma that reads p from registers (reading an in-flight
      // wgmma's A registers is undefined), which also hands it to WG0 sooner.
      store_p(Tile::kP1Offset);
      FenceProxyAsync();  // P1 before WG0's wgmma reads it
      // Both V halves this warpgroup reads, while none of its wgmmas is in flight: R of
      // stage 1 (its own S1 is complete) and R of stage 0 (WG0's S0 is: it passed kSfBarMax0).
      if (valid1 > 0 && valid1 < 64) zero_tail(1, kR, Tile::kLSlabs, valid1, parity);
      if (valid0 > 0 && valid0 < 64) zero_tail(0, kR, Tile::kLSlabs, valid0, parity);
      WgmmaFence();
      pv_regs(base + stage_off(1) + kRBytes);
      NamedBarSync(kSfBarP0, 256);
      WgmmaFence();  // before every wgmma group (docs/KERNELS.md "Sparse MLA in ping-pong")
      pv_smem(base + Tile::kP0Offset, base + stage_off(0) + kRBytes);
      // Only now WG0 may queue P1·V_L and its next Q·Kᵀ: the tensor cores run both of this
      // warpgroup's P·V first, so the refills of R below are issued while WG0's MMAs still
      // run, and R of stage 0 can land before WG0's next Q·Kᵀ reaches it.
      NamedBarArrive(kSfBarP1, 256);
      WgmmaWait<1>();
      // R of stage 1 is read: the next pair's second block into it.
      if (wtid == 0 && pair + 1 < n_pairs) issue_half(1, kR, id_next[1]);
      WgmmaWait<0>();
      FenceAccumulators(o);
      // R of stage 0 (P0 included at d576) is read: the next pair's first block into it.
      if (wtid == 0 && pair + 1 < n_pairs) issue_half(0, kR, id_next[0]);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        id_cur[k] = id_next[k];
        id_next[k] = id_pf[k];
      }
    }
  }
  // Epilogue: both warpgroups' row sums; both hold the final running max.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += ::attnd::gpu::ShflXor(l_run[i], 1);
    l_run[i] += ::attnd::gpu::ShflXor(l_run[i], 2);
  }
  float* mine = wg == 0 ? sum0_s : sum1_s;
  const float* other = wg == 0 ? sum1_s : sum0_s;
  if (lane % 4 == 0) {
    mine[r0] = l_run[0];
    mine[r0 + 8] = l_run[1];
  }
  NamedBarSync(kSfBarStats, 256);
  const float l[2] = {l_run[0] + other[r0], l_run[1] + other[r0 + 8]};
  Rows::StoreO(a, w, o, r0, (wg == 0 ? 0 : kDimV / 2) + cq, l);
  if (wg == 0 && lane % 4 == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) Rows::StoreLse(a, w, r0 + 8 * i, m_run[i], l[i]);
  }
#else
  __trap();  // sm_90a only: GpuSupports refuses other devices
#endif
}

template <int kDqk>
__global__ void __launch_bounds__(256, 1)
    MlaDecodeWgmmaSfKernel(const DecodeArgs a, const __grid_constant__ CUtensorMap kv_map) {
  WgmmaSelfFed<kDqk, PaddedRows<PagedRows>>(a, &kv_map);
}

}  // namespace attnd::kernels::mla_decode::gpu
