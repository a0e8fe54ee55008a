// The Hopper prefill indexer kernel (CUDA sm_90a: TMA, fp8 wgmma, mbarriers, setmaxnreg;
// docs/KERNELS.md "Prefill indexer on Hopper (cuda_wgmma)"). H in {32, 64}, D = 128.
//
// CTA = 2·256/H queries (8 at H64, 16 at H32) × one key chunk (common.cuh DecodeBlock, longest
// causal rows first), three warpgroups:
//   WG2 (producer)  thread 0 of warp 0: TMA of the CTA's q (two boxes of 256 (query, head) rows ×
//                   128 bytes, one per consumer) and a stream of 64-key tiles of k (64 rows × 128
//                   bytes) through kStages stages with full (transaction count) / empty (one
//                   arrival per consumer warp) mbarriers. Warps 1-3: the −inf fill (clean_logits)
//                   of every tile of the chunk that no row of the CTA sees, overlapped with the
//                   MMA work.
//   WG0, WG1        S = K·Qᵀ for the tile (m64n256k32 e4m3, four k-steps over D = 128, both
//   (consumers)     operands K-major in shared memory): the 64 keys are the MMA's M, the
//                   warpgroup's 256 (query, head) columns its N (4 queries at H64, 8 at H32: the
//                   H32 block needs no padding). A thread holds, for its keys 16·warp + lane/4
//                   (+8), 64 columns: Σ_h w·relu(s) is an in-register FFMA loop per query, then a
//                   quad transpose-sum over the four lanes of the row; × k_scale; stored with
//                   the window test (value inside, −inf outside when clean). The two consumers
//                   share each k tile and issue as soon as it is in, with no turns (measured
//                   faster than alternating turns, docs/KERNELS.md "Prefill indexer on Hopper").
//                   H32's logits form runs one tile ahead (the next tile's MMA is issued once
//                   this tile's sums are in registers, its stores run under it) and stores a
//                   tile inside every row's window without tests; H64 keeps the plain loop.
// Only tiles that some row of the CTA sees are loaded (TileRanges: the same list for every role);
// the windows are clipped to the chunk first, so a tile belongs to exactly one of "computed"
// (consumers write all its columns of the CTA's rows) or "filled" (WG2 warps 1-3, clean only).
// Output offsets are 64-bit; TMA coordinates 32-bit (WgmmaSupports bounds M and N).
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/indexer_logits/gpu/wgmma.cuh is CUDA-only"
#endif

#include <cuda.h>
#include <stdint.h>

#include "kernels/common/gpu/tiles.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/gpu/wgmma_fp8.cuh"
#include "kernels/common/math.h"
#include "kernels/indexer_logits/gpu/common.cuh"
#include "kernels/indexer_logits/gpu/problem.h"
#include "kernels/topk/gpu/candidates.h"

