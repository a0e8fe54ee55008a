// The Hopper MLA prefill kernel (CUDA sm_90a: TMA, warpgroup MMA, mbarriers, setmaxnreg),
// FlashAttention-3 style (docs/KERNELS.md "MLA prefill on Hopper"). Persistent CTAs of three
// warpgroups, one per SM, take work items in order from a counter in the workspace (heads in
// groups small enough that the CTAs in flight share the group's K and V in L2): 128 queries
// of one sequence and one head (the schedule of common.cuh: a sequence's last, heaviest query
// tile first), whose keys (up to what the item's last query sees) go in tiles of 128:
//   WG2 (producer)  one thread: takes the next item (atomicAdd), describes it (sequence, rows,
//                   key tiles) for the consumers in a two-entry ring in shared memory (mbarriers
//                   item_full, item_empty); loads Q by d_qk / 64 TMA boxes of 64 columns x 128
//                   rows, then per key tile K and V the same way into two stages, each stage with
//                   its own "full" (transaction count) and "empty" (a consumer warp each) mbarriers
//                   for K and for V, so K of tile j + 2 loads once Q·Kᵀ of tile j is done while V
//                   of tile j is still in use. Q is reloaded for the next item once both consumers'
//                   last Q·Kᵀ of the item completed (q_empty), so the next item's loads overlap
//                   the last P·V and the epilogue. TMA zero-fills rows past the tensor; rows of
//                   the tensor past the sequence are loaded, and never used (below).
//   WG0, WG1        64 query rows each: S = Q·Kᵀ (m64n128k16, both operands from shared memory),
//   (consumers)     -inf past each row's bottom-right causal limit (only on tiles that cross the
//                   warpgroup's first limit), online softmax in log2 units (exp2, sm_scale·log2e
//                   folded, running max from -1e30), P in bf16 registers (HIGH: hi + lo, FAST:
//                   rounded once; row sums take the unrounded P), O += P·V (m64n128k16, A = P
//                   from registers, B = V read MN-major). Intra-warpgroup overlap: Q·Kᵀ of tile
//                   j is issued with P·V of tile j - 1, and the softmax of tile j runs while
//                   that P·V is on the tensor cores. The two consumers take turns issuing
//                   (named barriers), so one's softmax also runs under the other's MMAs. In a
//                   tile whose keys past the first 64 are beyond every row of the warpgroup (the
//                   causal diagonal of WG0), P·V takes only the first 64 keys.
// V rows past the sequence's keys (a tile that crosses its end) are zeroed in shared memory by
// both consumers before the tile's P·V: their P is exactly 0, but 0 · NaN would not be (the rows
// belong to another sequence or to padding the caller never wrote). Epilogue: O / l to bf16 and
// the natural-log LSE, rows past the sequence skipped; a row that sees no key gets O 0, LSE -inf.
// Instantiated in wgmma_d192.cu; launched by wgmma.cu.
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/mla_prefill/gpu/wgmma.cuh is CUDA-only"
#endif

#include <cuda.h>
#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/attention/wgmma_softmax.cuh"
#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/mma_sync.cuh"
#include "kernels/common/gpu/tiles.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/gpu/wgmma.cuh"
#include "kernels/common/math.h"
#include "kernels/mla_prefill/gpu/common.cuh"
#include "kernels/mla_prefill/gpu/plan.h"

