// The streaming GPU top-k (CUDA). Each CTA (or each CTA of a row's cluster, on its segment of the
// window) reads its logits once, 16 bytes per thread per load, with the chunks ahead prefetched
// into L2 (sm_90 bulk prefetch), and appends the admitted ones (value >= the admission
// floor) to a candidate buffer of (f32 bits, column) pairs in shared memory, in column order. The
// floor starts at the lowest selectable value and rises:
//   - at the first chunk, to a speculative level-0 bin from the first chunks' histogram (a bin that
//     very likely leaves >= k entries; if it leaves fewer, the row is streamed again without it);
//   - whenever the buffer cannot take another chunk, by an exact compaction to the k best so far
//     (ties to the lowest columns), the floor moving just above the k-th (stream_plan.h).
// Every entry dropped has k entries above it in the (key desc, column asc) order, so the buffer
// always holds the window's top k. The final radix select (radix.h levels, histograms over the
// buffer, summed over the cluster through DSMEM) and an ordered pass write exactly the CPU
// implementation's output: ascending columns, ties to the lowest columns, -1 / -inf padding.
// CUDA only (clusters, sm_90 bulk prefetch): compiles to nothing in HIP builds.
#if defined(ATTND_GPU_CUDA)

#include <stdint.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/common/gpu/convert.cuh"
#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/topk/gpu/radix.h"
#include "kernels/topk/gpu/row_args.h"
#include "kernels/topk/gpu/stream.h"
#include "kernels/topk/gpu/stream_block.cuh"
#include "kernels/topk/gpu/stream_plan.h"

