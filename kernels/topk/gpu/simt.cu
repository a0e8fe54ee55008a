// The portable SIMT top-k (CUDA and HIP): one CTA per row. A radix select over order-preserving
// uint32 keys (radix.h: three digit levels of 11/11/10 bits, histograms in shared memory) finds
// the threshold; the keys of the level-0 threshold bin stay in shared memory when they fit, else
// the later levels re-scan the row with a prefix filter, so no row length overflows a buffer.
// One ordered pass then writes the chosen columns in ascending order, ties to the lowest columns
// and -1 / -inf padding: exactly the CPU implementation's output.
#include <stdint.h>

#include <algorithm>

#include "kernels/common/gpu/convert.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/topk/gpu/block_ops.cuh"
#include "kernels/topk/gpu/launch.h"
#include "kernels/topk/gpu/radix.h"
#include "kernels/topk/gpu/row_args.h"

namespace attnd::kernels::topk::gpu {
namespace {

using radix::Threshold;

// Keys of the level-0 threshold bin kept in shared memory for the later levels (32 KB); a larger
// bin is re-read from the row instead.
constexpr uint32_t kCandidateCapacity = 8192;
// Columns each thread loads before histogramming them (loads in flight).
constexpr int kHistogramUnroll = 8;
// Columns each thread handles per tile of the ordered pass (a tile is kThreads * kOrderedSteps
// consecutive columns; its counts are packed in 16-bit halves).
constexpr int kOrderedSteps = 4;
// Fewer rows than this get 1024-thread CTAs (parallelism inside the few rows); more rows get
// 512-thread CTAs (several rows per SM hide each other's barriers).
constexpr int64_t kFewRows = 256;
constexpr int64_t kMaxGridX = 0x7fffffff;
constexpr uint32_t kNanBits = 0xffffffffu;  // stands in for columns past the window: key 0

template <int kThreads>
struct Shared {
  static constexpr int kWarps = kThreads / ::attnd::gpu::WarpSize();
  static constexpr uint32_t kTile = kThreads * kOrderedSteps;  // columns of an ordered tile
  static_assert(kTile < (1u << 16), "tile counts are packed in 16 bits");
  // (step, warp) pairs of an ordered tile, in column order: entry step * kWarps + warp.
  static constexpr int kTileEntries = kOrderedSteps * kWarps;
  uint32_t hist[radix::kBins];
  uint32_t candidates[kCandidateCapacity];
  uint32_t candidate_count;
  uint32_t scan[kWarps];                // BlockExclusiveSum's scratch
  uint32_t tile_counts[kTileEntries];   // above | at << 16, per entry of the current tile
  uint32_t above_before[kTileEntries];  // keys above / at the threshold in lower columns
  uint32_t at_before[kTileEntries];
  uint32_t bin, bin_above, bin_count;  // ChooseBin's answer
};

// Row `row`'s window, clamped as topk::RowWindow does: [begin, begin + len) within [0, cols).
using RowSpan = RowSpanOf<uint32_t>;

__device__ RowSpan LoadWindow(const RowArgs& a, int64_t row) {
  return LoadWindowAs<RowSpan>(a, row);
}

// Where row `row`'s output goes (RowDest), and the row's k for padding.
struct RowOut : RowDest {
  uint32_t k;
  // Entries [from, k): -1 and -inf.
  template <int kThreads>
  __device__ void Pad(uint32_t from) const {
    for (uint32_t j = from + threadIdx.x; j < k; j += kThreads) PadOne(j);
  }
};

__device__ RowOut MakeRowOut(const RowArgs& a, int64_t row) {
  RowOut out;
  static_cast<RowDest&>(out) = RowDest::Of(a, row);
  out.k = a.k;
  return out;
}

template <int kThreads>
__device__ void ClearHistogram(Shared<kThreads>& s, bool reset_candidates) {
  for (int i = threadIdx.x; i < radix::kBins; i += kThreads) s.hist[i] = 0;
  if (reset_candidates && threadIdx.x == 0) s.candidate_count = 0;
}

// Appends the keys of the lanes with `take` to s.candidates (one shared atomic per warp); keys past
// the capacity are dropped (the caller only gathers a bin it knows fits). Every lane must call it.
template <int kThreads>
__device__ void AppendCandidates(Shared<kThreads>& s, uint32_t key, bool take) {
  const LaneMask takers = Ballot(take);
  if (takers == 0) return;  // the same in every lane
  const int leader = LowestLane(takers);
  uint32_t first = 0;
  if (LaneId() == leader) first = atomicAdd(&s.candidate_count, PopCount(takers));
  first = ::attnd::gpu::Shfl(first, leader);
  const uint32_t slot = first + PopCount(takers & LanesBelow(LaneId()));
  if (take && slot < kCandidateCapacity) s.candidates[slot] = key;
}

// Histograms digit kLevel of the window's keys that radix::InLevel admits under `t`; with
// kGather also keeps those keys in s.candidates. Lanes past the window carry kNanBits (key 0),
// which no level admits.
template <int kThreads, int kLevel, bool kGather>
__device__ void RowHistogram(const uint32_t* row, uint32_t len, const Threshold& t,
                             Shared<kThreads>& s) {
  constexpr uint32_t kStep = kThreads * kHistogramUnroll;
  for (uint32_t base = 0; base < len; base += kStep) {  // the same trip count in every thread
    uint32_t bits[kHistogramUnroll];  // all loads in flight before the first key is formed
#pragma unroll
    for (int u = 0; u < kHistogramUnroll; ++u) {
      const uint32_t i = base + u * kThreads + threadIdx.x;
      bits[u] = i < len ? row[i] : kNanBits;
    }
#pragma unroll
    for (int u = 0; u < kHistogramUnroll; ++u) {
      const uint32_t key = radix::KeyOfBits(bits[u]);
      const bool in = radix::InLevel(key, kLevel, t);
      HistogramAdd(s.hist, in ? static_cast<int>(radix::Digit(key, kLevel)) : -1);
      if constexpr (kGather) AppendCandidates(s, key, in);
    }
  }
}

// The same over the keys gathered in s.candidates.
template <int kThreads, int kLevel>
__device__ void CandidateHistogram(const Threshold& t, Shared<kThreads>& s) {
  const uint32_t n = min(s.candidate_count, kCandidateCapacity);
  for (uint32_t base = 0; base < n; base += kThreads) {
    const uint32_t i = base + threadIdx.x;
    const uint32_t key = i < n ? s.candidates[i] : 0u;
    const bool in = radix::InLevel(key, kLevel, t);
    HistogramAdd(s.hist, in ? static_cast<int>(radix::Digit(key, kLevel)) : -1);
  }
}

struct BinChoice {
  uint32_t bin = 0, above = 0, count = 0;  // the bin holding rank `need`, keys above it, its size
  uint32_t total = 0;                      // keys in the histogram
};

// Walks the finished histogram from the top bin down to the bin holding the need-th largest key.
// Thread t owns bins kBins-1-t*kPer down to kBins-(t+1)*kPer, so thread order is bin order from
// the top and an exclusive sum gives each thread the keys above its bins. Block-wide.
template <int kThreads>
__device__ BinChoice ChooseBin(uint32_t need, Shared<kThreads>& s) {
  constexpr int kPer = radix::kBins / kThreads;
  static_assert(radix::kBins % kThreads == 0, "whole bins per thread");
  const int top = radix::kBins - 1 - static_cast<int>(threadIdx.x) * kPer;
  uint32_t count[kPer];
  uint32_t sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    count[j] = s.hist[top - j];
    sum += count[j];
  }
  BinChoice c;
  uint32_t above = BlockExclusiveSum<kThreads>(sum, s.scan, &c.total);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (radix::HoldsRank(above, count[j], need)) {  // at most one bin of the block
      s.bin = static_cast<uint32_t>(top - j);
      s.bin_above = above;
      s.bin_count = count[j];
    }
    above += count[j];
  }
  __syncthreads();
  c.bin = s.bin;
  c.above = s.bin_above;
  c.count = s.bin_count;
  return c;
}

