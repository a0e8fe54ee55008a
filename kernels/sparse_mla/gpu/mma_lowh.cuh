// The low-head tensor-core sparse MLA kernel (CUDA sm_80+, bf16 mma.sync m16n8k16, f32
// accumulate) for H <= 32, without padding heads to 64. Head slots per token Hs = 8, 16 or 32
// (H rounded up; padded rows are zero and never written); a CTA (8 warps) takes G = 64 / Hs
// neighbouring query tokens, stacked as 64 rows (token-major) of S and O in four m16 tiles, and
// one split of each token's slots. The tokens' slots are walked in lockstep, kBlockN at a time
// (64 at d_qk 512, 48 at 576); each such block is deduplicated into a union:
//   union    an entry (token u, slot i) whose row also appears in an earlier token's block is
//            not gathered again: it adds one to token u's multiplicity of the column of the
//            smallest entry holding that row (sort-free: a shared-memory hash table, row ->
//            smallest entry, by atomicCAS / atomicMin). Rows repeated within one token stay
//            separate columns. P = multiplicity · exp2(s − m), so duplicates count as often as
//            they appear; masked slots (past the range, < 0 or >= S) are never read. Columns
//            come in entry order: deterministic.
//   tiles    the union's columns, kBlockN KV rows a tile, cp.async 16 B per thread into a
//            swizzled [kBlockN][d_qk] tile, double-buffered (tile i+1 in flight during tile i);
//            the next block's union is built at its predecessor's first tile, and the indices
//            of the block after that are loaded into registers then, so no index load waits.
//   S = Q·Kᵀ only for the m16 tiles whose tokens have a column in the tile (A of 4). Warps:
//            (m slot, n half, k part) with A' = 1, 2 or 4 m slots (A rounded up), 2 halves of
//            kBlockN / 2 columns and 4 / A' parts of d_qk; parts > 1 are summed through shared
//            memory (fixed order). Q's first 512 columns sit in shared memory, d576's 64 rope
//            columns are read (L1) into registers by the part-0 warps.
//   softmax  row max over the two halves through shared memory; running max and sum per
//            stacked row in shared memory (log2 units, exp2 with sm_scale·log2e folded, running
//            max from -1e30, masked scores -inf); P in bf16 as mma.cuh (HIGH: hi + lo).
//   O += P·V warp w owns O[:, 64w .. 64w+63] for the 64 stacked rows (128 f32 registers);
//            only active m16 tiles are rescaled and multiplied.
// On causal selections that neighbouring tokens share (kpool4), one gathered row serves all G
// tokens (A = 4). On uniform selections a tile is one token's (A = 1) and the kernel is latency
// bound (8 warps per SM, 2-stage ring) and slower than mma.cuh (docs/BENCHMARKS.md
// "Low head counts"), which is why cuda_mma_auto runs it only where neighbouring tokens share rows.
// TODO: a faster A = 1 path. Instantiated in mma_lowh_d512.cu / mma_lowh_d576.cu; launched by
// mma_lowh.cu.
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/sparse_mla/gpu/mma_lowh.cuh is CUDA-only"
#endif

#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/mma_sync.cuh"
#include "kernels/common/gpu/tiles.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/sparse_mla/gpu/common.cuh"
#include "kernels/sparse_mla/gpu/mma.cuh"
#include "kernels/sparse_mla/gpu/plan.h"