namespace attnd::kernels::topk::gpu {
namespace {

namespace vendor = ::attnd::gpu;
using radix::Threshold;

constexpr uint32_t kNanBits = 0xffffffffu;  // stands in for columns outside the window: key 0
constexpr uint32_t kMinSelectableBits = 0xff7fffffu;  // -FLT_MAX: admits every selectable logit
constexpr int kBins = radix::kBins;
constexpr int kMaxCluster = 8;  // portable cluster sizes

// The streaming kernel's arguments: the op's tensors and the launch's choices.
struct StreamArgs : RowArgs {
  uint32_t cluster = 1;  // CTAs per row; the launch's cluster dimension
  bool speculate = true;
  bool prefetch_rows = false;  // the whole tensor fits in L2: prefetch each segment at its start
};

// Shared memory: this header, then the candidate buffer: kCapacity (f32 bits, column) pairs.
template <int kThreads>
struct Header {
  static constexpr int kScanWords = 2;  // the most words one scan carries
  static constexpr int kSlotWords = ScanShape<kThreads, kScanWords>::kSlotWords;
  uint32_t hist[kBins];
  uint32_t scan[2 * kSlotWords];
  uint32_t choice[3];    // BlockChoose's answer: bin, keys above it, its count
  uint32_t exchange[2];  // this CTA's entries above / at the final threshold (cluster offsets)
};

template <int kThreads>
constexpr int HeaderBytes() {
  return static_cast<int>((sizeof(Header<kThreads>) + 15) / 16 * 16);
}
template <int kThreads>
constexpr int SmemBytes() {
  return HeaderBytes<kThreads>() + static_cast<int>(sizeof(uint2) * kCapacity);
}

// One CTA's view of its row: shared state and where it sits in the cluster.
template <int kThreads>
struct Cta {
  Header<kThreads>* h;
  uint2* entries;  // (f32 bits, column): the bits of a selectable logit, never NaN
  ScanSlots slots;
  uint32_t rank;     // in the cluster
  uint32_t cluster;  // CTAs per row
};

// Row `row`'s window, clamped as topk::RowWindow does.
using RowSpan = RowSpanOf<int64_t>;

__device__ RowSpan LoadWindow(const StreamArgs& a, int64_t row) {
  return LoadWindowAs<RowSpan>(a, row);
}

// Where row `row`'s output goes: RowDest (row_args.h), padded one entry at a time.
using RowOut = RowDest;
__device__ __forceinline__ RowOut MakeRowOut(const StreamArgs& a, int64_t row) {
  return RowDest::Of(a, row);
}

// ---- Reading the window.

// The segment of the window this CTA streams.
struct Segment {
  const uint32_t* row;  // column 0 of the row
  const uint4* groups;  // group 0 (16-byte aligned; only groups inside the window are read)
  SegmentPlan plan;
  int64_t begin, end;  // the window's columns
};

// Group g of the window as four f32 bit patterns (kNanBits outside the window or the segment):
// one 16-byte load when the group lies inside the window, else element loads of its columns in it.
__device__ __forceinline__ uint4 LoadGroupChecked(const Segment& seg, uint32_t g) {
  uint4 v = make_uint4(kNanBits, kNanBits, kNanBits, kNanBits);
  if (g >= seg.plan.group_hi) return v;
  if (g >= seg.plan.full_lo && g < seg.plan.full_hi) return __ldg(seg.groups + g);
  const int64_t col = seg.plan.first_col + static_cast<int64_t>(kGroupElems) * g;
  uint32_t e[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int64_t c = col + q;
    e[q] = (c >= seg.begin && c < seg.end) ? seg.row[c] : kNanBits;
  }
  return make_uint4(e[0], e[1], e[2], e[3]);
}

// The groups of the chunk starting at group `base`: group base + v * kThreads + thread. Chunks
// wholly inside the window and the segment (all but the first and last) load unchecked.
template <int kThreads, int kV>
__device__ __forceinline__ void LoadChunk(const Segment& seg, uint32_t base, uint4 (&bits)[kV]) {
  constexpr uint32_t kStep = kThreads * kV;
  const uint32_t hi = min(seg.plan.full_hi, seg.plan.group_hi);
  if (base >= seg.plan.full_lo && base < hi && hi - base >= kStep) {  // the same in every thread
#pragma unroll
    for (int v = 0; v < kV; ++v) bits[v] = __ldg(seg.groups + base + v * kThreads + threadIdx.x);
  } else {
#pragma unroll
    for (int v = 0; v < kV; ++v) bits[v] = LoadGroupChecked(seg, base + v * kThreads + threadIdx.x);
  }
}

// Asks L2 for the segment's groups in [from, to) that lie inside the window (a hint: sm_90 bulk
// prefetch, nothing elsewhere). One thread calls it.
__device__ __forceinline__ void PrefetchGroups(const Segment& seg, uint32_t from, uint32_t to) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t lo = max(from, max(seg.plan.full_lo, seg.plan.group_lo));
  const uint32_t hi = min(to, min(seg.plan.full_hi, seg.plan.group_hi));
  if (lo >= hi) return;
  const uint64_t bytes = static_cast<uint64_t>(hi - lo) * sizeof(uint4);
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(seg.groups + lo),
               "r"(static_cast<uint32_t>(min(bytes, uint64_t{1} << 30)))
               : "memory");
#else
  static_cast<void>(seg), static_cast<void>(from), static_cast<void>(to);
#endif
}

__device__ __forceinline__ uint32_t Elem(const uint4& g, int q) {
  return q == 0 ? g.x : (q == 1 ? g.y : (q == 2 ? g.z : g.w));
}

__device__ __forceinline__ bool Admitted(uint32_t bits, float floor) {
  return vendor::BitsToFloat(bits) >= floor;  // NaN never; -inf below every floor
}