// The f32 bits of columns base + step * kThreads + thread of a window of len columns (kNanBits
// past it). base < 2^31 + kTile: no overflow in uint32.
template <int kThreads>
__device__ __forceinline__ void LoadTile(const uint32_t* row, uint32_t len, uint32_t base,
                                         uint32_t (&bits)[kOrderedSteps]) {
#pragma unroll
  for (int step = 0; step < kOrderedSteps; ++step) {
    const uint32_t i = base + step * kThreads + threadIdx.x;
    bits[step] = i < len ? row[i] : kNanBits;
  }
}

// Writes the window's chosen columns in column order: per tile of kTile columns, ballots
// count the keys above / at the threshold per (step, warp), warp 0 turns the counts into running
// prefixes, and each chosen lane finds its position from them (radix::OutputPosition).
template <int kThreads>
__device__ void OrderedPass(const uint32_t* row, const RowSpan& w, const Threshold& t,
                            const RowOut& out, Shared<kThreads>& s) {
  constexpr int kWarpSize = ::attnd::gpu::WarpSize();
  constexpr int kSteps = kOrderedSteps;
  constexpr uint32_t kTile = Shared<kThreads>::kTile;
  constexpr int kWarps = Shared<kThreads>::kWarps;
  constexpr int kEntries = Shared<kThreads>::kTileEntries;
  constexpr int kPerLane = CeilDiv(kEntries, kWarpSize);  // warp 0 scans the entries
  const int lane = LaneId();
  const int warp = WarpId();
  const LaneMask below = LanesBelow(lane);
  uint32_t run_above = 0, run_at = 0;  // warp 0: keys above / at the threshold before this tile
  // The 1024-thread variant (one CTA per SM, nothing else to hide latency) loads the next tile
  // while this one is ranked and written; the 512-thread one has no registers to spare for it.
  constexpr bool kPrefetch = kThreads >= 1024;
  uint32_t bits[kSteps];
  if constexpr (kPrefetch) LoadTile<kThreads>(row, w.len, 0, bits);
  for (uint32_t base = 0; base < w.len; base += kTile) {
    uint32_t next[kSteps];
    LoadTile<kThreads>(row, w.len, kPrefetch ? base + kTile : base, kPrefetch ? next : bits);
    LaneMask above[kSteps], at[kSteps];
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const uint32_t key = radix::KeyOfBits(bits[step]);  // 0 past the window: never chosen
      above[step] = Ballot(radix::AboveThreshold(t, key));
      at[step] = Ballot(radix::AtThreshold(t, key));
      if (lane == 0) {
        s.tile_counts[step * kWarps + warp] = PopCount(above[step]) | (PopCount(at[step]) << 16);
      }
    }
    __syncthreads();
    if (warp == 0) {
      uint32_t local[kPerLane];
      uint32_t sum = 0;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int e = lane * kPerLane + j;
        local[j] = e < kEntries ? s.tile_counts[e] : 0u;
        sum += local[j];
      }
      const uint32_t inclusive = WarpInclusiveSum(sum);  // halves stay below 2^16: no carry
      uint32_t before = inclusive - sum;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int e = lane * kPerLane + j;
        if (e < kEntries) {
          s.above_before[e] = run_above + (before & 0xffffu);
          s.at_before[e] = run_at + (before >> 16);
        }
        before += local[j];
      }
      const uint32_t tile = ::attnd::gpu::Shfl(inclusive, kWarpSize - 1);
      run_above += tile & 0xffffu;
      run_at += tile >> 16;
    }
    __syncthreads();
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const bool is_above = (above[step] >> lane) & 1u;
      const bool is_at = (at[step] >> lane) & 1u;
      if (!is_above && !is_at) continue;
      const int e = step * kWarps + warp;
      const uint32_t at_before = s.at_before[e] + PopCount(at[step] & below);
      if (!radix::IsChosen(t, is_above, is_at, at_before)) continue;
      const uint32_t above_before = s.above_before[e] + PopCount(above[step] & below);
      const uint32_t pos = radix::OutputPosition(t, above_before, at_before);
      const uint32_t i = base + step * kThreads + threadIdx.x;
      if (pos < out.k) out.Write(pos, w.begin + i, bits[step]);
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int step = 0; step < kSteps; ++step) bits[step] = next[step];
    }
  }
}