namespace attnd::kernels::mla_prefill::gpu {

// The argument block of the wgmma kernel: the three tensor maps (3-D: columns, heads, tokens;
// boxes of 64 columns x 1 head x 128 rows, 128-byte swizzle) and the common arguments.
struct WgmmaPrefillArgs {
  CUtensorMap q_map, k_map, v_map;
  PrefillArgs a;
};

// A work item as the producer describes it for the consumers (the ring in shared memory), so
// that a consumer starts an item without reading the schedule from global memory: 128 queries
// from row0 of sequence s (nrows of them) and head h, keys [0, key_end) in n_tiles tiles.
// n_tiles -1: a slot past the last tile (nothing to do); 0: no row sees a key; `end`: no more
// items, the CTA exits.
struct WgmmaPrefillItem {
  int64_t h, row0, key_end;
  SeqRange s;
  int32_t nrows, n_tiles;
  int32_t end;
};

template <int kDqk, int kDv>
struct WgmmaPrefillTile {
  static_assert(kDqk % 64 == 0 && kDqk >= 64 && kDqk <= 192, "d_qk 64, 128 or 192");
  static_assert(kDv == 64 || kDv == 128, "d_v 64 or 128 (the P·V wgmma N)");
  static constexpr int kThreads = 384;  // WG0, WG1 consumers; WG2 producer
  static constexpr int kBlockM = 128;   // queries per CTA (64 per consumer)
  static constexpr int kBlockN = 128;   // keys per tile
  static constexpr int kQkSlabs = kDqk / 64, kVSlabs = kDv / 64;
  static constexpr uint32_t kSlabBytes = kBlockN * 128;  // 128 rows of 64 bf16 (= kBlockM rows)
  static constexpr uint32_t kQBytes = kQkSlabs * kSlabBytes;
  static constexpr uint32_t kKStageBytes = kQkSlabs * kSlabBytes;
  static constexpr uint32_t kVStageBytes = kVSlabs * kSlabBytes;
  // Shared memory (bytes; every slab 1024-byte aligned): Q | K stage 0, 1 | V stage 0, 1 | bars.
  static constexpr uint32_t kQOffset = 0;
  static constexpr uint32_t kKOffset = kQOffset + kQBytes;
  static constexpr uint32_t kVOffset = kKOffset + 2 * kKStageBytes;
  static constexpr uint32_t kBarOffset = kVOffset + 2 * kVStageBytes;
  // u64 mbarriers q_full, q_empty, k_full[2], v_full[2], k_empty[2], v_empty[2], item_full[2],
  // item_empty[2]; then the item ring, WgmmaPrefillItem [2].
  static constexpr uint32_t kItemOffset = kBarOffset + 14 * 8;
  static constexpr int kSmemBytes = static_cast<int>(kItemOffset + 2 * sizeof(WgmmaPrefillItem));
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static constexpr uint32_t kEmptyCount = 8;  // one arrival per consumer warp (q_empty too)
  static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * kSm90Regs384, "register budget");
  static_assert(kSmemBytes <= kSm90MaxSmemBytes, "fits sm_90's 227 KiB of shared memory");
};

// Named barriers of the two consumers (256 threads each): around the zeroing of V rows, and the
// issue turns of WG0 (kBarTurn0) and WG1 (kBarTurn0 + 1).
inline constexpr uint32_t kBarVZeroed = 1, kBarTurn0 = 2;