namespace attnd::kernels::indexer_logits::gpu {

// Where the top-k candidate form (kFused) puts each row's candidates (docs/KERNELS.md "Indexer
// → top-k candidates"): row r's (key, column) pairs at entries + r·ld (keys radix.h's
// order-preserving map), their number in counts[r], and the row's final floor key in floors[r]
// (every top-k entry of the row is a candidate at or above it).
struct WgmmaCandidateOut {
  uint2* entries = nullptr;
  int64_t ld = 0;  // pairs per row: at least the longest window, so nothing is ever dropped
  uint32_t* counts = nullptr;
  uint32_t* floors = nullptr;
  uint32_t k = 0;
  uint32_t floor_every = 0;  // tiles between two floor raises (>= 1)
};

// The kernel's argument block: the two tensor maps (u8, 128-byte swizzle) and the problem.
struct WgmmaIndexerArgs {
  CUtensorMap q_map;  // q as {128 bytes, H, M}: boxes of 128 × H × (256 / H)
  CUtensorMap k_map;  // k as {128 bytes, N}: boxes of 128 × 64
  IndexerProblem p;
  WgmmaCandidateOut cand;  // the candidate form only
};

template <int kHeads>
struct WgmmaIndexerTile {
  static_assert(kHeads == 32 || kHeads == 64, "the wgmma indexer needs H in {32, 64}");
  static constexpr int kThreads = 384;  // WG0, WG1 consumers; WG2 producer and filler
  static constexpr int kDim = 128;      // head dim: one 128-byte swizzled row per (query, head)
  static constexpr int kColumns = 256;  // (query, head) columns of a consumer: the wgmma N
  static constexpr int kWgQueries = kColumns / kHeads;  // 4 (H64) or 8 (H32)
  static constexpr int kQueries = 2 * kWgQueries;       // per CTA
  static constexpr int kOut = kWgQueries / 4;  // queries per row a lane stores (quad transpose)
  static constexpr int kBlockN = 64;           // keys per tile: the wgmma M
  static constexpr int kStages = 8;
  static constexpr int kSteps = kDim / 32;                // k32 steps
  static constexpr uint32_t kQWgBytes = kColumns * kDim;  // 32 KiB
  static constexpr uint32_t kTileBytes = kBlockN * kDim;  // 8 KiB
  // Shared memory (bytes; q boxes and tiles 1024-byte aligned): q of WG0, WG1 | k stages |
  // mbarriers q_full, full[kStages], empty[kStages] | row windows lo[kQueries], hi[kQueries].
  static constexpr uint32_t kQOffset = 0;
  static constexpr uint32_t kKOffset = 2 * kQWgBytes;
  static constexpr uint32_t kBarOffset = kKOffset + kStages * kTileBytes;
  static constexpr uint32_t kLoOffset = kBarOffset + (1 + 2 * kStages) * 8;
  static constexpr uint32_t kHiOffset = kLoOffset + kQueries * 4;
  // The needed tiles as sorted disjoint ranges [range_lo, range_hi) of tile indices, and their
  // count (at most one range per row).
  static constexpr uint32_t kRangeLoOffset = kHiOffset + kQueries * 4;
  static constexpr uint32_t kRangeHiOffset = kRangeLoOffset + kQueries * 4;
  static constexpr uint32_t kRangeCountOffset = kRangeHiOffset + kQueries * 4;
  static constexpr int kSmemBytes = static_cast<int>(kRangeCountOffset + 4);
  // The candidate form adds, per query of the CTA: a histogram of its candidates' level-0 key
  // digits (kCandBins u32), its candidate count and its running floor key.
  static constexpr int kCandBins = ::attnd::kernels::topk::gpu::kCandidateBins;
  static constexpr uint32_t kHistOffset = (kRangeCountOffset + 4 + 15) / 16 * 16;
  static constexpr uint32_t kCountOffset = kHistOffset + kQueries * kCandBins * 4;
  static constexpr uint32_t kFloorOffset = kCountOffset + kQueries * 4;
  static constexpr int kSmemBytesFused = static_cast<int>(kFloorOffset + kQueries * 4);
  // The candidate form with helper warps (kHelpers): each tile's values, [kQueries][kValueLd]
  // f32 (padded: the 4 queries × 8 keys a consumer warp stores fall in 32 banks), pass through
  // kValueStages stages to WG2's warps 1-3, which append the candidates and keep the
  // histograms and floors, one warp per query; vfull[s] (all 256 consumer threads arrive) and
  // vempty[s] (all 96 helper threads arrive) after the values.
  static constexpr int kValueStages = 4;
  static constexpr int kValueLd = kBlockN + 8;
  static constexpr int kHelperWarps = 3;
  static constexpr uint32_t kHelperThreads = 32 * kHelperWarps;
  static constexpr uint32_t kValueOffset =
      (static_cast<uint32_t>(kSmemBytesFused) + 127) / 128 * 128;
  static constexpr uint32_t kValueBytes = kQueries * kValueLd * 4;
  static constexpr uint32_t kVBarOffset = kValueOffset + kValueStages * kValueBytes;
  static constexpr int kSmemBytesHelpers = static_cast<int>(kVBarOffset + 2 * kValueStages * 8);
  // H 32's consumers keep a tile's sums across the next tile's MMA issue (the one-ahead loop
  // of the logits form): 240 registers, the producer and filler down to 24.
  static constexpr int kProducerRegs = kHeads == 32 ? 24 : 56;
  static constexpr int kConsumerRegs = kHeads == 32 ? 240 : 224;
  static constexpr uint32_t kEmptyCount = 8;  // one arrival per consumer warp
  // setmaxnreg moves registers within the launch allocation only (tiles.h kSm90Regs384).
  static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * kSm90Regs384, "register budget");
  static constexpr int kHelperRegs = 56;  // WG2 with the helper warps: the whole budget
  static constexpr int kHelperConsumerRegs = 224;
  static_assert(kHelperRegs + 2 * kHelperConsumerRegs <= 3 * kSm90Regs384, "register budget");
  static_assert(kHeads % 8 == 0 && kWgQueries % 4 == 0, "whole queries per 8-column group");
};

// Named barriers of the consumers: the candidate form's end of a warpgroup's tiles
// (kIndexerBarDone0 + wg, 128 threads).
inline constexpr uint32_t kIndexerBarDone0 = 3;
// Keys (radix.h's map) at or above this are selectable: -FLT_MAX and up.
inline constexpr uint32_t kCandMinKey = 0x00800000u;
inline constexpr int64_t kWgmmaBlockN = 64;

// The tiles the CTA computes: tile t (keys [64t, 64t + 64)) is needed when some row's window
// (clipped to the chunk) meets it, i.e. t in [lo / 64, ceil(hi / 64)) for a non-empty window.
// One thread merges those per-row tile ranges into sorted disjoint ranges in shared memory; every
// role then walks them with a TileCursor, reading shared memory only when it crosses a range end.
struct TileRanges {
  const int32_t* lo;  // [count], sorted by lo, disjoint and non-adjacent
  const int32_t* hi;
  int count;
};

// Builds the ranges of the rows' windows lo[r], hi[r] (r < rows; empty ones lo == hi). One thread.
__device__ __forceinline__ void BuildTileRanges(const int32_t* lo, const int32_t* hi, int rows,
                                                int32_t* range_lo, int32_t* range_hi,
                                                int32_t* range_count) {
  int n = 0;
  for (int r = 0; r < rows; ++r) {  // insertion by first tile
    if (lo[r] >= hi[r]) continue;
    const int32_t a = lo[r] / static_cast<int32_t>(kWgmmaBlockN);
    const int32_t b = (hi[r] - 1) / static_cast<int32_t>(kWgmmaBlockN) + 1;
    int k = n++;
    for (; k > 0 && range_lo[k - 1] > a; --k) {
      range_lo[k] = range_lo[k - 1];
      range_hi[k] = range_hi[k - 1];
    }
    range_lo[k] = a;
    range_hi[k] = b;
  }
  int m = 0;
  for (int k = 0; k < n; ++k) {  // merge overlapping and adjacent ranges
    if (m > 0 && range_lo[k] <= range_hi[m - 1]) {
      range_hi[m - 1] = range_hi[k] > range_hi[m - 1] ? range_hi[k] : range_hi[m - 1];
    } else {
      range_lo[m] = range_lo[k];
      range_hi[m] = range_hi[k];
      ++m;
    }
  }
  *range_count = m;
}