// Appends the chunk's admitted logits after the n buffered ones, in column order (v, thread,
// element); returns the new count (the same in every thread). One barrier. The caller guarantees
// n + kChunkElems <= kCapacity.
template <int kThreads, int kV>
__device__ uint32_t AppendChunk(Cta<kThreads>& cta, const Segment& seg, uint32_t base,
                                const uint4 (&bits)[kV], float floor, uint32_t n) {
  static_assert(kV <= 4, "one byte-field count per group");
  uint32_t take = 0;  // bit 4v + q: element q of group v
#pragma unroll
  for (int v = 0; v < kV; ++v) {
#pragma unroll
    for (int q = 0; q < 4; ++q) take |= Admitted(Elem(bits[v], q), floor) ? 1u << (4 * v + q) : 0u;
  }
  uint32_t packed = 0;
#pragma unroll
  for (int v = 0; v < kV; ++v) {
    packed |= static_cast<uint32_t>(__popc((take >> (4 * v)) & 0xfu)) << (8 * v);
  }
  uint32_t start[kV], total;
  BlockFieldScan<kThreads, kV>(packed, start, &total, cta.slots.Next());
#pragma unroll
  for (int v = 0; v < kV; ++v) {
    uint2* out = cta.entries + n + start[v];
    const int32_t col = static_cast<int32_t>(seg.plan.first_col +
                                             kGroupElems * (base + v * kThreads + threadIdx.x));
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if ((take >> (4 * v + q)) & 1u) {
        *out++ = make_uint2(Elem(bits[v], q), static_cast<uint32_t>(col + q));
      }
    }
  }
  return n + total;
}

// ---- Histograms and selects over the buffer.

template <int kThreads>
__device__ __forceinline__ void ClearHist(Cta<kThreads>& cta) {
  static_assert(kBins % (4 * kThreads) == 0, "whole uint4s of bins per thread");
  for (int i = 4 * threadIdx.x; i < kBins; i += 4 * kThreads) {
    *reinterpret_cast<uint4*>(cta.h->hist + i) = make_uint4(0, 0, 0, 0);
  }
}

// Adds the level-0 digits of the chunk's selectable logits to the histogram (the speculation's
// sample). Call after ClearHist and a barrier.
template <int kThreads, int kV>
__device__ __forceinline__ void HistChunk(Cta<kThreads>& cta, const uint4 (&bits)[kV]) {
#pragma unroll
  for (int v = 0; v < kV; ++v) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t key = radix::KeyOfBits(Elem(bits[v], q));
      if (key >= radix::kMinSelectableKey) atomicAdd(&cta.h->hist[radix::Digit(key, 0)], 1u);
    }
  }
}

// Histograms digit `level` of the buffered keys radix::InLevel admits under t (level 0: all).
// Call after ClearHist and a barrier (which also orders the appends before these reads).
template <int kThreads>
__device__ void BuildHist(Cta<kThreads>& cta, uint32_t n, int level, const Threshold& t) {
  for (uint32_t i = 2 * threadIdx.x; i < n; i += 2 * kThreads) {  // two entries per 16 bytes
    const uint4 e = *reinterpret_cast<const uint4*>(cta.entries + i);
    const uint32_t k0 = radix::KeyOfBits(e.x);
    if (radix::InLevel(k0, level, t)) atomicAdd(&cta.h->hist[radix::Digit(k0, level)], 1u);
    const uint32_t k1 = radix::KeyOfBits(e.z);
    if (i + 1 < n && radix::InLevel(k1, level, t)) {
      atomicAdd(&cta.h->hist[radix::Digit(k1, level)], 1u);
    }
  }
}

struct Choice {
  uint32_t bin = 0, above = 0, count = 0;  // the bin holding rank `need`, keys above it, its size
  uint32_t total = 0;                      // keys in the histogram
  bool found = false;                      // total >= need
};

