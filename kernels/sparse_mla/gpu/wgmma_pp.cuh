// The Hopper sparse MLA kernel with the two consumer warpgroups in ping-pong (CUDA sm_90a;
// `cuda_wgmma_pp`, FAST precision and the bf16 cache only; docs/KERNELS.md "Sparse MLA in
// ping-pong"). The CTA is wgmma.cuh's (one token x 64 heads x one split, 384 threads, two
// 64-row KV stages, V read from K's bytes), but the blocks go in pairs: block 2i in stage 0,
// block 2i + 1 in stage 1, and each stage is two halves by column, L = slabs 0..3 (K and V
// columns 0..255) and R = slabs 4.. (columns 256..511 and the rope), each with its own full and
// empty mbarrier:
//   WG2 (producer)  per pair fills L of stage 0, R of stage 1, R of stage 0, L of stage 1 (the
//                   order in which the consumers free them), each after its empty barrier.
//   WG0             S0 = Q·Kᵀ of stage 0, its softmax (running max m0, shared through shared
//                   memory), O[:, 0:256] += P0·V_L(0) with P0 from registers; then, with WG1's
//                   max m1 >= m0, P0·2^(m0-m1) to shared memory for WG1, O·2^(m0-m1), and
//                   O += P1·V_L(1) with WG1's P1 from shared memory; then the next pair's
//                   Q·Kᵀ behind it.
//   WG1             S1 = Q·Kᵀ of stage 1 (R half first) on the tensor cores while WG0 runs its
//                   softmax, its softmax from m0, O[:, 256:512] += P1·V_R(1) (registers) and
//                   += P0·V_R(0) (shared memory).
// So one warpgroup's softmax runs under the other's MMAs, and each half of a stage is refilled
// as soon as the warpgroup that reads it last is done with it. Each warpgroup keeps the row sums
// of its own P; the epilogue adds them. A pair past the last block is all masked (zeros, P 0).
// The running max is wgmma_softmax.cuh's lazy one (FAST). Instantiated in wgmma_pp.cu.
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/sparse_mla/gpu/wgmma_pp.cuh is CUDA-only"
#endif

#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/common/gpu/attention/wgmma_softmax.cuh"
#include "kernels/common/gpu/tiles.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/gpu/wgmma.cuh"
#include "kernels/sparse_mla/gpu/common.cuh"
#include "kernels/sparse_mla/gpu/wgmma.cuh"

