// The threshold-filter GPU top-k (CUDA); docs/KERNELS.md "Top-k, threshold filter". Per row
// (per CTA of the row's cluster, on its segment of the window):
//   1. Floor: windows longer than the buffer histogram the level-0 digits of a sample (each
//      thread's first 16-byte group, summed over the cluster through DSMEM) and take the bin
//      holding a rank that very likely leaves >= k window entries at or above it; else the floor
//      is the lowest selectable value.
//   2. Filter: one read of the segment, 16 bytes per thread per load; logits >= floor are
//      appended, unordered, as (key, column) to a shared-memory buffer: one warp scan and one
//      shared atomic per warp and chunk. The count keeps growing past the buffer (overflow).
//   3. The leader CTA gathers the cluster's candidates (DSMEM stores), runs a radix select on
//      them with digits fitted to their key range (FittedSelect; a warp ranks the last few keys)
//      and marks the chosen columns in two bitmaps (above / at the threshold); a scan over the
//      bitmaps writes ascending columns, ties to the lowest columns.
// When the candidates overflow the buffer, or a speculative floor left fewer than k, the leader
// runs the fixed-digit select (RadixSelect, radix.h levels) on the window itself (re-read from
// L2/HBM, one pass per level) instead: slower, exact. Entries dropped by the floor all lie below
// >= k kept entries, so the buffer holds the window's top k whenever it is used. CUDA only:
// compiles to nothing in HIP builds.
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
#include "kernels/topk/gpu/filter.h"
#include "kernels/topk/gpu/filter_plan.h"
#include "kernels/topk/gpu/radix.h"
#include "kernels/topk/gpu/row_args.h"
#include "kernels/topk/gpu/stream_block.cuh"
#include "kernels/topk/gpu/stream_plan.h"

namespace attnd::kernels::topk::gpu {
namespace {

namespace vendor = ::attnd::gpu;
using radix::Threshold;

constexpr uint32_t kNanBits = 0xffffffffu;  // columns outside the window: key 0, never admitted
constexpr int kBins = radix::kBins;
// The largest cluster the default picks (8, the portable limit, stays forceable): one
// 131072-column row measured 20.0 µs with 4 CTAs against 22.2 with 8 on the H200
// (docs/KERNELS.md "Top-k, threshold filter").
constexpr int kMaxDefaultCluster = 4;
constexpr int kV = 4;  // 16-byte groups per thread per chunk
// WriteRow stages up to k indices (4 bytes each) in the buffer of 8-byte entries.
static_assert(2 * static_cast<int64_t>(kFilterCapacitySmall) >= kMaxK, "k indices fit the buffer");

struct FilterArgs : RowArgs {
  uint32_t cluster = 1;  // CTAs per row; the launch's cluster dimension
  bool speculate = true;
  bool prefetch = false;
  bool fine_floor = false;    // 256-thread single-CTA rows refine the sampled floor (FilterConfig)
  float floor_sigmas = 3.0f;  // the floor's margin (FloorRank)
};

template <int kThreads>
struct Header {
  static constexpr int kSlotWords = ScanShape<kThreads, 2>::kSlotWords;
  uint32_t hist[kBins];
  uint32_t scan[2 * kSlotWords];
  uint32_t choice[3];  // Choose's answer: bin, keys above it, its count
  uint32_t count;      // entries appended to the buffer this row (may pass the capacity)
  uint32_t range[2];   // the buffered keys' min and max (KeyRange; reset with count)
  // FittedSelect's last bin when it holds few keys: the keys, their number, and the answer
  // (the need-th largest key, how many keys equal to it are taken).
  uint32_t few[kLanes];
  uint32_t few_col[kLanes];  // their columns (MarkWithFew: the few keys are marked by one warp)
  uint32_t few_count;
  uint32_t few_choice[2];
};

template <int kThreads>
constexpr uint32_t HeaderBytes() {
  return static_cast<uint32_t>((sizeof(Header<kThreads>) + 15) / 16 * 16);
}

template <int kThreads>
struct Cta {
  Header<kThreads>* h;
  uint2* entries;         // FilterCapacity(kThreads) (f32 bits, column) pairs from the filter,
                          // (key, column) from KeyRange on (SelectRow); keys selectable
  uint32_t* above;        // bitmap words of the window's columns: chosen above the threshold
  uint32_t* at;           // ... and at it (the first t.need of them in column order are chosen)
  uint32_t bitmap_words;  // words of each bitmap
  ScanSlots slots;
  uint32_t rank;     // in the cluster
  uint32_t cluster;  // CTAs per row
};

using RowSpan = RowSpanOf<int64_t>;

// ---- Reading a window.

// A part of row `row`'s window as 16-byte groups (stream_plan.h PlanSegment).
struct Segment {
  const uint32_t* row;  // column 0 of the row
  const uint4* groups;  // group 0 (16-byte aligned; only groups inside the window are read)
  SegmentPlan plan;
  int64_t begin, end;  // the window's columns
};

__device__ __forceinline__ Segment MakeSegment(const FilterArgs& a, int64_t row, const RowSpan& w,
                                               uint32_t rank, uint32_t parts) {
  Segment s;
  s.row = a.logits + row * a.logits_ld;
  s.begin = w.begin;
  s.end = w.begin + w.len;
  const uint32_t misalign =
      static_cast<uint32_t>(reinterpret_cast<uintptr_t>(s.row + w.begin) / sizeof(uint32_t)) &
      (kGroupElems - 1);
  s.plan = PlanSegment(w.begin, w.len, misalign, rank, parts);
  // Group 0's address without pointer arithmetic below the row (first_col may be < 0).
  s.groups = reinterpret_cast<const uint4*>(reinterpret_cast<uintptr_t>(s.row) +
                                            s.plan.first_col * sizeof(uint32_t));
  return s;
}

// Group g as four f32 bit patterns, kNanBits outside the window or past the segment.
__device__ __forceinline__ uint4 LoadGroupChecked(const Segment& s, uint32_t g) {
  uint4 v = make_uint4(kNanBits, kNanBits, kNanBits, kNanBits);
  if (g >= s.plan.group_hi) return v;
  if (g >= s.plan.full_lo && g < s.plan.full_hi) return __ldg(s.groups + g);
  const int64_t col = s.plan.first_col + static_cast<int64_t>(kGroupElems) * g;
  uint32_t e[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int64_t c = col + q;
    e[q] = (c >= s.begin && c < s.end) ? __ldg(s.row + c) : kNanBits;
  }
  return make_uint4(e[0], e[1], e[2], e[3]);
}

// Groups base + v * kThreads + thread of the chunk at `base`; chunks wholly inside the window and
// the segment load unchecked.
template <int kThreads>
__device__ __forceinline__ void LoadChunk(const Segment& s, uint32_t base, uint4 (&bits)[kV]) {
  constexpr uint32_t kStep = kThreads * kV;
  const uint32_t hi = min(s.plan.full_hi, s.plan.group_hi);
  if (base >= s.plan.full_lo && base < hi && hi - base >= kStep) {  // the same in every thread
#pragma unroll
    for (int v = 0; v < kV; ++v) bits[v] = __ldg(s.groups + base + v * kThreads + threadIdx.x);
  } else {
#pragma unroll
    for (int v = 0; v < kV; ++v) bits[v] = LoadGroupChecked(s, base + v * kThreads + threadIdx.x);
  }
}

// Asks L2 for the segment's whole groups (a hint: sm_90 bulk prefetch, nothing elsewhere).
__device__ __forceinline__ void PrefetchSegment(const Segment& s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t lo = max(s.plan.full_lo, s.plan.group_lo);
  const uint32_t hi = min(s.plan.full_hi, s.plan.group_hi);
  if (lo >= hi) return;
  const uint64_t bytes = static_cast<uint64_t>(hi - lo) * sizeof(uint4);
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(s.groups + lo),
               "r"(static_cast<uint32_t>(min(bytes, uint64_t{1} << 30)))
               : "memory");
#else
  static_cast<void>(s);
#endif
}

__device__ __forceinline__ uint32_t Elem(const uint4& g, int q) {
  return q == 0 ? g.x : (q == 1 ? g.y : (q == 2 ? g.z : g.w));
}

// Calls f(key, column) for every column of the segment (keys of columns outside it are 0), each
// thread for its own groups.
template <int kThreads, class F>
__device__ __forceinline__ void ForEachInSegment(const Segment& s, F&& f) {
  constexpr uint32_t kStep = kThreads * kV;
#pragma unroll 1
  for (uint32_t g = s.plan.group_lo; g < s.plan.group_hi; g += kStep) {
    uint4 bits[kV];
    LoadChunk<kThreads>(s, g, bits);
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int32_t col =
          static_cast<int32_t>(s.plan.first_col + kGroupElems * (g + v * kThreads + threadIdx.x));
#pragma unroll
      for (int q = 0; q < 4; ++q) f(radix::KeyOfBits(Elem(bits[v], q)), col + q);
    }
  }
}