// Walks the histogram (summed over the cluster when `over_cluster`) from the top bin down to the
// one holding the need-th largest key (need >= 1). Thread t owns kBins / kThreads bins from the
// top, so thread order is bin order from the top. Starts with a barrier (a cluster barrier when
// over_cluster, so every CTA's histogram is complete) and, over the cluster, ends with one (so no
// CTA clears its histogram while another still reads it).
template <int kThreads>
__device__ Choice BlockChoose(Cta<kThreads>& cta, uint32_t need, bool over_cluster) {
  constexpr int kPer = kBins / kThreads;
  static_assert(kBins % kThreads == 0 && kPer % 4 == 0, "whole uint4s of bins per thread");
  if (over_cluster) {
    ClusterSync();
  } else {
    __syncthreads();
  }
  const int low = kBins - (static_cast<int>(threadIdx.x) + 1) * kPer;  // my bins [low, low + kPer)
  uint32_t c[kPer];
#pragma unroll
  for (int j = 0; j < kPer; j += 4) {
    const uint4 v = *reinterpret_cast<const uint4*>(cta.h->hist + low + j);
    c[j] = v.x, c[j + 1] = v.y, c[j + 2] = v.z, c[j + 3] = v.w;
  }
  if (over_cluster) {
    for (uint32_t r = 0; r < cta.cluster; ++r) {
      if (r == cta.rank) continue;
      const uint32_t* remote = MapToRank(cta.h->hist, r);
#pragma unroll
      for (int j = 0; j < kPer; j += 4) {
        const uint4 v = *reinterpret_cast<const uint4*>(remote + low + j);
        c[j] += v.x, c[j + 1] += v.y, c[j + 2] += v.z, c[j + 3] += v.w;
      }
    }
  }
  uint32_t sum[1] = {0};
#pragma unroll
  for (int j = 0; j < kPer; ++j) sum[0] += c[j];
  uint32_t above[1], total[1];
  BlockExclusiveScan<kThreads, 1>(sum, above, total, cta.slots.Next());
  if (above[0] < need && need - above[0] <= sum[0]) {  // exactly one thread
    uint32_t acc = above[0];
#pragma unroll
    for (int j = kPer - 1; j >= 0; --j) {
      if (radix::HoldsRank(acc, c[j], need)) {
        cta.h->choice[0] = static_cast<uint32_t>(low + j);
        cta.h->choice[1] = acc;
        cta.h->choice[2] = c[j];
      }
      acc += c[j];
    }
  }
  __syncthreads();
  Choice ch;
  ch.total = total[0];
  ch.found = total[0] >= need;
  if (ch.found) {
    ch.bin = cta.h->choice[0];
    ch.above = cta.h->choice[1];
    ch.count = cta.h->choice[2];
  }
  if (over_cluster) ClusterSync();
  return ch;
}

// The radix walk for the k best of the buffer (of the cluster's buffers when over_cluster): the
// threshold an ordered pass applies and, in *total, the keys buffered. When total <= k every
// entry is chosen (radix::AllSelectable). Level 0 always runs; levels 1 and 2 unless a bin is
// taken whole.
template <int kThreads>
__device__ Threshold SelectK(Cta<kThreads>& cta, uint32_t n, uint32_t k, bool over_cluster,
                             uint32_t* total) {
  Threshold t = radix::Start(k);
  ClearHist(cta);
  __syncthreads();
  BuildHist(cta, n, 0, t);
  Choice c = BlockChoose(cta, k, over_cluster);
  *total = c.total;
  if (c.total <= k) return radix::AllSelectable();
  t = radix::Refine(t, 0, c.bin, c.above);
#pragma unroll 1
  for (int level = 1; level < radix::kLevels && c.count != t.need; ++level) {
    ClearHist(cta);
    __syncthreads();
    BuildHist(cta, n, level, t);
    c = BlockChoose(cta, t.need, over_cluster);
    t = radix::Refine(t, level, c.bin, c.above);
  }
  return t;
}

// Per tile of kThreads * kOrderedPerThread buffered entries (consecutive ones per thread): counts
// of keys above / at t, one scan, then every chosen entry's output position
// (radix::OutputPosition), with gt / eq the counts of lower columns before the buffer (lower ranks
// of the cluster). Calls emit(pos, bits, col) per chosen entry; with an in-place emit every tile
// is read before any of it is written (positions never pass the entry's own index). Returns the
// buffer's counts above and at t. Call after a barrier that completes the buffer; one barrier per
// tile.
constexpr int kOrderedPerThread = 8;