// kExactP: Precision::kHigh (P·V as (P hi + P lo)·V); false: Precision::kFast (bf16 P).
template <int kDqk, int kDv, bool kExactP>
__global__ void __launch_bounds__(384, 1)
    MlaPrefillWgmmaKernel(const __grid_constant__ WgmmaPrefillArgs args) {
#if ATTND_SM90A
  using T = WgmmaPrefillTile<kDqk, kDv>;
  using namespace ::attnd::gpu::wgmma;
  using ::attnd::gpu::ptx::PackBf16x2;
  const PrefillArgs& a = args.a;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = SmemAddr(smem);
  if ((base & (kSwizzleAtomBytes - 1)) != 0) __trap();  // swizzle atoms need 1024-B alignment

  const int tid = threadIdx.x;
  const uint32_t q_full = base + T::kBarOffset, q_empty = q_full + 8;
  const uint32_t k_full = q_full + 16, v_full = q_full + 32;         // + 8·stage
  const uint32_t k_empty = q_full + 48, v_empty = q_full + 64;       // + 8·stage
  const uint32_t item_full = q_full + 80, item_empty = q_full + 96;  // + 8·ring entry
  WgmmaPrefillItem* item_ring = reinterpret_cast<WgmmaPrefillItem*>(smem + T::kItemOffset);
  if (tid == 0) {
    MbarInit(q_full, 1);
    MbarInit(q_empty, T::kEmptyCount);
    for (int e = 0; e < 2; ++e) {
      MbarInit(item_full + 8 * e, 1);
      MbarInit(item_empty + 8 * e, T::kEmptyCount);
    }
    for (int st = 0; st < 2; ++st) {
      MbarInit(k_full + 8 * st, 1);
      MbarInit(v_full + 8 * st, 1);
      MbarInit(k_empty + 8 * st, T::kEmptyCount);
      MbarInit(v_empty + 8 * st, T::kEmptyCount);
    }
    FenceMbarInit();
  }
  __syncthreads();

  // Work items: heads in groups of a.head_group, the first group H mod head_group heads wide when
  // that is not 0 (so the last group, whose heavy items start last, is a whole one); a group's
  // items in slot order (a sequence's heaviest query tile first), its heads interleaved within a
  // slot: item = (the group's first item) + slot · width + (h − the group's first head). Taken
  // in that order from *a.work_counter (zeroed by the schedule kernel) by the producer, which
  // describes the n-th for the consumers in ring entry n % 2. Tiles (g) and loaded items (qi) are
  // counted over the CTA's life, so stages and phases run on across items.
  const int64_t n_items = a.slots * a.heads;
  using Item = WgmmaPrefillItem;
  auto describe = [&](int64_t item, Item* it) {
    it->end = item >= n_items;
    it->n_tiles = -1;
    if (it->end) return;
    // item < slots · H < 2^31 and 1 <= head_group <= H (GpuSupports, the launcher): 32-bit.
    const uint32_t slots = static_cast<uint32_t>(a.slots), hg = static_cast<uint32_t>(a.head_group);
    const uint32_t first_w =
        static_cast<uint32_t>(a.heads) % hg == 0 ? hg : static_cast<uint32_t>(a.heads) % hg;
    uint32_t h0 = 0, width = first_w, r = static_cast<uint32_t>(item);
    if (r >= slots * first_w) {
      r -= slots * first_w;
      const uint32_t k = r / (slots * hg);
      h0 = first_w + k * hg;
      width = hg;
      r -= k * slots * hg;
    }
    int64_t b, tile;
    if (!FindTile(a, r / width, &b, &tile)) return;
    it->h = h0 + r % width;
    it->s = SequenceRange(a, b);
    it->row0 = tile * T::kBlockM;  // first query of the item, in the sequence
    it->nrows = static_cast<int>(Min64(T::kBlockM, it->s.lq - it->row0));
    it->key_end = KeyLimit(a, it->row0 + it->nrows - 1, it->s.lq, it->s.lk);
    it->n_tiles = static_cast<int>((it->key_end + T::kBlockN - 1) / T::kBlockN);
  };

  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform role
  if (wg == 2) {
    SetMaxRegsDec<T::kProducerRegs>();
    if (tid != 256) return;
    // ---- Producer (one thread). Coordinates: column, head, token row (all < 2^31: GpuSupports).
    PrefetchTensorMap(&args.q_map);
    PrefetchTensorMap(&args.k_map);
    PrefetchTensorMap(&args.v_map);
    uint32_t g = 0, qi = 0;
    for (uint32_t n = 0;; ++n) {
      const uint32_t e = n & 1;
      if (n >= 2) MbarWait(item_empty + 8 * e, ((n >> 1) - 1) & 1);
      const int64_t item = static_cast<int64_t>(
          atomicAdd(reinterpret_cast<unsigned long long*>(a.work_counter), 1ull));
      describe(item, &item_ring[e]);
      MbarArrive(item_full + 8 * e);  // release: the consumers see the entry
      const Item& it = item_ring[e];  // rewritten by this thread only, two items on
      if (it.end) break;
      const int n_tiles = it.n_tiles;
      if (n_tiles <= 0) continue;
      const int32_t kvh = static_cast<int32_t>(it.h / a.group);
      // Q's buffer is free once both consumers' last Q·Kᵀ of the previous item completed.
      if (qi >= 1) MbarWait(q_empty, (qi - 1) & 1);
      MbarArriveExpectTx(q_full, T::kQBytes);
      for (int sl = 0; sl < T::kQkSlabs; ++sl) {
        TmaLoad3d(base + T::kQOffset + sl * T::kSlabBytes, &args.q_map, q_full, 64 * sl,
                  static_cast<int32_t>(it.h), static_cast<int32_t>(it.s.q0 + it.row0));
      }
      for (int j = 0; j < n_tiles; ++j, ++g) {
        const uint32_t st = g & 1;
        const int32_t krow = static_cast<int32_t>(it.s.k0 + int64_t{T::kBlockN} * j);
        // Stage st last held tile g - 2: phase (g >> 1) - 1 of its empty barriers.
        if (g >= 2) MbarWait(k_empty + 8 * st, ((g >> 1) - 1) & 1);
        MbarArriveExpectTx(k_full + 8 * st, T::kKStageBytes);
        for (int sl = 0; sl < T::kQkSlabs; ++sl) {
          TmaLoad3d(base + T::kKOffset + st * T::kKStageBytes + sl * T::kSlabBytes, &args.k_map,
                    k_full + 8 * st, 64 * sl, kvh, krow);
        }
        if (g >= 2) MbarWait(v_empty + 8 * st, ((g >> 1) - 1) & 1);
        MbarArriveExpectTx(v_full + 8 * st, T::kVStageBytes);
        for (int sl = 0; sl < T::kVSlabs; ++sl) {
          TmaLoad3d(base + T::kVOffset + st * T::kVStageBytes + sl * T::kSlabBytes, &args.v_map,
                    v_full + 8 * st, 64 * sl, kvh, krow);
        }
      }
      ++qi;
    }
    return;
  }

  // ---- Consumers: warp w of warpgroup wg owns query rows 64·wg + 16w + lane/4 and + 8.
  SetMaxRegsInc<T::kConsumerRegs>();
  const int warp = (tid / 32) % 4, lane = tid % 32, cq = 2 * (lane % 4);
  const int r0 = 64 * wg + 16 * warp + lane / 4;
  const uint64_t q_desc = SmemDescKMajor(base + T::kQOffset + 64 * wg * kSwizzleRowBytes);
  float o[kDv / 2];                 // O rows r0, r0 + 8 x kDv columns, wgmma accumulator layout
  float sc[64];                     // S (then P in f32) of one tile: 64 rows x 128 keys
  uint32_t p_hi[8][4], p_lo[8][4];  // P of the previous tile as A fragments (k-step, register)
  uint32_t g = 0, qi = 0;
  for (uint32_t n = 0;; ++n) {
    const uint32_t e = n & 1;
    MbarWait(item_full + 8 * e, (n >> 1) & 1);
    const Item& it = item_ring[e];
    const SeqRange s = it.s;
    const int64_t h = it.h, row0 = it.row0;
    const int nrows = it.nrows, n_tiles = it.n_tiles, end = it.end;
    __syncwarp();  // the warp's reads of the entry come before its arrival
    if (lane == 0) MbarArrive(item_empty + 8 * e);
    if (end) break;
    if (n_tiles < 0) continue;
    if (n_tiles == 0) {  // no row sees a key: out 0, lse -inf, no loads at all
      for (int64_t i = tid; i < int64_t{nrows} * a.d_v; i += 256) {
        OutRow(a, s.q0 + row0 + i / a.d_v, h)[i % a.d_v] = 0;
      }
      if (a.lse != nullptr) {
        for (int i = tid; i < nrows; i += 256) *LseAt(a, s.q0 + row0 + i, h) = -INFINITY;
      }
      continue;
    }
    int64_t limit[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = r0 + 8 * i;
      limit[i] = r < nrows ? KeyLimit(a, row0 + r, s.lq, s.lk) : 0;
    }
    // From which key any row of this warpgroup needs a mask (limits grow with the row; a partly
    // filled warpgroup masks everywhere).
    const int64_t mask_from = 64 * wg + 63 < nrows ? KeyLimit(a, row0 + 64 * wg, s.lq, s.lk) : 0;
    // Keys [0, wg_keys) are all that any row of this warpgroup sees: in a tile whose keys past
    // its first 64 are all beyond it (the diagonal tile of WG0 in causal) P is 0 there, and P·V
    // takes 4 k-steps of 16 keys instead of 8 (tiles j >= half_from). Q·Kᵀ stays N 128: an N 64
    // form for such tiles made ptxas serialise the kernel's wgmmas (docs/KERNELS.md "MLA
    // prefill on Hopper").
    const int64_t wg_keys =
        64 * wg < nrows ? KeyLimit(a, row0 + Min64(64 * wg + 63, nrows - 1), s.lq, s.lk) : 0;
    const int half_from = static_cast<int>(Max64(wg_keys - 64 + T::kBlockN - 1, 0) / T::kBlockN);
    auto half_tile = [&](int j) { return j >= half_from; };
#pragma unroll
    for (int i = 0; i < kDv / 2; ++i) o[i] = 0.0f;
    float m_run[2] = {kInitialMax, kInitialMax}, l_run[2] = {0.0f, 0.0f};

    // S = Q·Kᵀ of the tile in stage st (one commit group).
    auto issue_qk = [&](int st) {
      WgmmaSsOverSlabs<128, T::kQkSlabs>(
          sc, q_desc, SmemDescKMajor(base + T::kKOffset + st * T::kKStageBytes), T::kSlabBytes);
      WgmmaCommit();
    };
    // O += P·V of the tile in stage st (one commit group): 8 k-steps of 16 keys (a half tile 4:
    // its P past the first 64 keys is 0), HIGH twice.
    auto issue_pv = [&](int st, bool half) {
      const uint64_t v0 = SmemDescMnMajor(base + T::kVOffset + st * T::kVStageBytes, T::kSlabBytes);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        if (half && kk == 4) break;
        uint64_t vd = DescAdvance(v0, 2048 * kk);
        asm volatile("" : "+l"(vd));
        Wgmma<kDv, WgmmaA::kRegs>::template Run<true>(o, p_hi[kk], vd, true);
        if constexpr (kExactP) Wgmma<kDv, WgmmaA::kRegs>::template Run<true>(o, p_lo[kk], vd, true);
      }
      WgmmaCommit();
    };
    // Online softmax of the completed S of the tile starting at key k0: P (f32) in place of S,
    // the rescale factor of the earlier O in alpha, the row sums.
    auto softmax = [&](int64_t k0, float(&alpha)[2]) {
      float mx[2] = {-INFINITY, -INFINITY};
      if (k0 + T::kBlockN > mask_from) {  // warpgroup-uniform: some row's limit is in the tile
        int lim[2];                       // each row's limit relative to the tile, in [0, 128]
#pragma unroll
        for (int i = 0; i < 2; ++i) lim[i] = static_cast<int>(Min64(Max64(limit[i] - k0, 0), 128));
#pragma unroll
        for (int j = 0; j < 16; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (8 * j + cq + (e & 1) >= lim[e >> 1]) sc[4 * j + e] = -INFINITY;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], sc[4 * j + e]);
      }
      WgmmaSoftmaxStep(sc, mx, a.scale_log2, m_run, l_run, alpha);
    };
    // P (f32 in sc) as the A fragments of P·V: k-step kk is accumulator registers 8kk .. 8kk + 7.
    auto pack_p = [&]() { WgmmaPackP<8, kExactP>(sc, p_hi, p_lo); };
    // O (everything before the last softmax's tile) rescaled to that softmax's running max. Done
    // after Q·Kᵀ of the next tile is issued and before the P·V that adds to O, as
    // FlashAttention-3 does, so the tensor cores work while it runs and nothing but the P packing
    // sits between a P·V's completion and the next issue (docs/KERNELS.md "MLA prefill on
    // Hopper"). After tile 0, O is still zero, so that first factor (0, or 1 for a row that saw
    // no key yet) leaves it zero.
    auto rescale_o = [&](const float(&al)[2]) {
#pragma unroll
      for (int i = 0; i < kDv / 8; ++i) {
        o[4 * i + 0] *= al[0];
        o[4 * i + 1] *= al[0];
        o[4 * i + 2] *= al[1];
        o[4 * i + 3] *= al[1];
      }
    };
    // Waits for V of tile j; where the tile crosses the sequence's last key, both consumers zero
    // the rows past it (generic stores, then the proxy fence) and meet before either reads them.
    auto wait_v = [&](int j) {
      const uint32_t gj = g + j, st = gj & 1;
      MbarWait(v_full + 8 * st, (gj >> 1) & 1);
      const int64_t k0 = int64_t{T::kBlockN} * j;
      if (k0 + T::kBlockN > s.lk) {  // the same for both warpgroups
        const int first = static_cast<int>(Max64(s.lk - k0, 0));
        uint8_t* v_st = smem + T::kVOffset + st * T::kVStageBytes;
        constexpr int kChunks = 8 * T::kVSlabs;  // 16-byte chunks of a row, over its slabs
        for (int i = tid; i < (T::kBlockN - first) * kChunks; i += 256) {
          const int row = first + i / kChunks, c = i % kChunks;
          *reinterpret_cast<uint4*>(v_st + (c / 8) * T::kSlabBytes + row * 128 + 16 * (c % 8)) =
              make_uint4(0, 0, 0, 0);
        }
        FenceProxyAsync();
        NamedBarSync(kBarVZeroed, 256);
      }
    };

    // Issue turns: the consumers issue their MMAs alternately, so that one's softmax runs while
    // the other's MMAs keep the tensor cores busy (measured 2-3 % faster in FAST than issuing
    // freely, HIGH within 1.2 % either way: docs/BENCHMARKS.md "MLA prefill on Hopper"). WG1
    // gives WG0 the first turn; the arrivals balance the syncs (WG1 does not hand back after its
    // last turn).
    const int n_turns = n_tiles + 1;  // Q·Kᵀ of tile 0, then (Q·Kᵀ j, P·V j - 1), then P·V last
    int turn = 0;
    auto begin_turn = [&]() { NamedBarSync(kBarTurn0 + wg, 256); };
    auto end_turn = [&]() {
      if (wg == 0 || turn + 1 < n_turns) NamedBarArrive(kBarTurn0 + (wg ^ 1), 256);
      ++turn;
    };
    if (wg == 1) NamedBarArrive(kBarTurn0, 256);

    MbarWait(q_full, qi & 1);
    float alpha[2];
    // Tile 0: O is still zero, nothing to rescale.
    MbarWait(k_full + 8 * (g & 1), (g >> 1) & 1);
    begin_turn();
    WgmmaFence();
    issue_qk(g & 1);
    end_turn();
    WgmmaWait<0>();
    FenceAccumulators(sc);
    if (lane == 0) {
      MbarArrive(k_empty + 8 * (g & 1));
      if (n_tiles == 1) MbarArrive(q_empty);  // the item's last Q·Kᵀ: Q may be replaced
    }
    softmax(0, alpha);
    pack_p();
    for (int j = 1; j < n_tiles; ++j) {
      const uint32_t gj = g + j, st = gj & 1;
      MbarWait(k_full + 8 * st, (gj >> 1) & 1);
      wait_v(j - 1);
      begin_turn();
      WgmmaFence();
      issue_qk(st);
      rescale_o(alpha);  // under Q·Kᵀ of tile j; P·V of tile j - 2 completed last iteration
      WgmmaFence();
      issue_pv(st ^ 1, half_tile(j - 1));
      end_turn();
      WgmmaWait<1>();  // Q·Kᵀ of tile j (committed first) is complete
      FenceAccumulators(sc);
      if (lane == 0) {
        MbarArrive(k_empty + 8 * st);
        if (j == n_tiles - 1) MbarArrive(q_empty);
      }
      softmax(int64_t{T::kBlockN} * j, alpha);  // under P·V of tile j - 1
      WgmmaWait<0>();
      FenceAccumulators(o);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {  // keeps P's registers live (the async P·V reads them)
        FenceRegisters(p_hi[kk]);
        if constexpr (kExactP) FenceRegisters(p_lo[kk]);
      }
      if (lane == 0) MbarArrive(v_empty + 8 * (st ^ 1));
      pack_p();
    }
    wait_v(n_tiles - 1);
    begin_turn();
    rescale_o(alpha);
    WgmmaFence();
    issue_pv((g + n_tiles - 1) & 1, half_tile(n_tiles - 1));
    end_turn();
    WgmmaWait<0>();
    FenceAccumulators(o);
    if (lane == 0) MbarArrive(v_empty + 8 * ((g + n_tiles - 1) & 1));
    g += n_tiles;
    ++qi;

    // Epilogue: row sums over the quad, then out = O / l and lse (rows past nrows are skipped).
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float l = l_run[i];
      l += ::attnd::gpu::ShflXor(l, 1);
      l += ::attnd::gpu::ShflXor(l, 2);
      const int r = r0 + 8 * i;
      if (r >= nrows) continue;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      uint16_t* out = OutRow(a, s.q0 + row0 + r, h) + cq;