// Walks the needed tiles in order: tile() is the current one, done() past the last.
class TileCursor {
 public:
  __device__ __forceinline__ explicit TileCursor(const TileRanges& r)
      : r_(r), range_(0), tile_(r.count > 0 ? r.lo[0] : 0), end_(r.count > 0 ? r.hi[0] : 0) {}
  __device__ __forceinline__ bool done() const { return range_ >= r_.count; }
  __device__ __forceinline__ int32_t tile() const { return tile_; }
  __device__ __forceinline__ void Advance() {
    if (++tile_ < end_) return;
    if (++range_ < r_.count) {
      tile_ = r_.lo[range_];
      end_ = r_.hi[range_];
    }
  }

 private:
  TileRanges r_;
  int range_;
  int32_t tile_, end_;
};

// The candidate form's floor of one query (docs/KERNELS.md "Indexer → top-k candidates"): the
// lower edge of the highest level-0 bin b such that the candidates in bins >= b number at least
// k, read from its histogram `hist` (kBins bins) by one warp; 0 when the candidates number fewer
// than k (topk/gpu/candidates.h CandidateFloorKey, serially). Other warps may add to the histogram
// meanwhile: every count read is at most the true one, so the floor is never above the one the
// complete histogram gives (never too high).
template <int kBins>
__device__ __forceinline__ uint32_t CandidateFloor(const uint32_t* hist, uint32_t k, int lane) {
  static_assert(kBins % 64 == 0, "whole, even bin counts per lane");
  constexpr int kPer = kBins / 32;
  const volatile uint32_t* h = hist;
  const int top = kBins - kPer * lane;  // this lane's bins [top - kPer, top); lane 0 the highest
  // Pass 1: each lane sums its own bins, visited in an order rotated by the lane so that the 32
  // lanes' reads of one step fall in 32 different banks (docs/KERNELS.md "Indexer → top-k
  // candidates": the floor refresh is on the consumers' path).
  uint32_t sum = 0;
#pragma unroll 8
  for (int j = 0; j < kPer; ++j) sum += h[top - 1 - ((j + lane) & (kPer - 1))];
  uint32_t incl = sum;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += y;
  }
  // The lane whose bins hold the k-th candidate from the top, if any.
  const uint32_t cross = __ballot_sync(0xffffffffu, incl - sum < k && k <= incl);
  if (cross == 0u) return 0u;
  const int owner = __ffs(cross) - 1;
  uint32_t acc = __shfl_sync(0xffffffffu, incl - sum, owner);  // candidates in higher lanes' bins
  // Pass 2: the whole warp reads the owner's bins from the top, 32 adjacent ones per step. A
  // count read now is at least the one pass 1 read, so the crossing lies in these bins; every
  // count read is still at most the true one.
  const int owner_top = kBins - kPer * owner;
  for (int c = 0; c < kPer / 32; ++c) {
    const int b = owner_top - 1 - 32 * c - lane;
    const uint32_t n = h[b];
    uint32_t run = n;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, run, d);
      if (lane >= d) run += y;
    }
    const uint32_t hit = __ballot_sync(0xffffffffu, acc + run >= k);
    if (hit != 0u) {
      const int at = owner_top - 1 - 32 * c - (__ffs(hit) - 1);
      return static_cast<uint32_t>(at) << ::attnd::kernels::topk::gpu::kCandidateShift;
    }
    acc += __shfl_sync(0xffffffffu, run, 31);
  }
  // Unreachable (the counts only grow); the safe answer.
  return 0u;
}