template <int kThreads, class Emit>
__device__ uint2 OrderedPass(Cta<kThreads>& cta, uint32_t n, const Threshold& t, uint32_t gt,
                             uint32_t eq, Emit emit) {
  constexpr int kE = kOrderedPerThread;
  constexpr uint32_t kTile = kThreads * kE;
  static_assert(kE % 2 == 0 && kTile < (1u << 16), "pairs of entries; 16-bit tile counts");
  uint2 counts = make_uint2(0, 0);
  for (uint32_t base = 0; base < n; base += kTile) {  // the same trip count everywhere
    const uint32_t i0 = base + kE * threadIdx.x;
    uint32_t bits[kE], key[kE];
    int32_t col[kE];
#pragma unroll
    for (int j = 0; j < kE; j += 2) {
      const uint4 e = i0 + j < n ? *reinterpret_cast<const uint4*>(cta.entries + i0 + j)
                                 : make_uint4(kNanBits, 0, kNanBits, 0);
      bits[j] = e.x, col[j] = static_cast<int32_t>(e.y);
      bits[j + 1] = i0 + j + 1 < n ? e.z : kNanBits, col[j + 1] = static_cast<int32_t>(e.w);
    }
    uint32_t above = 0, at = 0;  // bit j: entry i0 + j
#pragma unroll
    for (int j = 0; j < kE; ++j) {
      key[j] = radix::KeyOfBits(bits[j]);  // 0 past the buffer: neither above nor at
      above |= radix::AboveThreshold(t, key[j]) ? 1u << j : 0u;
      at |= radix::AtThreshold(t, key[j]) && key[j] != 0 ? 1u << j : 0u;
    }
    const uint32_t mine[1] = {static_cast<uint32_t>(__popc(above)) |
                              (static_cast<uint32_t>(__popc(at)) << 16)};
    uint32_t excl[1], total[1];
    BlockExclusiveScan<kThreads, 1>(mine, excl, total, cta.slots.Next());
    uint32_t g = gt + (excl[0] & 0xffffu);
    uint32_t e = eq + (excl[0] >> 16);
#pragma unroll
    for (int j = 0; j < kE; ++j) {
      const bool is_above = (above >> j) & 1u;
      const bool is_at = (at >> j) & 1u;
      if (radix::IsChosen(t, is_above, is_at, e)) {
        emit(radix::OutputPosition(t, g, e), bits[j], col[j]);
      }
      g += is_above ? 1u : 0u;
      e += is_at ? 1u : 0u;
    }
    gt += total[0] & 0xffffu;
    eq += total[0] >> 16;
    counts.x += total[0] & 0xffffu;
    counts.y += total[0] >> 16;
  }
  return counts;
}

// Keeps, in place and in column order, the buffered entries t chooses; returns their number.
template <int kThreads>
__device__ uint32_t CompactInPlace(Cta<kThreads>& cta, uint32_t n, const Threshold& t) {
  uint2* entries = cta.entries;
  const uint2 c = OrderedPass(cta, n, t, 0, 0, [&](uint32_t pos, uint32_t bits, int32_t col) {
    entries[pos] = make_uint2(bits, static_cast<uint32_t>(col));
  });
  return radix::IsChosen(t, false, true, 0) ? c.x + min(c.y, t.need) : c.x;
}

// ---- One row.

struct StreamResult {
  uint32_t n;       // entries buffered
  bool speculated;  // a speculative floor was applied (cluster-uniform)
};