// ---- Filtering a chunk into the buffer.

// The key of an admitted logit's f32 bits: radix::KeyOfBits' sign-flip map alone (an admitted
// logit is never NaN).
__device__ __forceinline__ uint32_t AdmittedKey(uint32_t bits) {
  return bits ^ (static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u);
}

// Appends the chunk's logits >= floor to the buffer as (f32 bits, column), in any order; the
// bits become keys once per candidate after the filter (KeyRange or MarkChosen's reader), not
// once per logit here. No barrier. Each element costs a compare to count it and a compare, a
// predicated shared store and a predicated add to append it: no branch per element (per-element
// branches made this the kernel's largest block of instructions, docs/KERNELS.md "Top-k,
// threshold filter"). A thread whose entries would pass the capacity only counts them: the count
// then passes the capacity and the row takes the exact path, which never reads the buffer.
template <int kThreads>
__device__ __forceinline__ void AppendChunk(Cta<kThreads>& cta, const Segment& s, uint32_t base,
                                            const uint4 (&bits)[kV], float floor) {
  uint32_t minus = 0;  // -(the thread's logits >= floor): set.ge gives ~0 for each
#pragma unroll
  for (int v = 0; v < kV; ++v) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      // NaN never passes (an ordered compare); -inf lies below every floor.
      uint32_t ge;
      asm("set.ge.u32.f32 %0, %1, %2;"
          : "=r"(ge)
          : "f"(vendor::BitsToFloat(Elem(bits[v], q))), "f"(floor));
      minus += ge;
    }
  }
  const uint32_t mine = 0u - minus;
  if (!__any_sync(kFullMask, mine != 0)) return;  // warp-uniform
  const uint32_t incl = WarpInclusiveSum(mine);
  uint32_t pos = 0;
  if (LaneOf() == kLanes - 1) pos = atomicAdd(&cta.h->count, incl);
  pos = __shfl_sync(kFullMask, pos, kLanes - 1) + incl - mine;
  if (mine == 0 || pos + mine > FilterCapacity(kThreads)) return;
  uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(cta.entries)) + 8u * pos;
#pragma unroll
  for (int v = 0; v < kV; ++v) {
    const uint32_t col =
        static_cast<uint32_t>(s.plan.first_col + kGroupElems * (base + v * kThreads + threadIdx.x));
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t b = Elem(bits[v], q);
      asm volatile(
          "{\n .reg .pred p;\n setp.ge.f32 p, %1, %2;\n"
          " @p st.shared.v2.u32 [%0], {%3, %4};\n @p add.u32 %0, %0, 8;\n}\n"
          : "+r"(at)
          : "f"(vendor::BitsToFloat(b)), "f"(floor), "r"(b), "r"(col + q)
          : "memory");
    }
  }
}

// ---- Histograms and the radix select.

// Calls f(i) for every buffer entry i < total, each once: kThreads consecutive entries a step,
// a warp's lanes kSpread entries apart (odd, so a bijection of each step's entries); the passes
// that mark the chosen columns take it. The filter appends a thread's admitted logits next to
// each other, and a thread's columns all fall in one bank of the column bitmaps (its groups are
// kThreads · 4 columns apart, a multiple of 32 words; two banks when they straddle a word), so
// lanes on consecutive entries marked words of one bank, or one word, together: by a model of
// the addresses at 4096 × 32768 causal, about a third of ncu's shared wavefronts past the ideal.
// Entries kSpread apart come from threads about as far apart, mostly of distinct banks, and the
// lanes' 8-byte entries stay in distinct bank pairs (docs/KERNELS.md "Top-k, threshold filter").
// A mark's order changes nothing it marks. Measured alone it moved no time (the marks are not on
// a row's critical chain); kept with the staged index stores, the build measured together. The
// passes that count or take extremes keep the plain order: keys are in no order, so their
// conflicts are the random ones either way, and the spread's last step busies every warp.
constexpr uint32_t kSpread = 7;

template <int kThreads, class F>
__device__ __forceinline__ void ForEachBuffered(uint32_t total, F&& f) {
  static_assert((kThreads & (kThreads - 1)) == 0, "the spread is a bijection mod a power of two");
  const uint32_t spread = (threadIdx.x * kSpread) & (kThreads - 1);
  for (uint32_t step = 0; step < total; step += kThreads) {
    const uint32_t i = step + spread;
    if (i < total) f(i);
  }
}

template <int kThreads>
__device__ __forceinline__ void ClearHist(Cta<kThreads>& cta) {
  for (int i = threadIdx.x; i < kBins; i += kThreads) cta.h->hist[i] = 0u;
}

struct Choice {
  uint32_t bin = 0, above = 0, count = 0;  // the bin holding rank `need`, keys above it, its size
  uint32_t total = 0;                      // keys in the histogram
  bool found = false;                      // total >= need
};