// The candidate form's append (docs/KERNELS.md "Indexer → top-k candidates"): this lane's
// values val[rr][u] (key key0 + 8·rr of CTA query q0 + 4u + t4) that lie in the query's window
// and are at or above its floor go to the row's candidates, at positions from one shared
// atomic per (warp, query) (the eight lanes of a query scan their counts), and into the query's
// histogram. Called by the whole warp.
template <class T>
__device__ __forceinline__ void AppendCandidates(uint8_t* smem, const WgmmaCandidateOut& cand,
                                                 const float (&val)[2][T::kOut], int64_t key0,
                                                 int64_t c1, const int32_t (&lo)[T::kOut],
                                                 const int32_t (&hi)[T::kOut],
                                                 const bool (&ok)[T::kOut], int64_t row0, int q0,
                                                 int lane, int t4) {
  uint32_t* hist = reinterpret_cast<uint32_t*>(smem + T::kHistOffset);
  uint32_t* count = reinterpret_cast<uint32_t*>(smem + T::kCountOffset);
  const volatile uint32_t* floors =
      reinterpret_cast<const volatile uint32_t*>(smem + T::kFloorOffset);
#pragma unroll
  for (int u = 0; u < T::kOut; ++u) {
    const int query = q0 + 4 * u + t4;
    const uint32_t floor = ok[u] ? floors[query] : 0xffffffffu;
    uint32_t key[2];
    bool take[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int64_t col = key0 + 8 * rr;
      const uint32_t bits = __float_as_uint(val[rr][u]);
      // radix.h KeyOfBits: order-preserving, NaN to 0 (never at or above a floor).
      uint32_t k = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
      k = k > 0xff800000u ? 0u : k;
      key[rr] = k;
      take[rr] = ok[u] && col < c1 && col >= lo[u] && col < hi[u] && k >= floor;
    }
    const uint32_t mine = static_cast<uint32_t>(take[0]) + static_cast<uint32_t>(take[1]);
    // Inclusive sum over the lanes of this query (lanes t4, t4 + 4, ..., t4 + 28).
    uint32_t incl = mine;
#pragma unroll
    for (int d = 4; d < 32; d *= 2) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += y;
    }
    const int leader = 28 + t4;
    const uint32_t total = __shfl_sync(0xffffffffu, incl, leader);
    uint32_t base = 0;
    if (lane == leader && total > 0) base = atomicAdd(count + query, total);
    base = __shfl_sync(0xffffffffu, base, leader);
    uint32_t pos = base + incl - mine;
    uint2* row = cand.entries + (row0 + query) * cand.ld;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      if (!take[rr]) continue;
      if (static_cast<int64_t>(pos) < cand.ld) {
        row[pos] = make_uint2(key[rr], static_cast<uint32_t>(key0 + 8 * rr));
      }
      ++pos;
      atomicAdd(
          hist + query * T::kCandBins + (key[rr] >> ::attnd::kernels::topk::gpu::kCandidateShift),
          1u);
    }
  }
}

// Raises the floors of this warp's queries (q0 + warp, + 4, ...) from their histograms. Only
// this warp writes them; readers see the old or the new floor, both safe (CandidateFloor).
template <class T>
__device__ __forceinline__ void RefreshFloors(uint8_t* smem, uint32_t k, int q0, int warp,
                                              int lane) {
  const uint32_t* hist = reinterpret_cast<const uint32_t*>(smem + T::kHistOffset);
  volatile uint32_t* floors = reinterpret_cast<volatile uint32_t*>(smem + T::kFloorOffset);
  for (int query = q0 + warp; query < q0 + T::kWgQueries; query += 4) {
    const uint32_t f = CandidateFloor<T::kCandBins>(hist + query * T::kCandBins, k, lane);
    if (lane == 0 && f > floors[query]) floors[query] = f;
  }
}

// The filler (WG2 warps 1-3): −inf on the CTA's rows over every tile of the chunk that no row
// sees (the consumers never touch those).
__device__ __forceinline__ void FillUnseenTiles(const IndexerProblem& p, const TileRanges& ranges,
                                                int32_t t_chunk0, int32_t t_chunk1, int64_t c1,
                                                int count, int64_t row0, int ptid) {
  const int lane = ptid % 32;
  for (int gap = 0; gap <= ranges.count; ++gap) {  // before each range, and after the last
    const int32_t g0 = gap == 0 ? t_chunk0 : ranges.hi[gap - 1];
    const int32_t g1 = gap < ranges.count ? ranges.lo[gap] : t_chunk1;
    for (int32_t t = g0 + (ptid / 32 - 1); t < g1; t += 3) {
      const int64_t k0 = int64_t{t} * kWgmmaBlockN;
      const int64_t k1 = k0 + kWgmmaBlockN < c1 ? k0 + kWgmmaBlockN : c1;
      for (int r = 0; r < count; ++r) {
        float* row = p.logits + (row0 + r) * p.ld;
        for (int64_t c = k0 + lane; c < k1; c += 32) row[c] = kNegInf;
      }
    }
  }
}