// Streams this CTA's segment into the buffer. spec_rank > 0: before the first chunk is appended,
// the floor rises to the level-0 bin holding that rank among the cluster's first-chunk logits
// (when it exists). The first chunk is processed by every CTA, empty segments too: the
// speculation's cluster barriers are uniform.
template <int kThreads, int kV>
__device__ StreamResult StreamSegment(Cta<kThreads>& cta, const Segment& seg, uint32_t k,
                                      uint32_t spec_rank, bool prefetch_ahead) {
  constexpr uint32_t kStep = kThreads * kV;  // groups per chunk
  static_assert(kStep * kGroupElems == kChunkElems, "chunks of kChunkElems logits");
  static_assert(static_cast<int64_t>(kCapacity) >= kMaxK + kChunkElems,
                "room for k kept entries plus a chunk");
  StreamResult r{0, false};
  uint32_t admit = radix::kMinSelectableKey;
  float floor = vendor::BitsToFloat(kMinSelectableBits);
  uint4 cur[kV];
  uint32_t g = seg.plan.group_lo;
  if (prefetch_ahead && threadIdx.x == 0) PrefetchGroups(seg, g + kStep, g + 3 * kStep);
  LoadChunk<kThreads, kV>(seg, g, cur);
  if (spec_rank > 0) {
    ClearHist(cta);
    __syncthreads();
    HistChunk<kThreads, kV>(cta, cur);
    const Choice c = BlockChoose(cta, spec_rank, /*over_cluster=*/cta.cluster > 1);
    if (c.found) {  // cluster-uniform
      r.speculated = true;
      admit = c.bin << radix::DigitShift(0);
      floor = vendor::BitsToFloat(AdmitBits(admit));
    }
  }
  r.n = AppendChunk<kThreads, kV>(cta, seg, g, cur, floor, 0);
  // The chunks ahead are asked of L2 (two chunks, or the whole segment at the row's start), so
  // each step's loads wait for L2, not HBM, and no second chunk occupies registers.
#pragma unroll 1
  for (g += kStep; g < seg.plan.group_hi; g += kStep) {
    if (prefetch_ahead && threadIdx.x == 0) PrefetchGroups(seg, g + 2 * kStep, g + 3 * kStep);
    LoadChunk<kThreads, kV>(seg, g, cur);
    if (r.n + kChunkElems > kCapacity) {  // the same in every thread
      uint32_t total;
      const Threshold t = SelectK(cta, r.n, k, /*over_cluster=*/false, &total);
      __syncthreads();
      r.n = CompactInPlace(cta, r.n, t);
      admit = max(admit, AdmitKeyAfter(t));
      floor = vendor::BitsToFloat(AdmitBits(admit));
    }
    r.n = AppendChunk<kThreads, kV>(cta, seg, g, cur, floor, r.n);
  }
  return r;
}

// Selects and writes one non-empty window; returns how many entries are chosen (cluster-uniform).
template <int kThreads, int kV>
__device__ uint32_t SelectRow(Cta<kThreads>& cta, const StreamArgs& a, int64_t row,
                              const RowSpan& w) {
  Segment seg;
  seg.row = a.logits + row * a.logits_ld;
  seg.begin = w.begin;
  seg.end = w.begin + w.len;
  const uint32_t misalign =
      static_cast<uint32_t>(reinterpret_cast<uintptr_t>(seg.row + w.begin) / sizeof(uint32_t)) &
      (kGroupElems - 1);
  seg.plan = PlanSegment(w.begin, w.len, misalign, cta.rank, cta.cluster);
  // Group 0's address, formed without pointer arithmetic below the row (first_col may be < 0).
  seg.groups = reinterpret_cast<const uint4*>(reinterpret_cast<uintptr_t>(seg.row) +
                                              seg.plan.first_col * sizeof(uint32_t));
  if (a.prefetch_rows && threadIdx.x == 0) {
    PrefetchGroups(seg, seg.plan.group_lo, seg.plan.group_hi);
  }
  uint32_t spec_rank = 0;
  if (a.speculate && Speculates(w.len, a.k)) {
    const uint32_t sample = SampleColumns(w.len, misalign, cta.cluster, kThreads * kV);
    spec_rank = SpeculationRank(a.k, sample, w.len);
  }
  const bool over_cluster = cta.cluster > 1;
  StreamResult s = StreamSegment<kThreads, kV>(cta, seg, a.k, spec_rank, !a.prefetch_rows);
  uint32_t total = 0;
  Threshold t = SelectK(cta, s.n, a.k, over_cluster, &total);
  if (s.speculated && total < a.k) {  // the floor was too high: stream again without it
    __syncthreads();
    s = StreamSegment<kThreads, kV>(cta, seg, a.k, 0, !a.prefetch_rows);
    t = SelectK(cta, s.n, a.k, over_cluster, &total);
  }
  const uint32_t count = total <= a.k ? total : a.k;
  uint32_t gt = 0, eq = 0;
  __syncthreads();
  if (over_cluster) {  // entries above / at t in lower ranks' segments (lower columns)
    const uint2 mine = OrderedPass(cta, s.n, t, 0, 0, [](uint32_t, uint32_t, int32_t) {});
    if (threadIdx.x == 0) cta.h->exchange[0] = mine.x, cta.h->exchange[1] = mine.y;
    ClusterSync();
    for (uint32_t r = 0; r < cta.rank; ++r) {
      const uint32_t* remote = MapToRank(cta.h->exchange, r);
      gt += remote[0];
      eq += remote[1];
    }
  }
  RowOut out = MakeRowOut(a, row);
  if (a.row_start_base) out.origin = static_cast<int32_t>(w.begin);
  OrderedPass(cta, s.n, t, gt, eq, [&](uint32_t pos, uint32_t bits, int32_t col) {
    if (pos < a.k) out.Write(pos, col, bits);
  });
  return count;
}