namespace attnd::kernels::sparse_mla::gpu {

constexpr int LowhAlign(int bytes, int to) { return CeilDiv(bytes, to) * to; }

template <int kHs, int kDqk>
struct LowhTile {
  static_assert(kHs == 8 || kHs == 16 || kHs == 32, "8, 16 or 32 head slots per token");
  static_assert(kDqk == 512 || kDqk == 576, "d_qk 512 or 576");
  static constexpr int kThreads = 256;
  static constexpr int kWarps = 8;
  static constexpr int kBlockM = 64;                     // stacked (token, head) rows of S and O
  static constexpr int kMTiles = kBlockM / 16;           // m16 tiles
  static constexpr int kTokens = kBlockM / kHs;          // query tokens per CTA (G)
  static constexpr int kBlockN = kDqk == 512 ? 64 : 48;  // slots per token per block; tile rows
  static constexpr int kHalfN = kBlockN / 2;             // columns per QK warp
  static constexpr int kNt = kHalfN / 8;                 // n8 tiles per QK warp
  static constexpr int kKSteps = 512 / 16;               // k16 steps over Q's first 512 columns
  static constexpr int kRopeSteps = (kDqk - 512) / 16;
  static constexpr int kOTiles = kDimV / kWarps / 8;  // n8 tiles of O per warp (8)
  static constexpr int kQRowBytes = 512 * 2;
  static constexpr int kKvRowBytes = kDqk * 2;
  static constexpr int kKvChunks = kDqk / 8;  // 16-B chunks per KV row
  static constexpr int kTileChunks = kBlockN * kKvChunks;
  static constexpr int kGatherIters = CeilDiv(kTileChunks, kThreads);
  static constexpr int kPRowBytes = kBlockN * 2 + 16;  // padded: ldmatrix rows hit distinct banks
  static constexpr int kEntries = kTokens * kBlockN;   // selection entries per block
  static constexpr int kEntryRounds = CeilDiv(kEntries, kThreads);
  static constexpr int kInfoInts = 1 + kTokens;  // tile count, then a token mask per union tile
  // Dedupe hash table: row -> smallest entry index holding it; load factor <= 1/2.
  static constexpr int kHashSlots = 2 * kEntries <= 256 ? 256 : 2 * kEntries <= 512 ? 512 : 1024;
  static constexpr int kMaxParts = 6;  // QK partials: (m slot, half, part > 0)
  // Shared memory (bytes): Q | KV stage 0 | KV stage 1 | P hi | P lo (scratch between uses) |
  // union rows [2][kEntries] | multiplicities u8 [2][kTokens][kEntries] | tile info [2] |
  // statistics f32 (m, l, alpha, max [2], sum [2]) per row | token ranges | warp counts.
  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + kBlockM * kQRowBytes;
  static constexpr int kKvStageBytes = kBlockN * kKvRowBytes;
  static constexpr int kPOffset = kKvOffset + 2 * kKvStageBytes;
  static constexpr int kPBytes = kBlockM * kPRowBytes;
  static constexpr int kUrowOffset = kPOffset + 2 * kPBytes;
  static constexpr int kCntOffset = kUrowOffset + 2 * kEntries * 4;
  static constexpr int kInfoOffset = kCntOffset + 2 * kTokens * kEntries;
  static constexpr int kStatOffset = kInfoOffset + 2 * kInfoInts * 4;
  static constexpr int kRangeOffset = LowhAlign(kStatOffset + 7 * kBlockM * 4, 16);
  static constexpr int kCountOffset = kRangeOffset + kTokens * 24;
  static constexpr int kSmemBytes = kCountOffset + kEntryRounds * kWarps * 4;
  static_assert(kEntries * 8 + kHashSlots * 8 <= 2 * kPBytes, "dedupe scratch fits in P");
  static_assert(2 * kEntries <= kHashSlots, "hash load factor <= 1/2");
  static_assert(kMaxParts * kNt * 4 * 32 * 4 <= 2 * kPBytes, "QK partials fit in the P buffers");
  static_assert(kKvOffset % 1024 == 0 && kKvStageBytes % 1024 == 0 && kPOffset % 16 == 0,
                "16-byte aligned tiles, 128-byte swizzle atoms");
  static_assert((kBlockN * 4) % 16 == 0, "a token's entries are whole int4s");
  static_assert(kBlockN <= kSplitAlign, "a split range holds whole blocks or a tail");
  static_assert(kSmemBytes <= kSm90MaxSmemBytes, "fits sm_90's 227 KiB of shared memory per block");
};

// A token's slot range for this CTA's split (SplitSlots), kept in shared memory.
struct LowhRange {
  const int32_t* slots;
  int64_t begin, end;
};

// kExactP: Precision::kHigh (P·V as (P hi + P lo)·V); false: Precision::kFast (bf16 P).
template <int kHs, int kDqk, bool kExactP>
__global__ void __launch_bounds__(256, 1) SparseMlaLowhKernel(const KernelArgs a) {
  using Tile = LowhTile<kHs, kDqk>;
  using namespace ::attnd::gpu::ptx;
  constexpr int kThreads = Tile::kThreads, kBlockN = Tile::kBlockN, kEntries = Tile::kEntries;
  if (GateClosed(a)) return;  // another kernel was chosen for this call (common.cuh)
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t q_s = SmemAddr(smem + Tile::kQOffset);
  const uint32_t kv_s = SmemAddr(smem + Tile::kKvOffset);
  const uint32_t p_hi_s = SmemAddr(smem + Tile::kPOffset);
  const uint32_t p_lo_s = p_hi_s + Tile::kPBytes;
  int32_t* ent_s = reinterpret_cast<int32_t*>(smem + Tile::kPOffset);  // dedupe scratch
  int16_t* col_s = reinterpret_cast<int16_t*>(smem + Tile::kPOffset + 4 * kEntries);
  int16_t* own_s = col_s + kEntries;
  int32_t* hkey_s = reinterpret_cast<int32_t*>(smem + Tile::kPOffset + 8 * kEntries);
  int32_t* hval_s = hkey_s + Tile::kHashSlots;
  float* part_s = reinterpret_cast<float*>(smem + Tile::kPOffset);  // QK partial sums
  int32_t* urow_s = reinterpret_cast<int32_t*>(smem + Tile::kUrowOffset);
  uint8_t* cnt_s = smem + Tile::kCntOffset;
  int32_t* info_s = reinterpret_cast<int32_t*>(smem + Tile::kInfoOffset);
  float* m_s = reinterpret_cast<float*>(smem + Tile::kStatOffset);  // [kBlockM] running max
  float* l_s = m_s + Tile::kBlockM;                                 // [kBlockM] running sum
  float* alpha_s = l_s + Tile::kBlockM;                             // [kBlockM] this tile's factor
  float* max_s = alpha_s + Tile::kBlockM;                           // [2][kBlockM] half maxima
  float* sum_s = max_s + 2 * Tile::kBlockM;                         // [2][kBlockM] half sums
  LowhRange* range_s = reinterpret_cast<LowhRange*>(smem + Tile::kRangeOffset);
  int32_t* count_s = reinterpret_cast<int32_t*>(smem + Tile::kCountOffset);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, cq = 2 * (lane % 4);  // mma fragment row and column pair
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * Tile::kTokens;
  const int split = blockIdx.y;

  if (tid < Tile::kTokens) {
    LowhRange r{a.indices, 0, 0};
    if (t0 + tid < a.tokens) {
      const SlotRange s = SplitSlots(a, t0 + tid, split);
      r = {s.slots, s.begin, s.end};
    }
    range_s[tid] = r;
  }
  if (tid < Tile::kBlockM) {
    m_s[tid] = kInitialMax;
    l_s[tid] = 0.0f;
  }
  __syncthreads();
  int64_t blocks = 0;
#pragma unroll
  for (int u = 0; u < Tile::kTokens; ++u) {
    blocks = max(blocks, (range_s[u].end - range_s[u].begin + kBlockN - 1) / kBlockN);
  }

  // Raw indices of block `blk` for this thread's entries (tid + kThreads·k): loads issued now,
  // validated at Dedupe, so nothing waits for them in between. Never reads past a range end.
  int32_t pend[Tile::kEntryRounds];
  auto load_entries = [&](int64_t blk) {
#pragma unroll
    for (int k = 0; k < Tile::kEntryRounds; ++k) {
      const int e = tid + kThreads * k;
      pend[k] = -1;
      if (e < kEntries) {
        const LowhRange r = range_s[e / kBlockN];
        const int64_t slot = r.begin + blk * kBlockN + e % kBlockN;
        if (slot < r.end) pend[k] = r.slots[slot];
      }
    }
  };

  // The union of the block in `pend` into buffer `ub`: rows, per-token multiplicities, tile
  // count and per-tile token masks. Five barriers; ends with one.
  auto dedupe = [&](int ub) {
    int32_t* urow = urow_s + ub * kEntries;
    uint8_t* cnt = cnt_s + ub * Tile::kTokens * kEntries;
    int32_t* info = info_s + ub * Tile::kInfoInts;
#pragma unroll
    for (int k = 0; k < Tile::kEntryRounds; ++k) {
      const int e = tid + kThreads * k;
      if (e < kEntries) {
        const int32_t v = pend[k];
        ent_s[e] = (v >= 0 && static_cast<int64_t>(v) < a.kv_rows) ? v : -1;
        urow[e] = -1;
      }
    }
    for (int w = tid; w < Tile::kTokens * kEntries / 4; w += kThreads) {
      reinterpret_cast<uint32_t*>(cnt)[w] = 0u;
    }
    if (tid < Tile::kInfoInts) info[tid] = 0;
    for (int x = tid; x < Tile::kHashSlots; x += kThreads) {
      hkey_s[x] = -1;
      hval_s[x] = INT32_MAX;
    }
    __syncthreads();

    // Each valid entry into the hash table (linear probing): its row's slot keeps the smallest
    // entry index holding the row.
    int slot[Tile::kEntryRounds];
#pragma unroll
    for (int k = 0; k < Tile::kEntryRounds; ++k) {
      const int e = tid + kThreads * k;
      const int32_t row = e < kEntries ? ent_s[e] : -1;
      slot[k] = -1;
      if (row >= 0) {
        uint32_t h = (static_cast<uint32_t>(row) * 0x9e3779b1u) % Tile::kHashSlots;
        for (;;) {
          const int prev = atomicCAS(&hkey_s[h], -1, row);
          if (prev == -1 || prev == row) break;
          h = (h + 1) % Tile::kHashSlots;
        }
        atomicMin(&hval_s[h], e);
        slot[k] = static_cast<int>(h);
      }
    }
    __syncthreads();

    // Owner of each entry: the smallest entry holding its row when that lies in an earlier
    // token (it is then fresh: no token before it holds the row), else -1 (a fresh column).
    // Kept in shared memory so nothing here stays live in registers beside O.
#pragma unroll
    for (int k = 0; k < Tile::kEntryRounds; ++k) {
      const int e = tid + kThreads * k;
      const int32_t row = e < kEntries ? ent_s[e] : -1;
      int owner = -1;
      if (row >= 0) {
        const int first = hval_s[slot[k]];
        if (first / kBlockN < e / kBlockN) owner = first;
        own_s[e] = static_cast<int16_t>(owner);
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, row >= 0 && owner < 0);
      if (lane == 0) count_s[k * Tile::kWarps + warp] = __popc(ballot);
    }
    __syncthreads();

    // Columns of the fresh entries in entry order (k, warp, lane); the union rows.
    int total = 0;
#pragma unroll
    for (int k = 0; k < Tile::kEntryRounds; ++k) {
      int before = 0;
#pragma unroll
      for (int k2 = 0; k2 < Tile::kEntryRounds; ++k2) {
#pragma unroll
        for (int w2 = 0; w2 < Tile::kWarps; ++w2) {
          const int c = count_s[k2 * Tile::kWarps + w2];
          if (k2 < k || (k2 == k && w2 < warp)) before += c;
          if (k == 0) total += c;
        }
      }
      const int e = tid + kThreads * k;
      const int32_t row = e < kEntries ? ent_s[e] : -1;
      const bool fresh = row >= 0 && own_s[e] < 0;
      const unsigned ballot = __ballot_sync(0xffffffffu, fresh);
      if (fresh) {
        const int col = before + __popc(ballot & ((1u << lane) - 1u));
        col_s[e] = static_cast<int16_t>(col);
        urow[col] = row;
      }
    }
    if (tid == 0) info[0] = max(1, (total + kBlockN - 1) / kBlockN);
    __syncthreads();

    // Multiplicities and per-tile token masks (a warp ORs its lanes' (tile, token) bits first:
    // one shared atomic per warp and tile rather than one per entry on a single word).
#pragma unroll
    for (int k = 0; k < Tile::kEntryRounds; ++k) {
      const int e = tid + kThreads * k;
      uint64_t bits = 0;  // bit 8·tile + token
      if (e < kEntries && ent_s[e] >= 0) {
        const int owner = own_s[e];
        const int col = col_s[owner >= 0 ? owner : e];
        const int u = e / kBlockN;
        atomicAdd(reinterpret_cast<unsigned*>(cnt + u * kEntries + (col & ~3)),
                  1u << (8 * (col & 3)));
        bits = uint64_t{1} << (8 * (col / kBlockN) + u);
      }
      const unsigned lo = __reduce_or_sync(0xffffffffu, static_cast<unsigned>(bits));
      const unsigned hi = __reduce_or_sync(0xffffffffu, static_cast<unsigned>(bits >> 32));
      if (lane < Tile::kTokens) {  // lane x: tile x's tokens
        const unsigned m = ((lane < 4 ? lo >> (8 * lane) : hi >> (8 * (lane - 4)))) & 0xffu;
        if (m != 0) atomicOr(&info[1 + lane], static_cast<int>(m));
      }
    }
    __syncthreads();
  };

  // Union tile `tile` of buffer `ub` into KV stage `stage`; masked columns are zeroed by plain
  // stores (P is 0 there and V must be finite) and read nothing.
  auto gather = [&](int stage, int ub, int tile) {
    const uint32_t dst = kv_s + stage * Tile::kKvStageBytes;
    uint8_t* base = smem + Tile::kKvOffset + stage * Tile::kKvStageBytes;
    const int32_t* urow = urow_s + ub * kEntries + tile * kBlockN;
#pragma unroll 4  // fully unrolled, the addresses of all 16 chunks stay live beside O: spills
    for (int it = 0; it < Tile::kGatherIters; ++it) {
      const int e = tid + kThreads * it;
      if (Tile::kTileChunks % kThreads == 0 || e < Tile::kTileChunks) {
        const int r = e / Tile::kKvChunks, c = e % Tile::kKvChunks;
        const int32_t kv_row = urow[r];
        const uint32_t off = Swizzle(r, c, Tile::kKvRowBytes);
        if (kv_row >= 0) {
          CpAsync16(dst + off, a.kv + static_cast<int64_t>(kv_row) * a.kv_stride + c * 8, true);
        } else {
          *reinterpret_cast<uint4*>(base + off) = make_uint4(0, 0, 0, 0);
        }
      }
    }
  };

  float o[Tile::kMTiles][Tile::kOTiles][4] = {};  // O[:, 64·warp ..] for the 64 stacked rows

  // One union tile: S for the active m16 tiles, online softmax, O += P·V. Uniform control flow
  // (every branch condition is the same for all threads).
  auto compute = [&](int stage, int ub, int tile) {
    const int tmask = info_s[ub * Tile::kInfoInts + 1 + tile];
    int mm = 0;  // active m16 tiles
#pragma unroll
    for (int u = 0; u < Tile::kTokens; ++u) {
      if ((tmask >> u) & 1) {
        if (kHs == 8) mm |= 1 << (u / 2);
        if (kHs == 16) mm |= 1 << u;
        if (kHs == 32) mm |= 3 << (2 * u);
      }
    }
    if (mm == 0) return;
    const int active = __popc(mm);
    const int slots = active == 1 ? 1 : active == 2 ? 2 : 4;
    const int parts = 4 / slots;
    const int mslot = warp / (2 * parts), nh = (warp / parts) % 2, kp = warp % parts;
    int mt = -1;
    if (mslot < active) {
      int x = mm;
      for (int s = 0; s < mslot; ++s) x &= x - 1;
      mt = __ffs(x) - 1;
    }
    const uint8_t* cnt = cnt_s + ub * Tile::kTokens * kEntries + tile * kBlockN;
    const uint32_t kv_tile = kv_s + stage * Tile::kKvStageBytes;
    const int n0 = nh * Tile::kHalfN;

    // S = Q·Kᵀ: rows mt·16 .. +15, columns n0 .. n0 + kHalfN, k part kp of d_qk.
    float s[Tile::kNt][4] = {};
    if (mt >= 0) {
      const int per = Tile::kKSteps / parts, ks0 = kp * per;
#pragma unroll 2
      for (int ks = ks0; ks < ks0 + per; ks += 2) {
        QkTwoSteps<Tile::kNt, Tile::kQRowBytes, Tile::kKvRowBytes>(s, q_s, kv_tile, mt, n0, ks,
                                                                   lane);
      }
      if (Tile::kRopeSteps > 0 && kp == 0) {
#pragma unroll
        for (int rs = 0; rs < Tile::kRopeSteps; rs += 2) {
          uint32_t qr[2][4];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int r = mt * 16 + g + 8 * (i & 1);
              const int64_t t = t0 + r / kHs;
              const int h = r % kHs;
              const int col = 512 + 16 * (rs + j) + cq + 8 * (i >> 1);
              qr[j][i] =
                  (t < a.tokens && h < a.heads)
                      ? *reinterpret_cast<const uint32_t*>(
                            a.q + t * a.q_stride_t + static_cast<int64_t>(h) * a.q_stride_h + col)
                      : 0u;
            }
          }
#pragma unroll
          for (int nt = 0; nt < Tile::kNt; ++nt) {
            uint32_t kb[4];
            LdMatrixX4(kb, kv_tile + Swizzle(n0 + 8 * nt + lane % 8, 64 + 2 * rs + lane / 8,
                                             Tile::kKvRowBytes));
            MmaBf16(s[nt], qr[0], {kb[0], kb[1]});
            MmaBf16(s[nt], qr[1], {kb[2], kb[3]});
          }
        }
      }
    }
    if (parts > 1) {
      constexpr int kPartFloats = Tile::kNt * 4 * 32;
      const int pbase = (mslot * 2 + nh) * (parts - 1);
      if (mt >= 0 && kp > 0) {
        float* dst = part_s + (pbase + kp - 1) * kPartFloats;
#pragma unroll
        for (int nt = 0; nt < Tile::kNt; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) dst[(nt * 4 + e) * 32 + lane] = s[nt][e];
        }
      }
      __syncthreads();  // (R) partials visible
      if (mt >= 0 && kp == 0) {
        for (int p = 1; p < parts; ++p) {
          const float* src = part_s + (pbase + p - 1) * kPartFloats;
#pragma unroll
          for (int nt = 0; nt < Tile::kNt; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] += src[(nt * 4 + e) * 32 + lane];
          }
        }
      }
    }

    // Scores in log2 units, masked -inf; the half's row max to smem.
    const bool softmax = mt >= 0 && kp == 0;
    if (softmax) {
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < Tile::kNt; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = mt * 16 + g + 8 * (e >> 1);
          const int col = n0 + 8 * nt + cq + (e & 1);
          const bool ok = cnt[(r / kHs) * kEntries + col] != 0;
          s[nt][e] = ok ? s[nt][e] * a.scale_log2 : -INFINITY;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], ::attnd::gpu::ShflXor(mx[i], 1));
        mx[i] = fmaxf(mx[i], ::attnd::gpu::ShflXor(mx[i], 2));
        if (lane % 4 == 0) max_s[nh * Tile::kBlockM + mt * 16 + g + 8 * i] = mx[i];
      }
    }
    __syncthreads();  // (B) both halves' maxima visible; partials consumed

    // New max, rescale factor, P = multiplicity · exp2(s − m) to smem (HIGH: as hi + lo).
    float m_new[2] = {0.0f, 0.0f}, alpha[2] = {1.0f, 1.0f};
    if (softmax) {
      float sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = mt * 16 + g + 8 * i;
        const float m_old = m_s[r];
        m_new[i] = fmaxf(m_old, fmaxf(max_s[r], max_s[Tile::kBlockM + r]));
        alpha[i] = Exp2(m_old - m_new[i]);
      }