#pragma unroll
      for (int j = 0; j < kDv / 8; ++j) {
        *reinterpret_cast<uint32_t*>(out + 8 * j) =
            PackBf16x2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      }
      if (cq == 0 && a.lse != nullptr) {
        *LseAt(a, s.q0 + row0 + r, h) = l > 0.0f ? (m_run[i] + log2f(l)) * kLn2 : -INFINITY;
      }
    }
  }  // items
#else
  __trap();  // sm_90a only: GpuSupports refuses other devices
#endif
}

// One instance's launch over `grid` persistent CTAs (the schedule kernel ran before it).
template <int kDqk, int kDv, bool kExactP>
::attnd::gpu::Error LaunchWgmmaPrefillInstance(const WgmmaPrefillArgs& args, int64_t grid,
                                               ::attnd::gpu::Stream stream) {
  using T = WgmmaPrefillTile<kDqk, kDv>;
  const void* fn = reinterpret_cast<const void*>(&MlaPrefillWgmmaKernel<kDqk, kDv, kExactP>);
  const ::attnd::gpu::Error e = ::attnd::gpu::AllowDynamicSmem(fn, T::kSmemBytes);
  if (e != ::attnd::gpu::kSuccess) return e;
  MlaPrefillWgmmaKernel<kDqk, kDv, kExactP>
      <<<dim3(static_cast<unsigned>(grid)), T::kThreads, T::kSmemBytes, stream>>>(args);
  return ::attnd::gpu::GetLastError();
}

// How the instance runs (block_m, threads, shared memory, residency on the current device).
template <int kDqk, int kDv>
KernelShape WgmmaPrefillShape() {
  using T = WgmmaPrefillTile<kDqk, kDv>;
  return MakeKernelShape(reinterpret_cast<const void*>(&MlaPrefillWgmmaKernel<kDqk, kDv, true>),
                         T::kBlockM, T::kThreads, T::kSmemBytes);
}

// Explicit instantiation (wgmma_d192.cu) or its extern declaration (wgmma.cu): both precisions.
#define ATTND_MLA_PREFILL_WGMMA_INSTANCE(EXTERN, DQK, DV)                         \
  EXTERN template ::attnd::gpu::Error LaunchWgmmaPrefillInstance<DQK, DV, true>(  \
      const WgmmaPrefillArgs&, int64_t, ::attnd::gpu::Stream);                    \
  EXTERN template ::attnd::gpu::Error LaunchWgmmaPrefillInstance<DQK, DV, false>( \
      const WgmmaPrefillArgs&, int64_t, ::attnd::gpu::Stream);                    \
  EXTERN template KernelShape WgmmaPrefillShape<DQK, DV>();

}  // namespace attnd::kernels::mla_prefill::gpu