// Walks the histogram (summed over the cluster's first `ranks` CTAs through DSMEM) from the top
// bin down to the one holding the need-th largest key (need >= 1). Thread t owns kBins / kThreads
// bins from the top. Call after a barrier that completes every histogram read (a cluster barrier
// when ranks > 1); returns after a block barrier, so the histogram may be cleared next.
template <int kThreads>
__device__ Choice Choose(Cta<kThreads>& cta, uint32_t need, uint32_t ranks) {
  constexpr int kPer = kBins / kThreads;
  static_assert(kBins % kThreads == 0 && kPer >= 1, "whole bins per thread");
  const int low = kBins - (static_cast<int>(threadIdx.x) + 1) * kPer;  // my bins [low, low + kPer)
  uint32_t c[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) c[j] = cta.h->hist[low + j];
  for (uint32_t r = 0; r < ranks; ++r) {
    if (r == cta.rank) continue;
    const uint32_t* remote = MapToRank(cta.h->hist, r);
#pragma unroll
    for (int j = 0; j < kPer; ++j) c[j] += remote[low + j];
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
  return ch;
}

// The radix walk for the k best keys that `each(f)` presents (f(key, column) per key, each thread
// its own share; keys below kMinSelectableKey are never counted): the threshold the ordered write
// applies (radix::AllSelectable when there are at most k). Also clears the bitmaps (before its
// first barrier).
template <int kThreads, class Each>
__device__ Threshold RadixSelect(Cta<kThreads>& cta, uint32_t k, Each each) {
  for (uint32_t i = threadIdx.x; i < 2 * cta.bitmap_words; i += kThreads) cta.above[i] = 0u;
  Threshold t = radix::Start(k);
#pragma unroll 1
  for (int level = 0; level < radix::kLevels; ++level) {
    ClearHist(cta);
    __syncthreads();
    each([&](uint32_t key, int32_t) {
      if (radix::InLevel(key, level, t)) atomicAdd(&cta.h->hist[radix::Digit(key, level)], 1u);
    });
    __syncthreads();
    const Choice c = Choose(cta, t.need, 1);
    if (level == 0 && c.total <= k) return radix::AllSelectable();
    t = radix::Refine(t, level, c.bin, c.above);
    if (c.count == t.need) break;  // the bin is taken whole
  }
  return t;
}

// The buffer's smallest and largest key (total >= 1 entries), block-wide: each warp's extremes
// into the header's range (reset to [~0, 0] with the count), then a block barrier. kFromBits:
// the entries hold admitted f32 bits (AppendChunk), turned into keys in place here (each thread
// rewrites the entries it reads; the barrier publishes them).
template <int kThreads, bool kFromBits = false>
__device__ void KeyRange(Cta<kThreads>& cta, uint32_t total, uint32_t* lo, uint32_t* hi) {
  uint32_t mn = 0xffffffffu, mx = 0u;
  for (uint32_t i = threadIdx.x; i < total; i += kThreads) {
    uint32_t key = cta.entries[i].x;
    if (kFromBits) {  // the filter's entries hold f32 bits until here
      key = AdmittedKey(key);
      cta.entries[i].x = key;
    }
    mn = min(mn, key);
    mx = max(mx, key);
  }
#pragma unroll
  for (int d = kLanes / 2; d >= 1; d /= 2) {
    mn = min(mn, __shfl_xor_sync(kFullMask, mn, d));
    mx = max(mx, __shfl_xor_sync(kFullMask, mx, d));
  }
  if (LaneOf() == 0) {
    atomicMin(&cta.h->range[0], mn);
    atomicMax(&cta.h->range[1], mx);
  }
  __syncthreads();
  *lo = cta.h->range[0];
  *hi = cta.h->range[1];
}

// The radix walk over the buffer's `total` (> k) keys with digits fitted to their range [lo,
// hi]: the first level's shift is the smallest that puts the whole range in kBins bins, each
// later one takes the next 11 bits below, and once the threshold bin holds at most kLanes keys
// one warp ranks them exactly (threshold at shift 0). The buffered path only (every key
// selectable); the same thresholds as RadixSelect, usually after one level instead of three
// (docs/KERNELS.md "Top-k, threshold filter"). Also clears the bitmaps (before its first
// barrier).
// kDeferFew: instead of collecting and ranking the last few keys here, return the bin-level
// threshold with *few set (few_count still 0): MarkWithFew then collects them in its own pass
// over the buffer, which saves one pass and its barrier per row.
template <int kThreads, bool kDeferFew = false>
__device__ Threshold FittedSelect(Cta<kThreads>& cta, uint32_t k, uint32_t total, uint32_t lo,
                                  uint32_t hi, bool* few = nullptr) {
  for (uint32_t i = threadIdx.x; i < 2 * cta.bitmap_words; i += kThreads) cta.above[i] = 0u;
  // The smallest s with (hi >> s) - (lo >> s) < kBins is s0 or s0 + 1, s0 = bits(hi - lo) - 11
  // (below s0, (hi - lo) >> s alone reaches kBins); a loop from 0 took ~14 steps per row.
  int s = max(0, 32 - __clz(static_cast<int>(hi - lo)) - 11);
  while ((hi >> s) - (lo >> s) >= static_cast<uint32_t>(kBins)) ++s;
  uint32_t base = lo >> s;
  Threshold t = radix::Start(k);
  bool first = true;
  uint32_t in_prefix = 0;  // later levels count the keys with key >> in_shift == in_prefix
  int in_shift = 0;
#pragma unroll 1
  for (;;) {
    ClearHist(cta);
    if (threadIdx.x == 0) cta.h->few_count = 0u;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < total; i += kThreads) {
      const uint32_t key = cta.entries[i].x;
      if (first || (key >> in_shift) == in_prefix) atomicAdd(&cta.h->hist[(key >> s) - base], 1u);
    }
    __syncthreads();
    const Choice c = Choose(cta, t.need, 1);  // found: need <= the keys counted
    t.prefix = base + c.bin;
    t.shift = s;
    t.need -= c.above;
    if (c.count == t.need || s == 0) return t;  // the bin whole, or single keys
    if (c.count <= static_cast<uint32_t>(kLanes)) {
      if constexpr (kDeferFew) {
        *few = true;
        return t;
      } else {
        for (uint32_t i = threadIdx.x; i < total; i += kThreads) {
          const uint32_t key = cta.entries[i].x;
          if ((key >> s) == t.prefix) cta.h->few[atomicAdd(&cta.h->few_count, 1u)] = key;
        }
        __syncthreads();
        if (WarpOf() == 0) {
          const uint32_t n = cta.h->few_count;
          const int lane = LaneOf();
          const uint32_t key = static_cast<uint32_t>(lane) < n ? cta.h->few[lane] : 0u;
          uint32_t greater = 0, equal = 0;
          for (uint32_t j = 0; j < n; ++j) {
            const uint32_t other = __shfl_sync(kFullMask, key, static_cast<int>(j));
            greater += other > key ? 1u : 0u;
            equal += other == key ? 1u : 0u;
          }
          // The need-th largest: lanes holding an equal key write the same answer.
          if (static_cast<uint32_t>(lane) < n && greater < t.need && t.need <= greater + equal) {
            cta.h->few_choice[0] = key;
            cta.h->few_choice[1] = t.need - greater;
          }
        }
        __syncthreads();
        t.prefix = cta.h->few_choice[0];
        t.shift = 0;
        t.need = cta.h->few_choice[1];
        return t;
      }
    }
    first = false;
    in_prefix = t.prefix;
    in_shift = s;
    const int next = s > 11 ? s - 11 : 0;
    base = t.prefix << (s - next);
    s = next;
  }
}

// Marks the keys `each` presents that t chooses outright (above) or may choose (at, when the
// threshold still needs ties), by window-relative column. Ends with a block barrier.
template <int kThreads, class Each>
__device__ void MarkChosen(Cta<kThreads>& cta, const Threshold& t, int64_t begin, Each each) {
  each([&](uint32_t key, int32_t col) {
    const bool is_above = radix::AboveThreshold(t, key);
    const bool is_at =
        !is_above && t.need > 0 && key >= radix::kMinSelectableKey && radix::AtThreshold(t, key);
    if (is_above || is_at) {
      const uint32_t rel = static_cast<uint32_t>(col - begin);
      atomicOr((is_above ? cta.above : cta.at) + (rel >> 5), 1u << (rel & 31u));
    }
  });
  __syncthreads();
}