#pragma unroll
      for (int nt = 0; nt < Tile::kNt; ++nt) {
        const int col = n0 + 8 * nt + cq;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int r = mt * 16 + g + 8 * i;
          const uint8_t* mult = cnt + (r / kHs) * kEntries + col;
          const float p0 = static_cast<float>(mult[0]) * Exp2(s[nt][2 * i] - m_new[i]);
          const float p1 = static_cast<float>(mult[1]) * Exp2(s[nt][2 * i + 1] - m_new[i]);
          sum[i] += p0 + p1;
          if constexpr (kExactP) {
            uint32_t hi, lo;
            SplitBf16x2(p0, p1, &hi, &lo);
            const int off = r * Tile::kPRowBytes + col * 2;
            *reinterpret_cast<uint32_t*>(smem + Tile::kPOffset + off) = hi;
            *reinterpret_cast<uint32_t*>(smem + Tile::kPOffset + Tile::kPBytes + off) = lo;
          } else {  // FAST: P rounded to bf16 once
            const int off = r * Tile::kPRowBytes + col * 2;
            *reinterpret_cast<uint32_t*>(smem + Tile::kPOffset + off) = PackBf16x2(p0, p1);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        sum[i] += ::attnd::gpu::ShflXor(sum[i], 1);
        sum[i] += ::attnd::gpu::ShflXor(sum[i], 2);
        const int r = mt * 16 + g + 8 * i;
        if (lane % 4 == 0) {
          sum_s[nh * Tile::kBlockM + r] = sum[i];
          if (nh == 0) alpha_s[r] = alpha[i];
        }
      }
    }
    __syncthreads();  // (C) P, alpha and the half sums visible
    if (softmax && nh == 0 && lane % 4 == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = mt * 16 + g + 8 * i;
        m_s[r] = m_new[i];
        l_s[r] = alpha[i] * l_s[r] + sum_s[r] + sum_s[Tile::kBlockM + r];
      }
    }

    // O[:, 64·warp ..] = alpha · O + P · V (HIGH: (P_hi + P_lo) · V) for the active m16 tiles.