// One refinement level (1 or 2): histograms digit kLevel of the keys in t's bin, from the
// candidates when the level-0 bin was gathered (at level 1), else from the row, and moves t to
// the bin holding rank t.need. Returns that bin.
template <int kThreads, int kLevel>
__device__ BinChoice RefineLevel(const uint32_t* row, uint32_t len, bool gathered, Threshold& t,
                                 Shared<kThreads>& s) {
  static_assert(kLevel >= 1 && kLevel < radix::kLevels, "level 0 starts the walk");
  ClearHistogram(s, /*reset_candidates=*/false);
  __syncthreads();
  if (!gathered) {
    RowHistogram<kThreads, kLevel, false>(row, len, t, s);
  } else if constexpr (kLevel == 1) {
    RowHistogram<kThreads, kLevel, true>(row, len, t, s);
  } else {
    CandidateHistogram<kThreads, kLevel>(t, s);
  }
  __syncthreads();
  const BinChoice c = ChooseBin<kThreads>(t.need, s);
  t = radix::Refine(t, kLevel, c.bin, c.above);
  return c;
}

// Selects and writes one non-empty window; returns how many entries were written.
template <int kThreads>
__device__ uint32_t SelectRow(const RowArgs& a, int64_t row_index, const RowSpan& w,
                              Shared<kThreads>& s) {
  const uint32_t* row = a.logits + row_index * a.logits_ld + w.begin;
  ClearHistogram(s, /*reset_candidates=*/true);
  __syncthreads();
  Threshold t = radix::Start(a.k);
  RowHistogram<kThreads, 0, false>(row, w.len, t, s);
  __syncthreads();
  BinChoice c = ChooseBin<kThreads>(t.need, s);
  if (c.total == 0) return 0;  // nothing selectable
  uint32_t count = a.k;
  if (c.total <= a.k) {
    t = radix::AllSelectable();
    count = c.total;
  } else {
    t = radix::Refine(t, 0, c.bin, c.above);
    // A bin taken whole needs no further level; after level 2 the equal keys are exact ties.
    static_assert(radix::kLevels == 3, "levels 1 and 2 refine");
    const bool gathered = c.count <= kCandidateCapacity;
    if (c.count != t.need) c = RefineLevel<kThreads, 1>(row, w.len, gathered, t, s);
    if (c.count != t.need) c = RefineLevel<kThreads, 2>(row, w.len, gathered, t, s);
  }
  RowOut out = MakeRowOut(a, row_index);
  if (a.row_start_base) out.origin = static_cast<int32_t>(w.begin);
  OrderedPass(row, w, t, out, s);
  return count;
}