// MarkChosen over the buffer's `total` keys for a bin-level threshold t (shift s > 0) whose bin
// holds at most kLanes keys (FittedSelect<kDeferFew>): keys above the bin are marked, the bin's
// keys collected with their columns; then one warp ranks those (each lane counts the keys greater
// than and equal to its own), marks the ones above the need-th largest and, at it, the ties, and
// returns the shift-0 threshold WriteRow applies: the same marks and threshold as FittedSelect's
// own few path followed by MarkChosen. Ends with a block barrier.
template <int kThreads>
__device__ Threshold MarkWithFew(Cta<kThreads>& cta, Threshold t, int64_t begin, uint32_t total) {
  ForEachBuffered<kThreads>(total, [&](uint32_t i) {
    const uint2 e = cta.entries[i];
    const uint32_t bin = e.x >> t.shift;
    if (bin > t.prefix) {
      const uint32_t rel = static_cast<uint32_t>(static_cast<int32_t>(e.y) - begin);
      atomicOr(cta.above + (rel >> 5), 1u << (rel & 31u));
    } else if (bin == t.prefix) {
      const uint32_t j = atomicAdd(&cta.h->few_count, 1u);  // < kLanes: the bin's count
      cta.h->few[j] = e.x;
      cta.h->few_col[j] = e.y;
    }
  });
  __syncthreads();
  if (WarpOf() == 0) {
    const uint32_t n = cta.h->few_count;
    const int lane = LaneOf();
    const bool mine = static_cast<uint32_t>(lane) < n;
    const uint32_t key = mine ? cta.h->few[lane] : 0u;
    uint32_t greater = 0, equal = 0;
    for (uint32_t j = 0; j < n; ++j) {
      const uint32_t other = __shfl_sync(kFullMask, key, static_cast<int>(j));
      greater += other > key ? 1u : 0u;
      equal += other == key ? 1u : 0u;
    }
    // The need-th largest: lanes holding an equal key write the same answer.
    const bool is_threshold = mine && greater < t.need && t.need <= greater + equal;
    if (is_threshold) {
      cta.h->few_choice[0] = key;
      cta.h->few_choice[1] = t.need - greater;
    }
    // Keys above the need-th largest are the ones with fewer than need keys greater than them.
    const bool is_above = mine && greater + equal < t.need;
    if (is_above || is_threshold) {
      const uint32_t rel =
          static_cast<uint32_t>(static_cast<int32_t>(cta.h->few_col[lane]) - begin);
      atomicOr((is_above ? cta.above : cta.at) + (rel >> 5), 1u << (rel & 31u));
    }
  }
  __syncthreads();
  t.prefix = cta.h->few_choice[0];
  t.shift = 0;
  t.need = cta.h->few_choice[1];
  return t;
}

// The general walk of WriteRow: each thread over its bitmap words [w0, w1), with g / e chosen-above
// / at columns before them; ties at the threshold past t.need are skipped.
template <int kThreads>
__device__ __forceinline__ void WriteMarked(const Cta<kThreads>& cta, const RowArgs& a,
                                            const RowDest& out, const uint32_t* src,
                                            const RowSpan& w, const Threshold& t, uint32_t w0,
                                            uint32_t w1, uint32_t g, uint32_t e) {
  for (uint32_t x = w0; x < w1; ++x) {
    const uint32_t above = cta.above[x], at = cta.at[x];
    uint32_t m = above | at;
    while (m != 0u) {
      const int bit = __ffs(static_cast<int>(m)) - 1;
      m &= m - 1u;
      const bool is_above = (above >> bit) & 1u;
      if (radix::IsChosen(t, is_above, !is_above, e)) {
        const uint32_t pos = radix::OutputPosition(t, g, e);
        const int32_t col = static_cast<int32_t>(w.begin + 32 * static_cast<int64_t>(x) + bit);
        if (pos < a.k) out.Write(pos, col, out.values != nullptr ? __ldg(src + col) : 0u);
      }
      g += is_above ? 1u : 0u;
      e += is_above ? 0u : 1u;
    }
  }
}

// Writes row `row`'s output from the bitmaps: chosen columns ascending (radix::OutputPosition),
// then -1 / -inf padding to k. Uses the buffer as scratch (k indices): call after the marks.
template <int kThreads>
__device__ void WriteRow(Cta<kThreads>& cta, const RowArgs& a, int64_t row, const RowSpan& w,
                         const Threshold& t) {
  const uint32_t words = (w.len + 31u) / 32u;
  const uint32_t per = (words + kThreads - 1) / kThreads;
  const uint32_t w0 = min(words, threadIdx.x * per);
  const uint32_t w1 = min(words, w0 + per);
  // Four words a thread (rows to 32K columns at 256 threads, 64K at 512) come in one 16-byte
  // load per bitmap, kept in registers for both passes: single words at a lane stride of four
  // met 4-way bank conflicts (docs/KERNELS.md "Top-k filter: which shared and global accesses
  // conflict"). w0 is then a multiple of 4 and, with bitmap_words one too, so is `at`'s offset.
  const bool vec = per == 4 && (cta.bitmap_words & 3u) == 0u;  // the same in every thread
  uint32_t av[4] = {0u, 0u, 0u, 0u}, tv[4] = {0u, 0u, 0u, 0u};
  uint32_t cnt[2] = {0u, 0u};
  if (vec) {
    if (w0 < w1) {  // w0 + 4 <= bitmap_words: in bounds; words at or past w1 are dropped
      const uint4 va = *reinterpret_cast<const uint4*>(cta.above + w0);
      const uint4 vt = *reinterpret_cast<const uint4*>(cta.at + w0);
      av[0] = va.x;
      av[1] = va.y;
      av[2] = va.z;
      av[3] = va.w;
      tv[0] = vt.x;
      tv[1] = vt.y;
      tv[2] = vt.z;
      tv[3] = vt.w;
#pragma unroll
      for (int i = 1; i < 4; ++i) {
        if (w0 + i >= w1) av[i] = tv[i] = 0u;
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      cnt[0] += static_cast<uint32_t>(__popc(av[i]));
      cnt[1] += static_cast<uint32_t>(__popc(tv[i]));
    }
  } else {
    for (uint32_t x = w0; x < w1; ++x) {
      cnt[0] += static_cast<uint32_t>(__popc(cta.above[x]));
      cnt[1] += static_cast<uint32_t>(__popc(cta.at[x]));
    }
  }
  uint32_t excl[2], total[2];
  BlockExclusiveScan<kThreads, 2>(cnt, excl, total, cta.slots.Next());
  RowDest out = RowDest::Of(a, row);
  if (a.row_start_base) out.origin = static_cast<int32_t>(w.begin);
  const uint32_t* src = a.logits + row * a.logits_ld;
  uint32_t g = excl[0], e = excl[1];
  if (total[1] <= t.need && out.table_row == nullptr) {
    // Every marked column is chosen (no tie is left out: the usual case, one key at the
    // threshold), so a column's position is the number of marked columns before it: one count
    // per set bit, no above/at split, and the row's pointers computed once (WriteMarked's walk
    // costs ~45 instructions per set bit, this ~12: docs/KERNELS.md "Top-k, threshold filter").
    int32_t* const indices = out.indices;
    float* const values = out.values;
    uint32_t pos = g + e;
    if (values == nullptr) {  // two loops: the indices-only one keeps its pointer in registers
      // Staged: each thread puts its indices at their positions in shared memory (the buffer,
      // which nothing reads past the marks' barrier), then each warp stores its own positions,
      // a contiguous range, 32 consecutive indices a store. Stored directly, a warp's lanes
      // wrote ~k / threads positions apart, one 32-byte sector per index (at 4096 × 32768
      // causal, by a model of the addresses, ncu's excess global sectors are these stores;
      // docs/KERNELS.md "Top-k, threshold filter").
      uint32_t* const stage = reinterpret_cast<uint32_t*>(cta.entries);
      const uint32_t first = pos;
      for (uint32_t x = w0; x < w1; ++x) {
        uint32_t m;
        if (vec) {  // the words in registers, first one first
          m = av[0] | tv[0];
          av[0] = av[1];
          av[1] = av[2];
          av[2] = av[3];
          tv[0] = tv[1];
          tv[1] = tv[2];
          tv[2] = tv[3];
        } else {
          m = cta.above[x] | cta.at[x];
        }
        const int32_t base = static_cast<int32_t>(w.begin + 32 * static_cast<int64_t>(x)) -
                             out.origin;  // the word's column 0, as written
        while (m != 0u) {
          const int bit = __ffs(static_cast<int>(m)) - 1;
          m &= m - 1u;
          if (pos < a.k) stage[pos] = static_cast<uint32_t>(base + bit);
          ++pos;
        }
      }
      __syncwarp();
      // Positions grow with the thread: the warp's are [lane 0's first, lane 31's end).
      const uint32_t lo = __shfl_sync(kFullMask, first, 0);
      const uint32_t hi = min(__shfl_sync(kFullMask, pos, kLanes - 1), a.k);
      // Through a shuffle (the same value in every lane), so ptxas cannot re-derive it as
      // `indices + row * ld` inside the loop (64-bit multiplies per store); st.global takes it.
      const uint64_t dst = __shfl_sync(
          kFullMask, static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(indices)), 0);
      for (uint32_t p = lo + static_cast<uint32_t>(LaneOf()); p < hi; p += kLanes) {
        asm volatile("st.global.b32 [%0], %1;" ::"l"(dst + 4ull * p), "r"(stage[p]) : "memory");
      }
    } else {
      for (uint32_t x = w0; x < w1; ++x) {
        uint32_t m = cta.above[x] | cta.at[x];
        const int64_t first = w.begin + 32 * static_cast<int64_t>(x);  // the word's column 0
        const int32_t base = static_cast<int32_t>(first) - out.origin;
        while (m != 0u) {
          const int bit = __ffs(static_cast<int>(m)) - 1;
          m &= m - 1u;
          if (pos < a.k) {
            indices[pos] = base + bit;
            values[pos] = vendor::BitsToFloat(__ldg(src + first + bit));
          }
          ++pos;
        }
      }
    }
  } else {
    WriteMarked(cta, a, out, src, w, t, w0, w1, g, e);
  }
  const uint32_t chosen = total[0] + min(total[1], t.need);
  for (uint32_t j = min(chosen, a.k) + threadIdx.x; j < a.k; j += kThreads) out.PadOne(j);
}