// The candidate form's helper warps (kHelpers; docs/KERNELS.md "Indexer → top-k candidates"):
// helper warp hw (0-2) owns the CTA's queries hw, hw + 3, hw + 6. Per tile, in the consumers'
// order, it reads the tile's values of its queries from the value stage (lane: keys lane and
// lane + 32), appends those in the query's window at or above the query's floor to the row's
// candidates, and releases the stage: the warp is the only writer of its queries' counts,
// histograms and floors, so positions come from two ballots (no atomics, contiguous stores),
// the histogram takes one add per distinct bin, and its floor reads are exact. Every
// `floor_every` tiles it raises its queries' floors; after the last tile it writes their
// counts and final floors.
template <class T>
__device__ __forceinline__ void CandidateHelpers(uint8_t* smem, uint32_t base,
                                                 const WgmmaCandidateOut& cand,
                                                 const TileRanges& ranges, const int32_t* lo,
                                                 const int32_t* hi, int count_rows, int64_t c1,
                                                 int64_t row0, int hw, int lane) {
  using namespace ::attnd::gpu::wgmma;
  constexpr int kMine = (T::kQueries + T::kHelperWarps - 1) / T::kHelperWarps;
  constexpr int kShift = ::attnd::kernels::topk::gpu::kCandidateShift;
  const uint32_t vfull = base + T::kVBarOffset, vempty = vfull + 8 * T::kValueStages;
  uint32_t* hist = reinterpret_cast<uint32_t*>(smem + T::kHistOffset);
  // Per owned query: its floor and candidate count (registers); its window is read from shared
  // memory when used (the warpgroup's register budget is 64).
  const int owned = count_rows < T::kQueries ? count_rows : T::kQueries;
  uint32_t floor[kMine], count[kMine];
#pragma unroll
  for (int j = 0; j < kMine; ++j) {
    floor[j] = kCandMinKey;
    count[j] = 0u;
  }
  const uint32_t below = (1u << lane) - 1u;
  uint32_t since_floor = 0;
  TileCursor cursor(ranges);
  for (uint32_t i = 0; !cursor.done(); ++i) {
    const int32_t t = cursor.tile();
    cursor.Advance();
    const uint32_t vs = i % T::kValueStages;
    MbarWait(vfull + 8 * vs, (i / T::kValueStages) & 1);
    const float* vb = reinterpret_cast<const float*>(smem + T::kValueOffset + vs * T::kValueBytes);
    const int64_t key0 = int64_t{t} * kWgmmaBlockN;
#pragma unroll
    for (int j = 0; j < kMine; ++j) {
      const int query = hw + T::kHelperWarps * j;
      if (query >= owned) continue;  // warp-uniform
      const int32_t qlo = lo[query], qhi = hi[query];
      uint32_t key[2], mask[2];
      bool take[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int64_t col = key0 + lane + 32 * rr;
        const uint32_t bits = __float_as_uint(vb[query * T::kValueLd + lane + 32 * rr]);
        // radix.h KeyOfBits: order-preserving, NaN to 0 (never at or above a floor).
        uint32_t k = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
        k = k > 0xff800000u ? 0u : k;
        key[rr] = k;
        take[rr] = col < c1 && col >= qlo && col < qhi && k >= floor[j];
        mask[rr] = __ballot_sync(0xffffffffu, take[rr]);
      }
      uint2* row = cand.entries + (row0 + query) * cand.ld;
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const uint32_t pos = count[j] + (rr == 0 ? 0u : static_cast<uint32_t>(__popc(mask[0]))) +
                             static_cast<uint32_t>(__popc(mask[rr] & below));
        if (take[rr]) {
          if (static_cast<int64_t>(pos) < cand.ld) {
            row[pos] = make_uint2(key[rr], static_cast<uint32_t>(key0 + lane + 32 * rr));
          }
          // One add per distinct bin among the lanes that take a value.
          const uint32_t bin = key[rr] >> kShift;
          const uint32_t same = __match_any_sync(mask[rr], bin);
          if (lane == __ffs(same) - 1) {
            atomicAdd(hist + query * T::kCandBins + bin, static_cast<uint32_t>(__popc(same)));
          }
        }
      }
      count[j] += static_cast<uint32_t>(__popc(mask[0]) + __popc(mask[1]));
    }
    MbarArrive(vempty + 8 * vs);  // the stage is read: the consumers may refill it
    if (++since_floor == cand.floor_every) {
      since_floor = 0;
      __syncwarp();  // this warp's histogram adds are visible to its lanes
#pragma unroll
      for (int j = 0; j < kMine; ++j) {
        const int query = hw + T::kHelperWarps * j;
        if (query >= owned) continue;
        const uint32_t f = CandidateFloor<T::kCandBins>(hist + query * T::kCandBins, cand.k, lane);
        floor[j] = f > floor[j] ? f : floor[j];
      }
    }
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < kMine; ++j) {
    const int query = hw + T::kHelperWarps * j;
    if (query >= owned) continue;
    const uint32_t f = CandidateFloor<T::kCandBins>(hist + query * T::kCandBins, cand.k, lane);
    if (lane == 0) {
      cand.counts[row0 + query] = count[j];
      cand.floors[row0 + query] = f > kCandMinKey ? f : kCandMinKey;
    }
  }
}

// The k_scale of this thread's two keys of a tile, key0 and key0 + 8 (0 past the chunk end c1).
__device__ __forceinline__ void LoadKeyScales(const IndexerProblem& p, int64_t key0, int64_t c1,
                                              float (&scale)[2]) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t key = key0 + 8 * rr;
    scale[rr] = key < c1 ? __ldg(p.k_scale + key) : 0.0f;
  }
}