// Three 512-thread CTAs per SM (40 registers, 42 KB of shared memory each): many rows. The
// 1024-thread variant serves fewer rows than SMs or about: one per SM, registers unconstrained.
// On AMD, as many as the LDS holds (ATTND_LAUNCH_BOUNDS): three on gfx950, one on gfx90a/gfx942.
template <int kThreads>
constexpr int MinBlocksPerSm() {
  return kThreads >= 1024 ? 1 : 3;
}

template <int kThreads>
__global__ void ATTND_LAUNCH_BOUNDS(kThreads, MinBlocksPerSm<kThreads>(), sizeof(Shared<kThreads>))
    TopkRowsKernel(const RowArgs a) {
  __shared__ Shared<kThreads> s;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const RowSpan w = LoadWindow(a, row);  // the same in every thread: branches stay uniform
    const uint32_t count = w.len > 0 ? SelectRow(a, row, w, s) : 0u;
    MakeRowOut(a, row).Pad<kThreads>(count);
    __syncthreads();  // shared state is free for the next row
  }
}

}  // namespace

::attnd::gpu::Error LaunchTopkSimt(const Params& p, ::attnd::gpu::Stream stream) {
  const RowArgs a = MakeRowArgs(p);
  if (a.rows == 0) return ::attnd::gpu::kSuccess;  // an empty grid is a launch error
  const unsigned grid = static_cast<unsigned>(std::min(a.rows, kMaxGridX));
  if (a.rows < kFewRows) {
    TopkRowsKernel<1024><<<grid, 1024, 0, stream>>>(a);
  } else {
    TopkRowsKernel<512><<<grid, 512, 0, stream>>>(a);
  }
  return ::attnd::gpu::GetLastError();
}

}  // namespace attnd::kernels::topk::gpu