// ---- One row.

// Selects and writes one non-empty window. Every CTA of the cluster calls it; non-leaders return
// once their candidates are in the leader's buffer. Prefetches this CTA's segment of `next_row`
// (when < rows) into L2 once its own reads are done.
template <int kThreads>
__device__ void SelectRow(Cta<kThreads>& cta, const FilterArgs& a, int64_t row, const RowSpan& w,
                          int64_t next_row) {
  constexpr uint32_t kStep = kThreads * kV;
  constexpr uint32_t kCapacity = FilterCapacity(kThreads);
  const bool clustered = cta.cluster > 1;
  const Segment seg = MakeSegment(a, row, w, cta.rank, cta.cluster);
  uint32_t spec_rank = 0;
  if (a.speculate && w.len > kCapacity) {
    const uint32_t misalign = static_cast<uint32_t>(w.begin - seg.plan.first_col);
    spec_rank =
        FloorRank(a.k, SampleColumns(w.len, misalign, cta.cluster, /*chunk_groups=*/kThreads),
                  w.len, a.floor_sigmas);
  }
  uint4 cur[kV];
  uint32_t g = seg.plan.group_lo;
  LoadChunk<kThreads>(seg, g, cur);
  float floor = vendor::BitsToFloat(kMinSelectableBits);
  bool speculated = false;
  if (spec_rank > 0) {  // cluster-uniform
    // The sample: each thread's first group (the first kThreads groups of each segment).
    ClearHist(cta);
    __syncthreads();
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t key = radix::KeyOfBits(Elem(cur[0], q));
      if (key >= radix::kMinSelectableKey) atomicAdd(&cta.h->hist[radix::Digit(key, 0)], 1u);
    }
    if (clustered) {
      ClusterSync();
    } else {
      __syncthreads();
    }
    const Choice c = Choose(cta, spec_rank, cta.cluster);
    if (c.found) {
      speculated = true;
      uint32_t floor_key = c.bin << radix::DigitShift(0);
      if (kThreads == 256 && a.fine_floor && !clustered) {
        // The sample's keys in that bin by their level-1 digit (Choose ended with a barrier
        // after its last histogram read): the floor becomes the lower edge of the level-1 bin
        // holding the same rank, 2^-11 of the level-0 bin's width.
        ClearHist(cta);
        __syncthreads();
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t key = radix::KeyOfBits(Elem(cur[0], q));
          if (key >= radix::kMinSelectableKey && radix::Digit(key, 0) == c.bin) {
            atomicAdd(&cta.h->hist[radix::Digit(key, 1)], 1u);
          }
        }
        __syncthreads();
        const Choice f = Choose(cta, spec_rank - c.above, 1);  // found: the rank is in the bin
        floor_key |= f.bin << radix::DigitShift(1);
      }
      floor = vendor::BitsToFloat(AdmitBits(floor_key));
    }
  }
  AppendChunk<kThreads>(cta, seg, g, cur, floor);
#pragma unroll 1
  for (g += kStep; g < seg.plan.group_hi; g += kStep) {
    LoadChunk<kThreads>(seg, g, cur);
#if defined(__CUDA_ARCH__)
    // The next chunk into L2 while this one is counted: one lane in eight asks for its 128-byte
    // line, only for chunks wholly inside the window and the segment (docs/KERNELS.md "Top-k,
    // threshold filter": −2 % at 4096 × 32768; two chunks ahead lost 6 % at 65536 columns).
    if (g + 2 * kStep <= min(seg.plan.full_hi, seg.plan.group_hi) && (LaneOf() & 7) == 0) {
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        asm volatile(
            "prefetch.global.L2 [%0];" ::"l"(seg.groups + g + kStep + v * kThreads + threadIdx.x));
      }
    }