#pragma unroll
    for (int m = 0; m < Tile::kMTiles; ++m) {
      if ((mm >> m) & 1) ScaleORows(o[m], alpha_s[m * 16 + g], alpha_s[m * 16 + g + 8]);
    }
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
      uint32_t v[Tile::kOTiles][2];
      LoadVFragments<Tile::kOTiles, Tile::kKvRowBytes>(v, kv_tile, ks, warp, lane);
#pragma unroll
      for (int m = 0; m < Tile::kMTiles; ++m) {
        if ((mm >> m) & 1) {
          uint32_t ph[4];
          const uint32_t off = (m * 16 + lane % 16) * Tile::kPRowBytes + (2 * ks + lane / 16) * 16;
          LdMatrixX4(ph, p_hi_s + off);
          if constexpr (kExactP) {
            uint32_t pl[4];
            LdMatrixX4(pl, p_lo_s + off);
            MmaPvHiLo(o[m], ph, pl, v);
          } else {
            MmaPv(o[m], ph, v);
          }
        }
      }
    }
  };

  if (blocks > 0) {
    // Q's first 512 columns, 64 stacked rows (zero for padded heads and tokens past T).
    for (int e = tid; e < Tile::kBlockM * 64; e += kThreads) {
      const int r = e / 64, c = e % 64;
      const int64_t t = t0 + r / kHs;
      const int h = r % kHs;
      if (t < a.tokens && h < a.heads) {
        CpAsync16(q_s + Swizzle(r, c, Tile::kQRowBytes),
                  a.q + t * a.q_stride_t + static_cast<int64_t>(h) * a.q_stride_h + c * 8, true);
      } else {
        *reinterpret_cast<uint4*>(smem + Tile::kQOffset + Swizzle(r, c, Tile::kQRowBytes)) =
            make_uint4(0, 0, 0, 0);
      }
    }
    load_entries(0);
    dedupe(0);
    if (blocks > 1) load_entries(1);
    gather(0, 0, 0);
    CpAsyncCommit();

    int64_t b = 0;
    int j = 0, stage = 0;
    for (;;) {
      CpAsyncWait<0>();
      __syncthreads();  // (A) tile (b, j) landed; the previous tile's P·V is done with the other
                        // stage, P and the statistics
      const int ub = static_cast<int>(b & 1);
      // The next tile: in this block, gathered before the next block's union is built (which
      // then overlaps the gather); the next block's first, gathered after it.
      const bool same_block = j + 1 < info_s[ub * Tile::kInfoInts];
      const int64_t nb = same_block ? b : b + 1;
      const int nj = same_block ? j + 1 : 0;
      const bool more = nb < blocks;
      if (same_block) gather(stage ^ 1, ub, nj);
      if (j == 0 && b + 1 < blocks) {
        dedupe(ub ^ 1);
        if (b + 2 < blocks) load_entries(b + 2);
      }
      if (!same_block && more) gather(stage ^ 1, ub ^ 1, 0);
      CpAsyncCommit();
      compute(stage, ub, j);
      if (!more) break;
      b = nb;
      j = nj;
      stage ^= 1;
    }
    CpAsyncWait<0>();  // nothing may be left in flight (the last commit is empty)
  }
  __syncthreads();  // the last tile's statistics visible

  // O / l (bf16 out, or the f32 partial of this split); padded rows are never written.