namespace attnd::kernels::sparse_mla::gpu {

// The shared-memory layout both ping-pong kernels start with (this one and
// kernels/mla_decode/gpu/wgmma_sf.cuh's): Q | stage 0 | stage 1 | P1 | P0 (d512 only: d576
// keeps P0 in stage 0's rope slab, dead once S0 is complete and refilled only after WG1's
// P0·V_R) | m (f32 [64]) | row sums of WG0 and of WG1 (f32 [64] each), then kStatEnd.
template <int kDqk>
struct PairTileLayout {
  static_assert(kDqk == 512 || kDqk == 576, "d_qk 512 or 576");
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 64;
  static constexpr int kSlabs = kDqk / 64;
  static constexpr int kLSlabs = 4;                 // columns 0..255
  static constexpr int kRSlabs = kSlabs - kLSlabs;  // 256..511 and the rope
  static constexpr uint32_t kSlabBytes = 64 * 128;
  static constexpr uint32_t kStageBytes = kSlabs * kSlabBytes;
  static constexpr uint32_t kQOffset = 0;
  static constexpr uint32_t kKvOffset = kQOffset + kSlabs * kSlabBytes;
  static constexpr uint32_t kP1Offset = kKvOffset + 2 * kStageBytes;
  static constexpr bool kP0InRope = kDqk == 576;
  static constexpr uint32_t kP0Offset =
      kP0InRope ? kKvOffset + (kSlabs - 1) * kSlabBytes : kP1Offset + kSlabBytes;
  static constexpr uint32_t kStatOffset = kP1Offset + (kP0InRope ? 1 : 2) * kSlabBytes;
  static constexpr uint32_t kMaxOffset = kStatOffset;
  static constexpr uint32_t kSum0Offset = kMaxOffset + 4 * kBlockM;
  static constexpr uint32_t kSum1Offset = kSum0Offset + 4 * kBlockM;
  static constexpr uint32_t kStatEnd = kSum1Offset + 4 * kBlockM;
};

// PairTileLayout | validity (u64 [2]) | barriers.
template <int kDqk>
struct WgmmaPpTile : PairTileLayout<kDqk> {
  using Layout = PairTileLayout<kDqk>;
  using Layout::kBlockM;
  using Layout::kBlockN;
  static constexpr int kThreads = 384;  // WG0, WG1 consumers, WG2 producer
  static constexpr uint32_t kMaskOffset = Layout::kStatEnd;
  // full[stage][half] at + 8·(2·stage + half), empty the same + 32, q at + 64.
  static constexpr uint32_t kBarOffset = kMaskOffset + 16;
  static constexpr int kSmemBytes = static_cast<int>(kBarOffset + 9 * 8);
  // 224 for the consumers: at 216 ptxas spilled 24 bytes of theirs, reloaded inside the pair loop
  // (ncu: the kernel's top stall; docs/KERNELS.md "Sparse MLA in ping-pong"); the producer's 56
  // keep a few spills of its own, outside the MMA path.
  static constexpr int kProducerRegs = 56, kConsumerRegs = 224;
  // full: per producer thread one cp.async arrival (noinc) and one ordinary one; empty: one
  // arrival per warp of the warpgroup that frees the half.
  static constexpr uint32_t kFullCount = 256, kEmptyCount = 4, kQCount = 128;
  static constexpr int kLaunchRegs = kSm90Regs384;  // tiles.h
  static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * kLaunchRegs, "register budget");
  static_assert(kProducerRegs <= kLaunchRegs && kConsumerRegs >= kLaunchRegs,
                "setmaxnreg: dec for the producer, inc for the consumers");
  static_assert(kSmemBytes <= kSm90MaxSmemBytes, "fits sm_90's 227 KiB of shared memory per block");
  static_assert(kSplitAlign % kBlockN == 0, "splits are whole KV blocks");
};

// Named barriers between WG0 and WG1 (256 threads each; 0 is __syncthreads).
enum WgmmaPpBarrier : uint32_t {
  kPpBarMax0 = 1,   // WG0 -> WG1: m0 of the pair is in shared memory
  kPpBarMax1 = 2,   // WG1 -> WG0: m1 of the pair replaced it
  kPpBarP0 = 3,     // WG0 -> WG1: P0·2^(m0-m1) is in shared memory
  kPpBarP1 = 4,     // WG1 -> WG0: P1 is in shared memory
  kPpBarStats = 5,  // both: the final row sums are written
};

namespace wgmma_pp_internal {

// o (a thread's two rows, wgmma accumulator layout) times the rows' factors.
__device__ __forceinline__ void ScaleRows(float (&o)[128], const float (&f)[2]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j + 0] *= f[0];
    o[4 * j + 1] *= f[0];
    o[4 * j + 2] *= f[1];
    o[4 * j + 3] *= f[1];
  }
}

// Whether any row of the warp has a factor other than 1 (FAST's lazy max leaves most at 1).
__device__ __forceinline__ bool AnyNotOne(const float (&f)[2]) {
  return __any_sync(0xffffffffu, f[0] != 1.0f || f[1] != 1.0f);
}