// kFused: the candidate form (H 64, one key chunk per row; args.cand), else the logits only;
// kHelpers (with kFused): its appends, histograms and floors on WG2's warps 1-3
// (CandidateHelpers) instead of the consumers.
template <int kHeads, bool kFused, bool kHelpers = false>
__global__ void __launch_bounds__(384, 1)
    IndexerWgmmaKernel(const __grid_constant__ WgmmaIndexerArgs args) {
#if ATTND_SM90A
  using T = WgmmaIndexerTile<kHeads>;
  using namespace ::attnd::gpu::wgmma;
  const IndexerProblem& p = args.p;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = SmemAddr(smem);
  if ((base & (kSwizzleAtomBytes - 1)) != 0) __trap();  // swizzle atoms need 1024-B alignment

  const int tid = threadIdx.x;
  const BlockWork w = DecodeBlock</*kLongestFirst=*/true>(p);
  const uint32_t q_full = base + T::kBarOffset;
  const uint32_t full = q_full + 8, empty = full + 8 * T::kStages;  // + 8·stage
  int32_t* lo = reinterpret_cast<int32_t*>(smem + T::kLoOffset);
  int32_t* hi = reinterpret_cast<int32_t*>(smem + T::kHiOffset);
  if (tid < T::kQueries) {  // row windows, clipped to the chunk [c0, c1) (c1 <= N < 2^31)
    int64_t l = 0, h = 0;
    if (tid < w.count) {
      RowWindow</*kPaged=*/false>(p, w.group, w.first + tid, &l, &h);
      l = l > w.c0 ? l : w.c0;
      h = h < w.c1 ? h : w.c1;
    }
    if (h <= l) l = h = 0;
    lo[tid] = static_cast<int32_t>(l);
    hi[tid] = static_cast<int32_t>(h);
  }
  if constexpr (kFused) {
    static_assert(kHeads == 64, "the candidate form's histograms fit shared memory at H 64 only");
    uint32_t* hist = reinterpret_cast<uint32_t*>(smem + T::kHistOffset);
    for (int i = tid; i < T::kQueries * T::kCandBins; i += T::kThreads) hist[i] = 0u;
    if (tid < T::kQueries) {
      reinterpret_cast<uint32_t*>(smem + T::kCountOffset)[tid] = 0u;
      reinterpret_cast<uint32_t*>(smem + T::kFloorOffset)[tid] = kCandMinKey;
    }
  }
  int32_t* range_lo = reinterpret_cast<int32_t*>(smem + T::kRangeLoOffset);
  int32_t* range_hi = reinterpret_cast<int32_t*>(smem + T::kRangeHiOffset);
  int32_t* range_count = reinterpret_cast<int32_t*>(smem + T::kRangeCountOffset);
  if (tid == 0) {
    MbarInit(q_full, 1);
    for (int s = 0; s < T::kStages; ++s) {
      MbarInit(full + 8 * s, 1);
      MbarInit(empty + 8 * s, T::kEmptyCount);
    }
    if constexpr (kHelpers) {
      for (int s = 0; s < T::kValueStages; ++s) {
        MbarInit(base + T::kVBarOffset + 8 * s, 256);
        MbarInit(base + T::kVBarOffset + 8 * (T::kValueStages + s), T::kHelperThreads);
      }
    }
    FenceMbarInit();
  }
  __syncthreads();  // windows written
  if (tid == 0) BuildTileRanges(lo, hi, T::kQueries, range_lo, range_hi, range_count);
  __syncthreads();  // ranges written
  const TileRanges ranges{range_lo, range_hi, *range_count};
  // The chunk's tiles [t_chunk0, t_chunk1) (c1 <= N < 2^31 - 64: 32-bit tile indices).
  const int32_t t_chunk0 = static_cast<int32_t>(w.c0 / kWgmmaBlockN);
  const int32_t t_chunk1 = static_cast<int32_t>((w.c1 + kWgmmaBlockN - 1) / kWgmmaBlockN);
  const int64_t row0 = w.group * p.rows_per_group + w.first;  // the CTA's first output row

  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform role
  if (wg == 2) {
    SetMaxRegsDec<kHelpers ? T::kHelperRegs : T::kProducerRegs>();
    const int ptid = tid - 256;
    if (ptid == 0) {
      // ---- Producer: q once (before the first tile), then the needed tiles in order.
      PrefetchTensorMap(&args.q_map);
      PrefetchTensorMap(&args.k_map);
      uint32_t i = 0;
      for (TileCursor c(ranges); !c.done(); c.Advance(), ++i) {
        if (i == 0) {
          MbarArriveExpectTx(q_full, 2 * T::kQWgBytes);
#pragma unroll
          for (int half = 0; half < 2; ++half) {  // rows past M are zero-filled by the TMA
            TmaLoad3d(base + T::kQOffset + half * T::kQWgBytes, &args.q_map, q_full, 0, 0,
                      static_cast<int32_t>(w.first + half * T::kWgQueries));
          }
        }
        const uint32_t s = i % T::kStages;
        // Stage s last held tile i - kStages: completion (i / kStages) - 1 of its empty barrier.
        if (i >= T::kStages) MbarWait(empty + 8 * s, ((i / T::kStages) - 1) & 1);
        MbarArriveExpectTx(full + 8 * s, T::kTileBytes);
        TmaLoad2d(base + T::kKOffset + s * T::kTileBytes, &args.k_map, full + 8 * s, 0,
                  c.tile() * static_cast<int32_t>(kWgmmaBlockN));  // keys past N: zeros
      }
    } else if constexpr (kHelpers) {
      if (ptid >= 32) {
        // ---- Warps 1-3: the filler when the logits are asked for, then the candidates.
        if (p.clean && p.logits != nullptr) {
          FillUnseenTiles(p, ranges, t_chunk0, t_chunk1, w.c1, w.count, row0, ptid);
        }
        CandidateHelpers<T>(smem, base, args.cand, ranges, lo, hi, w.count, w.c1, row0,
                            ptid / 32 - 1, ptid % 32);
      }
    } else if (ptid >= 32 && p.clean && (!kFused || p.logits != nullptr)) {
      // ---- Filler (warps 1-3).
      FillUnseenTiles(p, ranges, t_chunk0, t_chunk1, w.c1, w.count, row0, ptid);
    }
    return;
  }

  // ---- Consumers: warpgroup wg owns the CTA's queries [q0, q0 + kWgQueries); warp `warp`
  // the tile's keys 16·warp + lane/4 and + 8; lane quad position t4 the columns 8j + 2·t4 + e.
  SetMaxRegsInc<kHelpers ? T::kHelperConsumerRegs : T::kConsumerRegs>();
  const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int q0 = wg * T::kWgQueries;
  // The weights of this thread's 64 columns (0 for queries past the block: their q is zero).
  float wt[32][2];
#pragma unroll
  for (int j = 0; j < 32; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int column = 8 * j + 2 * t4 + e;
      const int query = q0 + column / kHeads, head = column % kHeads;
      wt[j][e] = query < w.count ? p.weights[(row0 + query) * p.weights_stride + head] : 0.0f;
    }
  }
  // The queries whose logits this lane stores (the quad transpose-sum leaves query 4u + t4 of
  // each group of four in lane t4), their windows within the chunk.
  int32_t out_lo[T::kOut], out_hi[T::kOut];
  bool out_ok[T::kOut];
  [[maybe_unused]] float* out_row[T::kOut];  // kOneAhead: this lane's output rows