// Three 256-thread CTAs per SM (80 registers, 73 KB of shared memory each) or two of 512 (64
// registers): one CTA's barriers and selects overlap another's loads.
template <int kThreads>
constexpr int MinBlocksPerSm() {
  return kThreads >= 512 ? 2 : 3;
}

template <int kThreads, int kV>
__global__ void ATTND_LAUNCH_BOUNDS(kThreads, MinBlocksPerSm<kThreads>(), 0)
    TopkStreamKernel(const StreamArgs a) {
  extern __shared__ uint4 smem[];
  Cta<kThreads> cta;
  cta.h = reinterpret_cast<Header<kThreads>*>(smem);
  cta.entries = reinterpret_cast<uint2*>(reinterpret_cast<char*>(smem) + HeaderBytes<kThreads>());
  cta.slots = ScanSlots{cta.h->scan, Header<kThreads>::kSlotWords, 0};
  cta.cluster = a.cluster;
  cta.rank = blockIdx.x % a.cluster;
  const int64_t clusters = gridDim.x / a.cluster;
  for (int64_t row = blockIdx.x / a.cluster; row < a.rows; row += clusters) {
    const RowSpan w = LoadWindow(a, row);  // the same in every thread of the cluster
    const uint32_t count = w.len > 0 ? SelectRow<kThreads, kV>(cta, a, row, w) : 0u;
    const RowOut out = MakeRowOut(a, row);
    for (uint32_t j = count + cta.rank * kThreads + threadIdx.x; j < a.k;
         j += a.cluster * kThreads) {
      out.PadOne(j);
    }
    if (a.cluster > 1) {
      ClusterSync();  // no CTA reads another's shared memory past here
    } else {
      __syncthreads();  // shared state is free for the next row
    }
  }
}

// ---- Host side.

StreamArgs MakeArgs(const Params& p) {
  StreamArgs a;
  static_cast<RowArgs&>(a) = MakeRowArgs(p);
  return a;
}

constexpr int kDefaultThreads = 256;
constexpr int64_t kPrefetchAllBytes = int64_t{24} << 20;  // well inside the H200's 60 MB of L2

template <int kThreads, int kV>
const void* KernelOf() {
  return reinterpret_cast<const void*>(&TopkStreamKernel<kThreads, kV>);
}

// Resident clusters of `cluster` CTAs of the kernel (0 when none fit); cached.
int MaxActiveClusters(const void* kernel, int threads, int smem, int cluster) {
  static std::mutex mu;
  static auto* cache = new std::map<std::tuple<const void*, int, int>, int>();
  int device = 0;
  if (vendor::GetDevice(&device) != vendor::kSuccess) return 0;
  const auto key = std::make_tuple(kernel, device, cluster);
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cluster), 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &config) != cudaSuccess) {
    static_cast<void>(vendor::GetLastError());
    n = 0;
  }
  (*cache)[key] = n;
  return n;
}