#if ATTND_SM90A
// The consumer warpgroups' MMA steps of the ping-pong kernels (WgmmaPingPong below, and
// kernels/mla_decode/gpu/wgmma_sf.cuh's WgmmaSelfFed), on 64-row tiles of 64-column slabs
// (`slab_bytes` apart). Issue only, except where a commit is named.
// S (+)= Q·Kᵀ over kSlabs slabs of Q at `q_desc` and of a stage's rows at `k_addr` (no commit).
template <int kSlabs, bool kAccumulate>
__device__ __forceinline__ void PairQk(float (&s)[32], uint64_t q_desc, uint32_t k_addr,
                                       uint32_t slab_bytes) {
  using namespace ::attnd::gpu::wgmma;
  WgmmaSsOverSlabs<64, kSlabs, kAccumulate>(s, q_desc, SmemDescKMajor(k_addr), slab_bytes);
}
// O += P·V over 256 columns of V starting at `v_addr`, P from registers (one commit group).
__device__ __forceinline__ void PairPvRegs(float (&o)[128], const uint32_t (&p)[4][4],
                                           uint32_t v_addr, uint32_t slab_bytes) {
  using namespace ::attnd::gpu::wgmma;
  uint64_t vd = SmemDescMnMajor(v_addr, slab_bytes);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_internal::OpaqueDescriptors(vd);
    Wgmma<256, WgmmaA::kRegs>::Run<true>(o, p[kk], vd, true);
    vd = DescAdvance(vd, 2048);
  }
  WgmmaCommit();
}
// The same with P from the slab at `p_addr` (one commit group).
__device__ __forceinline__ void PairPvSmem(float (&o)[128], uint32_t p_addr, uint32_t v_addr,
                                           uint32_t slab_bytes) {
  using namespace ::attnd::gpu::wgmma;
  uint64_t pd = SmemDescKMajor(p_addr);
  uint64_t vd = SmemDescMnMajor(v_addr, slab_bytes);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_internal::OpaqueDescriptors(pd, vd);
    Wgmma<256, WgmmaA::kSmem>::Run<true>(o, pd, vd, true);
    pd = DescAdvance(pd, 32);
    vd = DescAdvance(vd, 2048);
  }
  WgmmaCommit();
}
// This thread's P (rows r0 and r0 + 8 of the warpgroup's tile) to the slab at `smem + off`, the
// A layout of a K-major 64 x 64 bf16 tile with the 128-byte swizzle.
__device__ __forceinline__ void PairStoreP(uint8_t* smem, uint32_t off, const uint32_t (&p)[4][4],
                                           int r0, int lane) {
  using ::attnd::gpu::wgmma::SwizzledOffset;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int row = r0 + 8 * (q & 1);
      *reinterpret_cast<uint32_t*>(smem + off + SwizzledOffset(row, 2 * kk + (q >> 1)) +
                                   4 * (lane % 4)) = p[kk][q];
    }
  }
}
// WG0, once WG1's max m1 of the pair is in shared memory: beta = 2^(m0 - m1) for its O and row
// sums, m_run = m1, and its P (f32 in s, bf16 in p) scaled by beta where a row's beta is not 1.
// Returns whether any row of the warp has beta != 1 (O then needs ScaleRows(o, beta)).
__device__ __forceinline__ bool PairTakeMax1(const float* max_s, int r0, float (&m_run)[2],
                                             float (&l_run)[2], float (&s)[32], uint32_t (&p)[4][4],
                                             float (&beta)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m1 = max_s[r0 + 8 * i];
    beta[i] = ::attnd::gpu::ptx::Exp2(m_run[i] - m1);
    m_run[i] = m1;
    l_run[i] *= beta[i];
  }
  const bool rescale = AnyNotOne(beta);
  if (rescale) {
#pragma unroll
    for (int j = 0; j < 32; ++j) s[j] *= beta[j % 4 < 2 ? 0 : 1];
    uint32_t unused_lo[4][4];
    WgmmaPackP<4, false>(s, p, unused_lo);
  }
  return rescale;
}
#endif  // ATTND_SM90A

}  // namespace wgmma_pp_internal