#pragma unroll
  for (int u = 0; u < T::kOut; ++u) {
    const int query = q0 + 4 * u + t4;
    out_ok[u] = query < w.count;
    out_lo[u] = lo[query];
    out_hi[u] = hi[query];
    // Only where the logits are written (the candidates-only form has none to point into).
    if constexpr (!kFused && T::kOut > 1) out_row[u] = p.logits + (row0 + query) * p.ld;
  }
  // The logits form at H 32 (a lane stores two queries a key) runs the one-ahead loop below,
  // which stores a tile inside [in_lo, in_hi), the keys every row of the CTA sees (windows
  // already inside the chunk), without per-key window tests; empty when some row of the block
  // is missing or sees nothing. At H 64 both measured slower (docs/KERNELS.md "Prefill indexer
  // on Hopper"), so H 64 and the candidate form keep the loop after it.
  constexpr bool kOneAhead = !kFused && T::kOut > 1;
  int32_t in_lo = 0, in_hi = 0;
  if constexpr (kOneAhead) {
    if (w.count == T::kQueries) {
      in_lo = lo[0];
      in_hi = hi[0];
      for (int query = 1; query < T::kQueries; ++query) {
        in_lo = lo[query] > in_lo ? lo[query] : in_lo;
        in_hi = hi[query] < in_hi ? hi[query] : in_hi;
      }
    }
  }

  const uint64_t q_desc = SmemDescKMajor(base + T::kQOffset + wg * T::kQWgBytes);
  float acc[128];  // S: keys 16·warp + g (+8) × this thread's 64 columns (accumulator layout)
  if constexpr (kOneAhead) {
    // One tile ahead: once a tile's accumulators are summed into `part`, the next tile's MMA
    // is issued, and this tile's quad sums and stores run under it. (Its issue and sums repeat
    // the loop below on purpose: shared as lambdas, ptxas scheduled the H64 and candidate
    // instances differently, and those are the measured code.)
    auto issue = [&](uint32_t i) {  // the MMA of the i-th needed tile, once its stage is full
      const uint32_t s = i % T::kStages;
      MbarWait(full + 8 * s, (i / T::kStages) & 1);
      WgmmaFence();
      const uint64_t k_desc = SmemDescKMajor(base + T::kKOffset + s * T::kTileBytes);
#pragma unroll
      for (int kk = 0; kk < T::kSteps; ++kk) {  // k32 step kk: 32·kk bytes on, in the atom
        WgmmaFp8<256>::Run(acc, DescAdvance(k_desc, 32 * kk), DescAdvance(q_desc, 32 * kk), kk > 0);
      }
      WgmmaCommit();
    };
    TileCursor cursor(ranges);
    if (!cursor.done()) {
      MbarWait(q_full, 0);
      issue(0);
    }
    for (uint32_t i = 0; !cursor.done(); ++i) {
      const uint32_t s = i % T::kStages;
      const int32_t t = cursor.tile();
      cursor.Advance();
      const int64_t key0 = int64_t{t} * kWgmmaBlockN + 16 * warp + g;  // and key0 + 8
      float scale[2];
      LoadKeyScales(p, key0, w.c1, scale);
      WgmmaWait<0>();
      FenceAccumulators(acc);
      __syncwarp();
      if (lane == 0) MbarArrive(empty + 8 * s);  // this warp's share of the tile is read
      float part[2][T::kWgQueries];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
#pragma unroll
        for (int u = 0; u < T::kWgQueries; ++u) part[rr][u] = 0.0f;
      }
      AddWeightedRelu<kHeads, 32, T::kWgQueries>(acc, wt, part);
      if (!cursor.done()) issue(i + 1);                                  // acc is free again
      const int32_t tile_key0 = t * static_cast<int32_t>(kWgmmaBlockN);  // < 2^31 - 64
      if (tile_key0 >= in_lo && tile_key0 + static_cast<int32_t>(kWgmmaBlockN) <= in_hi) {
        // Inside every row's window (so below c1): stored as they are.
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
#pragma unroll
          for (int u = 0; u < T::kOut; ++u) {
            out_row[u][key0 + 8 * rr] = QuadTransposeSum(&part[rr][4 * u], t4) * scale[rr];
          }
        }
      } else {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int64_t key = key0 + 8 * rr;
#pragma unroll
          for (int u = 0; u < T::kOut; ++u) {
            const float v = QuadTransposeSum(&part[rr][4 * u], t4);
            if (!out_ok[u] || key >= w.c1) continue;
            float* out = out_row[u] + key;
            if (key >= out_lo[u] && key < out_hi[u]) {
              *out = v * scale[rr];
            } else if (p.clean) {
              *out = kNegInf;
            }
          }
        }
      }
    }
    return;
  }
  TileCursor cursor(ranges);
  // The candidate form without helpers: tiles since this warp's last floor raise.
  [[maybe_unused]] uint32_t since_floor = 0;
  for (uint32_t i = 0; !cursor.done(); ++i) {
    const uint32_t s = i % T::kStages;
    const int32_t t = cursor.tile();
    cursor.Advance();
    if (i == 0) MbarWait(q_full, 0);
    MbarWait(full + 8 * s, (i / T::kStages) & 1);
    WgmmaFence();
    const uint64_t k_desc = SmemDescKMajor(base + T::kKOffset + s * T::kTileBytes);
#pragma unroll
    for (int kk = 0; kk < T::kSteps; ++kk) {  // k32 step kk: 32·kk bytes on, in the swizzle atom
      WgmmaFp8<256>::Run(acc, DescAdvance(k_desc, 32 * kk), DescAdvance(q_desc, 32 * kk), kk > 0);
    }
    WgmmaCommit();

    const int64_t key0 = int64_t{t} * kWgmmaBlockN + 16 * warp + g;  // and key0 + 8
    float scale[2];
    LoadKeyScales(p, key0, w.c1, scale);
    WgmmaWait<0>();
    FenceAccumulators(acc);
    __syncwarp();
    if (lane == 0) MbarArrive(empty + 8 * s);  // this warp's share of the tile is read

    // Σ_h w·relu(s) per (key, query) over this thread's columns of the query ...
    float part[2][T::kWgQueries];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
#pragma unroll
      for (int u = 0; u < T::kWgQueries; ++u) part[rr][u] = 0.0f;
    }
    AddWeightedRelu<kHeads, 32, T::kWgQueries>(acc, wt, part);
    // ... then over the quad (all H heads), times the key's scale, stored.
    if constexpr (!kFused) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int64_t key = key0 + 8 * rr;