template <int kThreads, int kV>
vendor::Error Launch(const StreamArgs& base, const StreamConfig& config, vendor::Stream stream) {
  const void* kernel = KernelOf<kThreads, kV>();
  constexpr int kSmem = SmemBytes<kThreads>();
  vendor::DeviceFacts d;
  if (!vendor::CurrentDeviceFacts(&d)) return cudaErrorNoDevice;
  const int per_sm = vendor::BlocksPerSm(kernel, kThreads, kSmem);  // also allows the smem
  if (per_sm == 0) return cudaErrorInvalidConfiguration;
  const int64_t resident = static_cast<int64_t>(per_sm) * d.sm_count;
  int cluster = config.cluster;
  if (cluster == 0) {
    cluster = d.cc_major >= 9 ? ClusterSizeFor(base.rows, base.cols, d.sm_count, kMaxCluster) : 1;
  }
  if (cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8) return cudaErrorInvalidValue;
  if (cluster > 1 && d.cc_major < 9) return cudaErrorNotSupported;
  StreamArgs a = base;
  a.cluster = static_cast<uint32_t>(cluster);
  a.speculate = config.speculate;
  // All rows in flight at once and the tensor well inside L2: prefetch whole segments.
  a.prefetch_rows = a.rows * cluster <= resident &&
                    a.rows * a.logits_ld * static_cast<int64_t>(sizeof(float)) <= kPrefetchAllBytes;
  if (cluster == 1) {
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(a.rows, resident));
    TopkStreamKernel<kThreads, kV><<<grid, kThreads, kSmem, stream>>>(a);
    return vendor::GetLastError();
  }
  const int clusters = MaxActiveClusters(kernel, kThreads, kSmem, cluster);
  if (clusters == 0) return cudaErrorInvalidConfiguration;
  cudaLaunchConfig_t launch = {};
  launch.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>(a.rows, clusters) * cluster), 1, 1);
  launch.blockDim = dim3(kThreads, 1, 1);
  launch.dynamicSmemBytes = kSmem;
  launch.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  launch.attrs = attr;
  launch.numAttrs = 1;
  return cudaLaunchKernelEx(&launch, TopkStreamKernel<kThreads, kV>, a);
}

}  // namespace

bool SupportsStream(const Params&, std::string* why) {
  vendor::DeviceFacts d;
  if (!vendor::CurrentDeviceFacts(&d)) {
    if (why != nullptr) *why = "no GPU device";
    return false;
  }
  constexpr int kSmem = std::max(SmemBytes<256>(), SmemBytes<512>());
  if (d.smem_optin < kSmem) {
    if (why != nullptr) {
      *why = "needs " + std::to_string(kSmem) +
             " bytes of shared memory per block, the device allows " + std::to_string(d.smem_optin);
    }
    return false;
  }
  return true;
}

vendor::Error LaunchTopkStreamWith(const Params& p, const StreamConfig& config,
                                   vendor::Stream stream) {
  const StreamArgs a = MakeArgs(p);
  if (a.rows == 0) return vendor::kSuccess;  // an empty grid is a launch error
  int threads = config.threads;
  if (threads == 0) {  // rows that fit one wave: the wider CTA shortens each row's chain of steps
    vendor::DeviceFacts d;
    threads = vendor::CurrentDeviceFacts(&d) && a.rows <= d.sm_count ? 512 : kDefaultThreads;
  }
  switch (threads) {
    case 256: return Launch<256, 4>(a, config, stream);
    case 512: return Launch<512, 2>(a, config, stream);
    default: return cudaErrorInvalidValue;
  }
}

vendor::Error LaunchTopkStream(const Params& p, vendor::Stream stream) {
  return LaunchTopkStreamWith(p, StreamConfig{}, stream);
}

}  // namespace attnd::kernels::topk::gpu

#endif  // defined(ATTND_GPU_CUDA)