#endif
    AppendChunk<kThreads>(cta, seg, g, cur, floor);
  }
  __syncthreads();  // the count and the entries are complete
  if (a.prefetch && threadIdx.x == 0 && next_row < a.rows) {
    PrefetchSegment(
        MakeSegment(a, next_row, LoadWindowAs<RowSpan>(a, next_row), cta.rank, cta.cluster));
  }
  const uint32_t mine = cta.h->count;
  uint32_t offset = 0, total = mine;
  if (clustered) {
    ClusterSync();  // every CTA's count is final
    total = 0;
    for (uint32_t r = 0; r < cta.cluster; ++r) {
      const uint32_t n = r == cta.rank ? mine : *MapToRank(&cta.h->count, r);
      offset += r < cta.rank ? n : 0u;
      total += n;  // <= the window's length: no wrap
    }
  }
  // The buffer path needs every candidate kept and, under a speculative floor, at least k of them.
  const bool buffered = total <= kCapacity && (!speculated || total >= a.k);
  if (clustered) {
    if (buffered && cta.rank != 0) {
      uint2* dst = MapToRank(cta.entries, 0) + offset;
      for (uint32_t i = threadIdx.x; i < mine; i += kThreads) dst[i] = cta.entries[i];
    }
    ClusterSync();  // the leader's buffer is complete; nobody reads another CTA past here
    if (cta.rank != 0) return;
  }
  Threshold t;
  if (buffered) {
    if (total > a.k) {
      uint32_t lo, hi;
      KeyRange<kThreads, /*kFromBits=*/true>(cta, total, &lo, &hi);  // the entries become keys
      bool few = false;
      t = FittedSelect<kThreads, /*kDeferFew=*/true>(cta, a.k, total, lo, hi, &few);
      if (few) {
        t = MarkWithFew(cta, t, w.begin, total);
      } else {
        MarkChosen(cta, t, w.begin, [&](auto&& f) {
          ForEachBuffered<kThreads>(total, [&](uint32_t i) {
            const uint2 e = cta.entries[i];
            f(e.x, static_cast<int32_t>(e.y));
          });
        });
      }
    } else {
      for (uint32_t i = threadIdx.x; i < 2 * cta.bitmap_words; i += kThreads) cta.above[i] = 0u;
      __syncthreads();
      t = radix::AllSelectable();
      MarkChosen(cta, t, w.begin, [&](auto&& f) {  // the entries still hold f32 bits
        ForEachBuffered<kThreads>(total, [&](uint32_t i) {
          const uint2 e = cta.entries[i];
          f(AdmittedKey(e.x), static_cast<int32_t>(e.y));
        });
      });
    }
  } else {  // exact, from the window itself
    const Segment whole = MakeSegment(a, row, w, 0, 1);
    auto each = [&](auto&& f) { ForEachInSegment<kThreads>(whole, f); };
    t = RadixSelect(cta, a.k, each);
    MarkChosen(cta, t, w.begin, each);
  }
  WriteRow(cta, a, row, w, t);
}

// Four 256-thread CTAs per SM (64 registers, ~50 KB of shared memory at N = 32K with the smaller
// buffer), two of 512 (~80 KB at N = 32K: one CTA's selects overlap the other's loads), or one of
// 1024 for rows that fit one wave.
template <int kThreads>
constexpr int MinBlocksPerSm() {
  return kThreads >= 1024 ? 1 : (kThreads >= 512 ? 2 : 4);
}

template <int kThreads>
__global__ void ATTND_LAUNCH_BOUNDS(kThreads, MinBlocksPerSm<kThreads>(), 0)
    TopkFilterKernel(const FilterArgs a, const uint32_t bitmap_words) {
  extern __shared__ uint4 smem[];
  Cta<kThreads> cta;
  char* base = reinterpret_cast<char*>(smem);
  cta.h = reinterpret_cast<Header<kThreads>*>(base);
  cta.entries = reinterpret_cast<uint2*>(base + HeaderBytes<kThreads>());
  cta.above = reinterpret_cast<uint32_t*>(cta.entries + FilterCapacity(kThreads));
  cta.at = cta.above + bitmap_words;
  cta.bitmap_words = bitmap_words;
  cta.slots = ScanSlots{cta.h->scan, Header<kThreads>::kSlotWords, 0};
  cta.cluster = a.cluster;
  cta.rank = blockIdx.x % a.cluster;
  if (threadIdx.x == 0) {
    cta.h->count = 0u;
    cta.h->range[0] = 0xffffffffu;
    cta.h->range[1] = 0u;
  }
  __syncthreads();
  const int64_t clusters = gridDim.x / a.cluster;
  int64_t row = blockIdx.x / a.cluster;
  if (a.prefetch && threadIdx.x == 0 && row < a.rows) {
    PrefetchSegment(MakeSegment(a, row, LoadWindowAs<RowSpan>(a, row), cta.rank, cta.cluster));
  }
  for (; row < a.rows; row += clusters) {
    const RowSpan w = LoadWindowAs<RowSpan>(a, row);  // the same in every CTA of the cluster
    if (w.len > 0) {
      SelectRow<kThreads>(cta, a, row, w, row + clusters);
    } else if (cta.rank == 0) {
      const RowDest out = RowDest::Of(a, row);
      for (uint32_t j = threadIdx.x; j < a.k; j += kThreads) out.PadOne(j);
    }
    // Every reader of this row's count and range is past the cluster barriers (or the block's).
    if (threadIdx.x == 0) {
      cta.h->count = 0u;
      cta.h->range[0] = 0xffffffffu;
      cta.h->range[1] = 0u;
    }
    __syncthreads();
  }
}

// ---- Selecting from an indexer's candidates (docs/KERNELS.md "Indexer → top-k candidates").

struct CandidateArgs : RowArgs {
  const uint2* entries = nullptr;  // row r's (key, column) pairs at entries + r·entries_ld
  int64_t entries_ld = 0;
  const uint32_t* counts = nullptr;
  const uint32_t* floors = nullptr;
};