#pragma unroll
        for (int u = 0; u < T::kOut; ++u) {
          const float v = QuadTransposeSum(&part[rr][4 * u], t4);
          if (!out_ok[u] || key >= w.c1) continue;
          float* out = p.logits + (row0 + q0 + 4 * u + t4) * p.ld + key;
          if (key >= out_lo[u] && key < out_hi[u]) {
            *out = v * scale[rr];
          } else if (p.clean) {
            *out = kNegInf;
          }
        }
      }
    } else {
      // The same values; the logits only when asked for, then the candidates. (The logits
      // form's loop above is left as it was, so that its PTX stays what was measured.)
      float val[2][T::kOut];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int64_t key = key0 + 8 * rr;
#pragma unroll
        for (int u = 0; u < T::kOut; ++u) {
          const float v = QuadTransposeSum(&part[rr][4 * u], t4);
          val[rr][u] = v * scale[rr];
          if (p.logits == nullptr || !out_ok[u] || key >= w.c1) continue;
          float* out = p.logits + (row0 + q0 + 4 * u + t4) * p.ld + key;
          if (key >= out_lo[u] && key < out_hi[u]) {
            *out = val[rr][u];
          } else if (p.clean) {
            *out = kNegInf;
          }
        }
      }
      if constexpr (kHelpers) {
        // The values go to the helper warps through value stage i % kValueStages.
        const uint32_t vs = i % T::kValueStages;
        const uint32_t vbar = base + T::kVBarOffset + 8 * vs;
        if (i >= T::kValueStages) {  // its last tile, i - kValueStages, read by the helpers
          MbarWait(vbar + 8 * T::kValueStages, ((i / T::kValueStages) - 1) & 1);
        }
        float* vb = reinterpret_cast<float*>(smem + T::kValueOffset + vs * T::kValueBytes);
#pragma unroll
        for (int u = 0; u < T::kOut; ++u) {
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            vb[(q0 + 4 * u + t4) * T::kValueLd + 16 * warp + g + 8 * rr] = val[rr][u];
          }
        }
        MbarArrive(vbar);
      } else {
        AppendCandidates<T>(smem, args.cand, val, key0, w.c1, out_lo, out_hi, out_ok, row0, q0,
                            lane, t4);
        if (++since_floor == args.cand.floor_every) {
          since_floor = 0;
          RefreshFloors<T>(smem, args.cand.k, q0, warp, lane);
        }
      }
    }
  }
  if constexpr (kFused && !kHelpers) {
    // Every append and histogram count of this warpgroup's queries is in: the final floors.
    NamedBarSync(kIndexerBarDone0 + wg, 128);
    const uint32_t* hist = reinterpret_cast<const uint32_t*>(smem + T::kHistOffset);
    const uint32_t* count = reinterpret_cast<const uint32_t*>(smem + T::kCountOffset);
    for (int query = q0 + warp; query < q0 + T::kWgQueries; query += 4) {
      const uint32_t f =
          CandidateFloor<T::kCandBins>(hist + query * T::kCandBins, args.cand.k, lane);
      if (lane == 0 && query < w.count) {
        args.cand.counts[row0 + query] = count[query];
        args.cand.floors[row0 + query] = f > kCandMinKey ? f : kCandMinKey;
      }
    }
  }
#else
  __trap();  // sm_90a only: WgmmaSupports refuses other devices
#endif
}

}  // namespace attnd::kernels::indexer_logits::gpu