#pragma unroll
  for (int m = 0; m < Tile::kMTiles; ++m) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = m * 16 + g + 8 * i;
      const int64_t t = t0 + r / kHs;
      const int h = r % kHs;
      if (t >= a.tokens || h >= a.heads) continue;
      StoreMmaORow(a, o[m], i, t, h, split, l_s[r], warp, cq);
    }
  }
  if (tid < Tile::kBlockM) {
    const int64_t t = t0 + tid / kHs;
    const int h = tid % kHs;
    if (t < a.tokens && h < a.heads) StoreRowLse(a, split, t, h, m_s[tid], l_s[tid]);
  }
}

// One instance's launch (main kernel only) and its shape on the current device.
template <int kHs, int kDqk, bool kExactP = true>
::attnd::gpu::Error LaunchLowhInstance(const KernelArgs& a, ::attnd::gpu::Stream stream) {
  using Tile = LowhTile<kHs, kDqk>;
  const void* fn = reinterpret_cast<const void*>(&SparseMlaLowhKernel<kHs, kDqk, kExactP>);
  const ::attnd::gpu::Error e = ::attnd::gpu::AllowDynamicSmem(fn, Tile::kSmemBytes);
  if (e != ::attnd::gpu::kSuccess) return e;
  const int64_t ctas = CeilDiv(static_cast<int64_t>(a.tokens), Tile::kTokens);
  const dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(a.splits));
  SparseMlaLowhKernel<kHs, kDqk, kExactP><<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(a);
  return ::attnd::gpu::GetLastError();
}

template <int kHs, int kDqk>
KernelShape LowhInstanceShape() {
  using Tile = LowhTile<kHs, kDqk>;
  KernelShape s;
  s.block_m = kHs;
  s.smem_bytes = Tile::kSmemBytes;
  s.ctas_per_sm = ::attnd::gpu::BlocksPerSm(
      reinterpret_cast<const void*>(&SparseMlaLowhKernel<kHs, kDqk, true>), Tile::kThreads,
      Tile::kSmemBytes);
  return s;
}

// Both precisions (HIGH: kExactP true; FAST: false).
#define ATTND_SPARSE_MLA_LOWH_INSTANCE(EXTERN, HS, D)                                         \
  EXTERN template ::attnd::gpu::Error LaunchLowhInstance<HS, D, true>(const KernelArgs&,      \
                                                                      ::attnd::gpu::Stream);  \
  EXTERN template ::attnd::gpu::Error LaunchLowhInstance<HS, D, false>(const KernelArgs&,     \
                                                                       ::attnd::gpu::Stream); \
  EXTERN template KernelShape LowhInstanceShape<HS, D>();

}  // namespace attnd::kernels::sparse_mla::gpu