// Selects and writes one non-empty window from its candidates: those at or above the row's
// floor (and inside the window: the window is read again here, so a candidate outside it is
// ignored, never marked) go to the buffer and the select runs there, as the filter's buffered
// path does; when they overflow it, the radix walk runs on the candidate list itself (global
// memory, one pass per level). Every entry of the window's top k is such a candidate (the
// indexer's floors: docs/KERNELS.md), so the output is the filter's.
template <int kThreads>
__device__ void SelectCandidateRow(Cta<kThreads>& cta, const CandidateArgs& a, int64_t row,
                                   const RowSpan& w) {
  constexpr uint32_t kCapacity = FilterCapacity(kThreads);
  const uint2* src = a.entries + row * a.entries_ld;
  const uint32_t ld = static_cast<uint32_t>(a.entries_ld);
  const uint32_t n = min(a.counts[row], ld);
  const uint32_t floor = max(a.floors[row], radix::kMinSelectableKey);
  const uint32_t begin = static_cast<uint32_t>(w.begin), len = w.len;
  auto admitted = [&](const uint2& e) {
    return e.x >= floor && e.y - begin < len;  // unsigned: columns below begin wrap past len
  };
  // The buffer: candidates appended unordered (one shared atomic per warp and pass). Each
  // thread has kLoads pairs in flight before it looks at any (the loop is otherwise bound by
  // the load latency: docs/KERNELS.md "Indexer → top-k candidates").
  constexpr uint32_t kLoads = 8;
  for (uint32_t base = 0; base < n; base += kThreads * kLoads) {
    uint2 e[kLoads];
#pragma unroll
    for (uint32_t j = 0; j < kLoads; ++j) {
      const uint32_t i = base + j * kThreads + threadIdx.x;
      e[j] = i < n ? src[i] : make_uint2(0u, 0u);
    }
#pragma unroll
    for (uint32_t j = 0; j < kLoads; ++j) {
      const bool take = base + j * kThreads + threadIdx.x < n && admitted(e[j]);
      const uint32_t ballot = __ballot_sync(kFullMask, take);
      if (ballot == 0u) continue;  // warp-uniform
      uint32_t pos = 0;
      if (LaneOf() == 0) pos = atomicAdd(&cta.h->count, static_cast<uint32_t>(__popc(ballot)));
      pos = __shfl_sync(kFullMask, pos, 0) +
            static_cast<uint32_t>(__popc(ballot & ((1u << LaneOf()) - 1u)));
      if (take && pos < kCapacity) cta.entries[pos] = e[j];
    }
  }
  __syncthreads();  // the count and the entries are complete
  const uint32_t total = cta.h->count;
  Threshold t;
  // The same buffered path as SelectRow's, written out again on purpose: folding both into one
  // helper renumbers the filter kernels' PTX registers, which has moved this kernel's SASS and
  // time by ~5 % before (docs/KERNELS.md "Top-k, threshold filter"), so it waits for a device.
  if (total <= kCapacity) {
    auto each = [&](auto&& f) {
      for (uint32_t i = threadIdx.x; i < total; i += kThreads) {
        const uint2 e = cta.entries[i];
        f(e.x, static_cast<int32_t>(e.y));
      }
    };
    if (total > a.k) {
      uint32_t lo, hi;
      KeyRange(cta, total, &lo, &hi);
      t = FittedSelect(cta, a.k, total, lo, hi);
    } else {
      for (uint32_t i = threadIdx.x; i < 2 * cta.bitmap_words; i += kThreads) cta.above[i] = 0u;
      __syncthreads();
      t = radix::AllSelectable();
    }
    MarkChosen(cta, t, w.begin, each);
  } else {  // exact, over the candidate list
    auto each = [&](auto&& f) {
      for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
        const uint2 e = src[i];
        if (admitted(e)) f(e.x, static_cast<int32_t>(e.y));
      }
    };
    t = RadixSelect(cta, a.k, each);
    MarkChosen(cta, t, w.begin, each);
  }
  WriteRow(cta, a, row, w, t);
}

template <int kThreads>
__global__ void ATTND_LAUNCH_BOUNDS(kThreads, MinBlocksPerSm<kThreads>(), 0)
    TopkCandidatesKernel(const CandidateArgs a, const uint32_t bitmap_words) {
  extern __shared__ uint4 smem[];
  Cta<kThreads> cta;
  char* base = reinterpret_cast<char*>(smem);
  cta.h = reinterpret_cast<Header<kThreads>*>(base);
  cta.entries = reinterpret_cast<uint2*>(base + HeaderBytes<kThreads>());
  cta.above = reinterpret_cast<uint32_t*>(cta.entries + FilterCapacity(kThreads));
  cta.at = cta.above + bitmap_words;
  cta.bitmap_words = bitmap_words;
  cta.slots = ScanSlots{cta.h->scan, Header<kThreads>::kSlotWords, 0};
  cta.cluster = 1;
  cta.rank = 0;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    if (threadIdx.x == 0) {
      cta.h->count = 0u;
      cta.h->range[0] = 0xffffffffu;
      cta.h->range[1] = 0u;
    }
    __syncthreads();  // also: every reader of the previous row's state is done
    const RowSpan w = LoadWindowAs<RowSpan>(a, row);
    if (w.len > 0) {
      SelectCandidateRow<kThreads>(cta, a, row, w);
    } else {
      const RowDest out = RowDest::Of(a, row);
      for (uint32_t j = threadIdx.x; j < a.k; j += kThreads) out.PadOne(j);
    }
    __syncthreads();
  }
}

// ---- Host side.

template <int kThreads>
const void* KernelOf() {
  return reinterpret_cast<const void*>(&TopkFilterKernel<kThreads>);
}

// Resident clusters of `cluster` CTAs of the kernel (0 when none fit); cached.
int MaxActiveClusters(const void* kernel, int threads, int smem, int cluster) {
  static std::mutex mu;
  static auto* cache = new std::map<std::tuple<const void*, int, int, int>, int>();
  int device = 0;
  if (vendor::GetDevice(&device) != vendor::kSuccess) return 0;
  const auto key = std::make_tuple(kernel, device, cluster, smem);
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

// The device's facts and how many CTAs of `kernel` (`threads` threads, `smem` bytes of dynamic
// shared memory, which this also allows) fit it at once; an error when none does.
vendor::Error Resident(const void* kernel, int threads, int smem, vendor::DeviceFacts* d,
                       int64_t* resident) {
  if (!vendor::CurrentDeviceFacts(d)) return cudaErrorNoDevice;
  if (smem > d->smem_optin) return cudaErrorInvalidConfiguration;
  const int per_sm = vendor::BlocksPerSm(kernel, threads, smem);
  if (per_sm == 0) return cudaErrorInvalidConfiguration;
  *resident = static_cast<int64_t>(per_sm) * d->sm_count;
  return vendor::kSuccess;
}

template <int kThreads>
vendor::Error Launch(const FilterArgs& base, const FilterConfig& config, vendor::Stream stream) {
  const void* kernel = KernelOf<kThreads>();
  const uint32_t words = FilterBitmapWords(base.cols);
  const int smem = static_cast<int>(
      FilterSmemBytes(HeaderBytes<kThreads>(), base.cols, FilterCapacity(kThreads)));
  vendor::DeviceFacts d;
  int64_t resident = 0;
  if (const vendor::Error e = Resident(kernel, kThreads, smem, &d, &resident);
      e != vendor::kSuccess) {
    return e;
  }
  int cluster = config.cluster;
  if (cluster == 0) {
    cluster =
        d.cc_major >= 9 ? ClusterSizeFor(base.rows, base.cols, d.sm_count, kMaxDefaultCluster) : 1;
  }
  if (cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8) return cudaErrorInvalidValue;
  if (cluster > 1 && d.cc_major < 9) return cudaErrorNotSupported;
  FilterArgs a = base;
  a.cluster = static_cast<uint32_t>(cluster);
  a.speculate = config.speculate;
  a.prefetch = config.prefetch;
  a.fine_floor = config.fine_floor;
  if (!(config.floor_sigmas == -1.0f ||
        (config.floor_sigmas >= 0.0f && config.floor_sigmas <= 16.0f))) {
    return cudaErrorInvalidValue;
  }
  // The refined floor of the 256-thread CTAs sits at the sample's rank itself: 4 sigma took
  // 4096 x 32768 causal from 287.5 to 266.0 µs (H100, same logits); the wider CTAs' level-0
  // floor already admits a wide margin, and more cost them up to 6 % (docs/KERNELS.md "Top-k,
  // threshold filter").
  const bool refined = kThreads == 256 && a.fine_floor && cluster == 1;  // as SelectRow's
  a.floor_sigmas = config.floor_sigmas >= 0.0f ? config.floor_sigmas : (refined ? 4.0f : 3.0f);
  if (cluster == 1) {
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(a.rows, resident));
    TopkFilterKernel<kThreads><<<grid, kThreads, smem, stream>>>(a, words);
    return vendor::GetLastError();
  }
  const int clusters = MaxActiveClusters(kernel, kThreads, smem, cluster);
  if (clusters == 0) return cudaErrorInvalidConfiguration;
  cudaLaunchConfig_t launch = {};
  launch.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>(a.rows, clusters) * cluster), 1, 1);
  launch.blockDim = dim3(kThreads, 1, 1);
  launch.dynamicSmemBytes = static_cast<size_t>(smem);
  launch.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  launch.attrs = attr;
  launch.numAttrs = 1;
  return cudaLaunchKernelEx(&launch, TopkFilterKernel<kThreads>, a, words);
}