// Src as for WgmmaAttention (wgmma.cuh), plus Src::QueryRowPtr(a, w, r): query row r of the
// block (null: a padding row, zeros; row 0 is never one), in place of QueryBase / QueryStride.
// Plain cp.async, no L2 policy operand: docs/KERNELS.md "Sparse MLA in ping-pong" says why. FAST
// precision, bf16 rows. With Src::kTmaPages a block that is one whole page (Src::WholePageBlock)
// comes by TMA through `kv_map`, each half as its own boxes (Src::TmaSlabs, one thread; an
// out-of-range page reads as zeros); its validity bits still come from Src::LoadRow, which masks
// exactly the rows of such a page.
template <int kDqk, class Src>
__device__ __forceinline__ void WgmmaPingPong(const typename Src::Args& a,
                                              const void* kv_map = nullptr) {
#if ATTND_SM90A
  using Tile = WgmmaPpTile<kDqk>;
  using namespace ::attnd::gpu::wgmma;
  using wgmma_pp_internal::AnyNotOne;
  using wgmma_pp_internal::ScaleRows;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = SmemAddr(smem);
  if ((base & (kSwizzleAtomBytes - 1)) != 0) __trap();  // swizzle atoms need 1024-B alignment

  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform role
  const typename Src::Work w = Src::Begin(a);
  // Uniform to ptxas: it decides which wgmmas are issued.
  const int n_blocks = __shfl_sync(0xffffffffu, Src::Blocks(w), 0);
  const int n_pairs = (n_blocks + 1) / 2;

  const uint32_t bar = base + Tile::kBarOffset;
  auto full_bar = [&](int stage, int half) { return bar + 8 * (2 * stage + half); };
  auto empty_bar = [&](int stage, int half) { return bar + 32 + 8 * (2 * stage + half); };
  const uint32_t q_bar = bar + 64;
  constexpr int kL = 0, kR = 1;
  if (tid == 0) {
    for (int i = 0; i < 4; ++i) {
      MbarInit(bar + 8 * i, Tile::kFullCount);
      MbarInit(bar + 32 + 8 * i, Tile::kEmptyCount);
    }
    MbarInit(q_bar, Tile::kQCount);
    FenceMbarInit();
  }
  __syncthreads();
  auto stage_off = [](int stage) { return Tile::kKvOffset + stage * Tile::kStageBytes; };

  if (wg == 2) {
    // ---- Producer: thread (warp pw, lane) fills 16-byte chunk lane % 8 of every slab of rows
    // pw·16 + 4i + lane / 8 (i < 4) of both blocks of a pair.
    SetMaxRegsDec<Tile::kProducerRegs>();
    const int p = tid - 256, pw = p / 32, lane = p % 32, chunk = lane & 7;
    int rows[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) rows[i] = pw * 16 + 4 * i + (lane >> 3);
    if (n_pairs == 0) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // A padding row (Src::QueryRowPtr null: a block of fewer than 64 rows) is zero-filled by
      // the same cp.async (source size 0, which reads nothing) from the block's row 0.
      const uint16_t* row = Src::QueryRowPtr(a, w, rows[i]);
      const uint32_t bytes = row != nullptr ? 16 : 0;
      const uint16_t* src = (row != nullptr ? row : Src::QueryRowPtr(a, w, 0)) + chunk * 8;
      const uint32_t dst = base + Tile::kQOffset + SwizzledOffset(rows[i], chunk);
#pragma unroll
      for (int s = 0; s < Tile::kSlabs; ++s) {
        CpAsync16(dst + s * Tile::kSlabBytes, src + s * 64, bytes);
      }
    }
    CpAsyncArriveNoinc(q_bar);

    typename Src::Row kv[2][4];  // the pair's rows: block 2i, block 2i + 1
    int64_t block_begin[2];
    bool by_tma[2] = {false, false};  // whole pages by TMA (Src::kTmaPages)
    auto load_pair = [&](int pair) {
#pragma unroll
      for (int blk = 0; blk < 2; ++blk) {
        block_begin[blk] = int64_t{Tile::kBlockN} * (2 * pair + blk);
        if constexpr (Src::kTmaPages) by_tma[blk] = Src::WholePageBlock(a, w, block_begin[blk]);
#pragma unroll
        for (int i = 0; i < 4; ++i) kv[blk][i] = Src::LoadRow(a, w, block_begin[blk], rows[i]);
      }
    };
    // This warp's 16 validity bits of block `blk` (bit r: row pw·16 + r).
    auto mask_bits = [&](int blk) {
      uint32_t bits = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t vote = __ballot_sync(0xffffffffu, kv[blk][i] >= 0);
#pragma unroll
        for (int sub = 0; sub < 4; ++sub) bits |= ((vote >> (8 * sub)) & 1u) << (4 * i + sub);
      }
      return bits;
    };
    // Slabs [kFirst, kFirst + kCount) of block `blk`'s rows into `stage` (a masked row as
    // zeros), then this thread's two arrivals on the half's full barrier.
    auto fill_half = [&](int stage, int blk, auto first, auto count, uint32_t full) {
      constexpr int kFirst = decltype(first)::value, kCount = decltype(count)::value;
      if constexpr (Src::kTmaPages) {
        if (by_tma[blk]) {  // one thread's expect-tx arrival and 255 plain ones, as below
          if (p == 0) {
            Src::TmaSlabs(a, w, block_begin[blk], kv_map,
                          base + stage_off(stage) + kFirst * Tile::kSlabBytes, kFirst, kCount,
                          Tile::kSlabBytes, full);
          }
          MbarArrive(full);
          if (p != 0) MbarArrive(full);
          return;
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t off = stage_off(stage) + SwizzledOffset(rows[i], chunk);
        if (kv[blk][i] >= 0) {
          const uint16_t* src = Src::RowPtr(a, kv[blk][i], chunk * 8);
#pragma unroll
          for (int s = kFirst; s < kFirst + kCount; ++s) {
            CpAsync16(base + off + s * Tile::kSlabBytes, src + s * 64, 16);
          }
        } else {
#pragma unroll
          for (int s = kFirst; s < kFirst + kCount; ++s) {
            *reinterpret_cast<uint4*>(smem + off + s * Tile::kSlabBytes) = make_uint4(0, 0, 0, 0);
          }
        }
      }
      CpAsyncArriveNoinc(full);
      MbarArrive(full);
    };
    using LFirst = std::integral_constant<int, 0>;
    using LCount = std::integral_constant<int, Tile::kLSlabs>;
    using RFirst = std::integral_constant<int, Tile::kLSlabs>;
    using RCount = std::integral_constant<int, Tile::kRSlabs>;
    load_pair(0);
    for (int pair = 0; pair < n_pairs; ++pair) {
      const uint32_t parity = (pair - 1) & 1;  // of the previous pair's frees
      const uint32_t bits0 = mask_bits(0), bits1 = mask_bits(1);
      // Stage 0's validity is read by WG0, which frees L of stage 0: written with that half;
      // stage 1's by WG1, which frees R of stage 1.
      if (pair > 0) MbarWait(empty_bar(0, kL), parity);
      if (lane == 0) {
        *reinterpret_cast<uint16_t*>(smem + Tile::kMaskOffset + 2 * pw) =
            static_cast<uint16_t>(bits0);
      }
      fill_half(0, 0, LFirst{}, LCount{}, full_bar(0, kL));
      if (pair > 0) MbarWait(empty_bar(1, kR), parity);
      if (lane == 0) {
        *reinterpret_cast<uint16_t*>(smem + Tile::kMaskOffset + 8 + 2 * pw) =
            static_cast<uint16_t>(bits1);
      }
      fill_half(1, 1, RFirst{}, RCount{}, full_bar(1, kR));
      if (pair > 0) MbarWait(empty_bar(0, kR), parity);
      fill_half(0, 0, RFirst{}, RCount{}, full_bar(0, kR));
      if (pair > 0) MbarWait(empty_bar(1, kL), parity);
      fill_half(1, 1, LFirst{}, LCount{}, full_bar(1, kL));
      if (pair + 1 < n_pairs) {
        load_pair(pair + 1);
        // Pools larger than the L2 (decode): the next pair's rows into L2 while these stages
        // are in use (wgmma.cuh's producer does the same a block ahead).
        if (Src::PrefetchL2(a) && chunk == 0) {
#pragma unroll
          for (int blk = 0; blk < 2; ++blk) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              if (kv[blk][i] >= 0) {
                PrefetchL2(Src::RowPtr(a, kv[blk][i], 0), static_cast<uint32_t>(2 * kDqk));
              }
            }
          }
        }
      }
    }
    return;
  }

  // ---- Consumers: warp w of the warpgroup owns rows 16w + lane/4 and + 8 of S and O.
  SetMaxRegsInc<Tile::kConsumerRegs>();
  const int warp = (tid / 32) % 4, lane = tid % 32;
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

  // S (+)= Q·Kᵀ over the L or R slabs of `stage` (no commit); the P·V steps (one commit group).
  auto qk_l = [&](int stage, auto accumulate) {
    wgmma_pp_internal::PairQk<Tile::kLSlabs, decltype(accumulate)::value>(
        s, q_desc, base + stage_off(stage), Tile::kSlabBytes);
  };
  auto qk_r = [&](int stage, auto accumulate) {
    wgmma_pp_internal::PairQk<Tile::kRSlabs, decltype(accumulate)::value>(
        s, DescAdvance(q_desc, kRBytes), base + stage_off(stage) + kRBytes, Tile::kSlabBytes);
  };
  auto pv_regs = [&](uint32_t v_addr) {
    wgmma_pp_internal::PairPvRegs(o, p, v_addr, Tile::kSlabBytes);
  };
  auto pv_smem = [&](uint32_t p_addr, uint32_t v_addr) {
    wgmma_pp_internal::PairPvSmem(o, p_addr, v_addr, Tile::kSlabBytes);
  };
  // This thread's maxima of the completed S with the stage's masked slots at -inf.
  auto mask_max = [&](int stage, float(&mx)[2]) {
    const uint64_t mask = *reinterpret_cast<const uint64_t*>(smem + Tile::kMaskOffset + 8 * stage);
    mx[0] = -INFINITY;
    mx[1] = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + cq + (e & 1);
        if (((mask >> col) & 1u) == 0) s[4 * j + e] = -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
      }
    }
  };
  auto store_p = [&](uint32_t off) { wgmma_pp_internal::PairStoreP(smem, off, p, r0, lane); };
  auto free_half = [&](int stage, int half) {
    if (lane == 0) MbarArrive(empty_bar(stage, half));
  };
  using Zero = std::integral_constant<bool, false>;
  using Acc = std::integral_constant<bool, true>;
  uint32_t unused_lo[4][4];

  if (wg == 0) {
    if (n_pairs > 0) {
      MbarWait(q_bar, 0);
      MbarWait(full_bar(0, kL), 0);
      FenceProxyAsync();  // the cp.async fills (generic proxy) before wgmma reads them
      WgmmaFence();
      qk_l(0, Zero{});
      WgmmaCommit();
      MbarWait(full_bar(0, kR), 0);
      FenceProxyAsync();
      WgmmaFence();  // (ptxas puts one here otherwise: the accumulators cross the wait's loop)
      qk_r(0, Acc{});
      WgmmaCommit();
      WgmmaWait<0>();
      FenceAccumulators(s);
    }
    for (int pair = 0; pair < n_pairs; ++pair) {
      float mx[2], alpha[2];
      mask_max(0, mx);
      WgmmaSoftmaxStep<32, true>(s, mx, a.scale_log2, m_run, l_run, alpha);
      if (AnyNotOne(alpha)) ScaleRows(o, alpha);
      if (lane % 4 == 0) {
        max_s[r0] = m_run[0];
        max_s[r0 + 8] = m_run[1];
      }
      NamedBarArrive(kPpBarMax0, 256);
      WgmmaPackP<4, false>(s, p, unused_lo);
      WgmmaFence();
      pv_regs(base + stage_off(0));
      WgmmaWait<0>();
      FenceAccumulators(o);
      free_half(0, kL);
      // WG1's max of the pair: P0 and O to it.
      NamedBarSync(kPpBarMax1, 256);
      float beta[2];
      const bool rescale = wgmma_pp_internal::PairTakeMax1(max_s, r0, m_run, l_run, s, p, beta);
      store_p(Tile::kP0Offset);
      FenceProxyAsync();  // P0 (generic stores) before WG1's wgmma reads it
      NamedBarArrive(kPpBarP0, 256);
      NamedBarSync(kPpBarP1, 256);
      if (rescale) ScaleRows(o, beta);
      WgmmaFence();
      pv_smem(base + Tile::kP1Offset, base + stage_off(1));
      if (pair + 1 < n_pairs) {
        // The next pair's S0 behind P1·V_L(1).
        const uint32_t parity = (pair + 1) & 1;
        MbarWait(full_bar(0, kL), parity);
        FenceProxyAsync();
        WgmmaFence();
        qk_l(0, Zero{});
        WgmmaCommit();
        WgmmaWait<1>();
        FenceAccumulators(o);
        free_half(1, kL);
        MbarWait(full_bar(0, kR), parity);
        FenceProxyAsync();
        WgmmaFence();
        qk_r(0, Acc{});
        WgmmaCommit();
        WgmmaWait<0>();
        FenceAccumulators(s);
      } else {
        WgmmaWait<0>();
        FenceAccumulators(o);
        free_half(1, kL);
      }
    }
  } else {
    if (n_pairs > 0) MbarWait(q_bar, 0);
    for (int pair = 0; pair < n_pairs; ++pair) {
      const uint32_t parity = pair & 1;
      MbarWait(full_bar(1, kR), parity);
      FenceProxyAsync();
      WgmmaFence();
      qk_r(1, Zero{});
      MbarWait(full_bar(1, kL), parity);
      FenceProxyAsync();
      WgmmaFence();
      qk_l(1, Acc{});
      WgmmaCommit();
      WgmmaWait<0>();
      FenceAccumulators(s);
      float mx[2], alpha[2];
      mask_max(1, mx);
      NamedBarSync(kPpBarMax0, 256);
      float m0[2];
      m0[0] = max_s[r0];
      m0[1] = max_s[r0 + 8];
      WgmmaSoftmaxStepFrom<32, true>(s, mx, a.scale_log2, m0, m_run, l_run, alpha);
      __syncwarp();  // the quad's reads of m0 before its writer's store
      if (lane % 4 == 0) {
        max_s[r0] = m_run[0];
        max_s[r0 + 8] = m_run[1];
      }
      NamedBarArrive(kPpBarMax1, 256);
      if (AnyNotOne(alpha)) ScaleRows(o, alpha);
      WgmmaPackP<4, false>(s, p, unused_lo);
      // P1 to shared memory before the wgmma that reads p from registers (reading an in-flight
      // wgmma's A registers is undefined), which also hands it to WG0 sooner.
      store_p(Tile::kP1Offset);
      FenceProxyAsync();  // P1 before WG0's wgmma reads it
      NamedBarArrive(kPpBarP1, 256);
      WgmmaFence();
      pv_regs(base + stage_off(1) + kRBytes);
      NamedBarSync(kPpBarP0, 256);
      // A fence before every wgmma group: without this one ptxas issued the group with no
      // WARPGROUP.ARRIVE, the one such group in the binary, in the build whose first launch
      // failed with an illegal instruction (docs/KERNELS.md "Sparse MLA in ping-pong").
      WgmmaFence();
      pv_smem(base + Tile::kP0Offset, base + stage_off(0) + kRBytes);
      WgmmaWait<1>();
      free_half(1, kR);
      WgmmaWait<0>();
      FenceAccumulators(o);
      free_half(0, kR);
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
  NamedBarSync(kPpBarStats, 256);
  const float l[2] = {l_run[0] + other[r0], l_run[1] + other[r0 + 8]};
  Src::StoreO(a, w, o, r0, (wg == 0 ? 0 : kDimV / 2) + cq, l);
  if (wg == 0 && lane % 4 == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) Src::StoreLse(a, w, r0 + 8 * i, m_run[i], l[i]);
  }
#else
  __trap();  // sm_90a only: GpuSupports refuses other devices
#endif
}