// Rows past one wave take four 256-thread CTAs per SM when k leaves the smaller buffer room for
// the floor's margin and four fit an SM at this column count (measured: 4096 × 32768 causal 304 →
// 262 µs; at 65536 columns, three per SM, 456 → 465, so not there).
bool UseSmallCtas(const FilterArgs& a) {
  if (2 * a.k + 512 > kFilterCapacitySmall) return false;
  const int smem =
      static_cast<int>(FilterSmemBytes(HeaderBytes<256>(), a.cols, FilterCapacity(256)));
  return vendor::BlocksPerSm(KernelOf<256>(), 256, smem) >= MinBlocksPerSm<256>();
}

}  // namespace

bool FilterTakesShape(int64_t rows, int64_t cols) {
  vendor::DeviceFacts d;
  return vendor::CurrentDeviceFacts(&d) &&
         (rows <= d.sm_count || cols > static_cast<int64_t>(kFilterCapacity));
}

bool SupportsFilter(const Params& p, std::string* why) {
  vendor::DeviceFacts d;
  if (!vendor::CurrentDeviceFacts(&d)) {
    if (why != nullptr) *why = "no GPU device";
    return false;
  }
  // More rows than one wave with rows no longer than the buffer (every logit admitted, no
  // sampled floor) go to cuda_stream: measured there, the filter was not (docs/KERNELS.md
  // "Top-k, threshold filter"). Longer rows, past one wave, measured faster here.
  const int64_t rows = p.logits.present() ? p.logits.dim(0) : 0;
  const int64_t cols = p.logits.present() ? p.logits.dim(1) : 0;
  if (!FilterTakesShape(rows, cols)) {
    if (why != nullptr) {
      *why = std::to_string(rows) + " rows of " + std::to_string(cols) +
             " columns: more rows than one wave of " + std::to_string(d.sm_count) +
             " SMs and rows no longer than the " + std::to_string(kFilterCapacity) +
             "-entry buffer (cuda_stream runs those)";
    }
    return false;
  }
  const int64_t smem = FilterSmemBytes(std::max(HeaderBytes<512>(), HeaderBytes<1024>()), cols);
  if (smem > d.smem_optin) {
    if (why != nullptr) {
      *why = "needs " + std::to_string(smem) + " bytes of shared memory per block for " +
             std::to_string(cols) + " columns, the device allows " + std::to_string(d.smem_optin);
    }
    return false;
  }
  return true;
}

vendor::Error LaunchTopkFilterWith(const Params& p, const FilterConfig& config,
                                   vendor::Stream stream) {
  FilterArgs a;
  static_cast<RowArgs&>(a) = MakeRowArgs(p);
  if (a.rows == 0) return vendor::kSuccess;  // an empty grid is a launch error
  int threads = config.threads;
  if (threads == 0) {
    // Rows that fit one wave: the wider CTA shortens each row's chain of steps. More rows: four
    // 256-thread CTAs per SM overlap more rows than two of 512, when k leaves the smaller buffer
    // room for the floor's margin (docs/KERNELS.md "Top-k, threshold filter").
    vendor::DeviceFacts d;
    const bool one_wave = vendor::CurrentDeviceFacts(&d) && a.rows <= d.sm_count;
    threads = one_wave ? 1024 : (UseSmallCtas(a) ? 256 : 512);
  }
  switch (threads) {
    case 256: return Launch<256>(a, config, stream);
    case 512: return Launch<512>(a, config, stream);
    case 1024: return Launch<1024>(a, config, stream);
    default: return cudaErrorInvalidValue;
  }
}

bool SupportsTopkFromCandidates(const Params& p, std::string* why) {
  if (p.values.present()) {
    if (why != nullptr) *why = "values are not kept with the candidates";
    return false;
  }
  vendor::DeviceFacts d;
  if (!vendor::CurrentDeviceFacts(&d)) {
    if (why != nullptr) *why = "no GPU device";
    return false;
  }
  const int64_t cols = p.logits.present() ? p.logits.dim(1) : 0;
  const int64_t smem = FilterSmemBytes(HeaderBytes<512>(), cols, FilterCapacity(512));
  if (smem > d.smem_optin) {
    if (why != nullptr) {
      *why = "needs " + std::to_string(smem) + " bytes of shared memory per block for " +
             std::to_string(cols) + " columns, the device allows " + std::to_string(d.smem_optin);
    }
    return false;
  }
  return true;
}

namespace {

template <int kThreads>
vendor::Error LaunchCandidates(const CandidateArgs& a, vendor::Stream stream) {
  const void* kernel = reinterpret_cast<const void*>(&TopkCandidatesKernel<kThreads>);
  const uint32_t words = FilterBitmapWords(a.cols);
  const int smem =
      static_cast<int>(FilterSmemBytes(HeaderBytes<kThreads>(), a.cols, FilterCapacity(kThreads)));
  vendor::DeviceFacts d;
  int64_t resident = 0;
  if (const vendor::Error e = Resident(kernel, kThreads, smem, &d, &resident);
      e != vendor::kSuccess) {
    return e;
  }
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(a.rows, resident));
  TopkCandidatesKernel<kThreads><<<grid, kThreads, smem, stream>>>(a, words);
  return vendor::GetLastError();
}

}  // namespace

vendor::Error LaunchTopkFromCandidates(const Params& p, const TopkCandidateRows& c,
                                       vendor::Stream stream) {
  CandidateArgs a;
  static_cast<RowArgs&>(a) = MakeRowArgs(p);
  if (a.rows == 0) return vendor::kSuccess;
  // ld < 2^31: the select's 32-bit indices past a row's count never wrap.
  if (a.values != nullptr || c.ld < a.cols || c.ld > 0x7fffffffLL) return cudaErrorInvalidValue;
  a.entries = reinterpret_cast<const uint2*>(c.entries);
  a.entries_ld = c.ld;
  a.counts = c.counts;
  a.floors = c.floors;
  int threads = c.threads;
  if (threads == 0) {
    // As the filter past one wave: four 256-thread CTAs per SM when k leaves their smaller
    // buffer room for the floor's bin (docs/KERNELS.md "Top-k, threshold filter").
    const int smem =
        static_cast<int>(FilterSmemBytes(HeaderBytes<256>(), a.cols, FilterCapacity(256)));
    const bool small =
        2 * a.k + 512 <= kFilterCapacitySmall &&
        vendor::BlocksPerSm(reinterpret_cast<const void*>(&TopkCandidatesKernel<256>), 256, smem) >=
            MinBlocksPerSm<256>();
    threads = small ? 256 : 512;
  }
  switch (threads) {
    case 256: return LaunchCandidates<256>(a, stream);
    case 512: return LaunchCandidates<512>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

vendor::Error LaunchTopkFilter(const Params& p, vendor::Stream stream) {
  return LaunchTopkFilterWith(p, FilterConfig{}, stream);
}

}  // namespace attnd::kernels::topk::gpu

#endif  // defined(ATTND_GPU_CUDA)