// SparseRows for the ping-pong kernel at any H that is a multiple of 64 or below 64: a CTA takes
// one token's 64-head group, or at H < 64 all its H heads as rows 0..H-1 of a block padded to 64
// (Q zero-filled, O and LSE of the padding rows not stored; FlashMLA pads low head counts to 64
// the same way). Grid: T · ceil(H / 64) CTAs x splits.
struct SparseRowsAnyH : SparseRows {
  struct Work : SparseRows::Work {
    int nrows;  // real heads of the block: 64, or H below 64
  };
  static __device__ __forceinline__ Work Begin(const Args& a) {
    const int groups = a.heads >= 64 ? a.heads / 64 : 1;
    Work w;
    w.t = blockIdx.x / groups;
    w.h0 = static_cast<int>(blockIdx.x % groups) * 64;
    w.nrows = a.heads >= 64 ? 64 : a.heads;
    w.split = blockIdx.y;
    w.range = SplitSlots(a, w.t, w.split);
    return w;
  }
  static __device__ __forceinline__ const uint16_t* QueryRowPtr(const Args& a, const Work& w,
                                                                int r) {
    return r < w.nrows ? SparseRows::QueryRowPtr(a, w, r) : nullptr;
  }
  static __device__ __forceinline__ void StoreO(const Args& a, const Work& w, const float (&o)[128],
                                                int r, int col0, const float (&l)[2]) {
    wgmma_internal::StoreO<true>(a, o, w.t, w.split, w.h0 + r, col0, l, w.h0 + w.nrows);
  }
  static __device__ __forceinline__ void StoreLse(const Args& a, const Work& w, int r,
                                                  float max_log2, float sum) {
    if (r < w.nrows) SparseRows::StoreLse(a, w, r, max_log2, sum);
  }
};

template <int kDqk>
__global__ void __launch_bounds__(384, 1) SparseMlaWgmmaPpKernel(const KernelArgs a) {
  if (GateClosed(a)) return;  // cuda_mma_auto chose another kernel (before any barrier)
  WgmmaPingPong<kDqk, SparseRowsAnyH>(a);
}

template <int kDqk>
::attnd::gpu::Error LaunchWgmmaPpInstance(const KernelArgs& a, ::attnd::gpu::Stream stream) {
  using Tile = WgmmaPpTile<kDqk>;
  const void* fn = reinterpret_cast<const void*>(&SparseMlaWgmmaPpKernel<kDqk>);
  const ::attnd::gpu::Error e = ::attnd::gpu::AllowDynamicSmem(fn, Tile::kSmemBytes);
  if (e != ::attnd::gpu::kSuccess) return e;
  const int groups = a.heads >= Tile::kBlockM ? a.heads / Tile::kBlockM : 1;  // SparseRowsAnyH
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(a.tokens) * groups),
                  static_cast<unsigned>(a.splits));
  SparseMlaWgmmaPpKernel<kDqk><<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(a);
  return ::attnd::gpu::GetLastError();
}

template <int kDqk>
KernelShape WgmmaPpInstanceShape() {
  using Tile = WgmmaPpTile<kDqk>;
  KernelShape s;
  s.block_m = Tile::kBlockM;
  s.smem_bytes = Tile::kSmemBytes;
  s.ctas_per_sm =
      ::attnd::gpu::BlocksPerSm(reinterpret_cast<const void*>(&SparseMlaWgmmaPpKernel<kDqk>),
                                Tile::kThreads, Tile::kSmemBytes);
  return s;
}

}  // namespace attnd::kernels::sparse_mla::gpu
