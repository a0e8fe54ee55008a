// MLA decode's length-aware schedule (kernels/mla_decode/schedule_plan.h; docs/KERNELS.md "A
// schedule from the lengths"), on the host through BuildSchedule, the reference of the schedule
// kernel (gpu/schedule.cu): every tile of every request runs in exactly one launched group, a
// request's pieces hold the contiguous slots its combine reads, no two groups share a slot, no
// request has more pieces than the combine merges, the groups run longest first, and a model of
// the launch (each group to the slot that frees first) ends near one piece width where even
// splits wait for the longest request. The GPU side:
// MlaDecodeGpu.WgmmaBalancedScheduledAndPrefetch.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/mla_decode/schedule_plan.h"

namespace attnd::kernels::mla_decode {
namespace {

constexpr int64_t kMaxPieces = 128;  // gpu/launch.h kMaxSplits: the combine's slots a request

// Checks every property of BuildSchedule's output for `tiles` over `groups`; returns the entries.
// even_splits: the even plan's count (BuildSchedule's fallback; 0 never).
std::vector<ScheduleEntry> Checked(const std::vector<int64_t>& tiles, int64_t groups,
                                   const std::string& what, int64_t even_splits = 0) {
  const int64_t launched = groups + static_cast<int64_t>(tiles.size());
  std::vector<int32_t> first, pieces;
  const std::vector<ScheduleEntry> e =
      BuildSchedule(tiles, groups, launched, 2, kMaxPieces, &first, &pieces, even_splits);
  EXPECT_EQ(static_cast<int64_t>(e.size()), launched) << what;
  int64_t count = 0;
  for (const int32_t n : pieces) count += n;
  EXPECT_LE(count, launched) << what << ": more pieces than launched groups";
  std::vector<int64_t> slot_uses(static_cast<size_t>(launched), 0);
  std::vector<std::vector<int64_t>> cover(tiles.size());
  for (size_t b = 0; b < tiles.size(); ++b) cover[b].assign(static_cast<size_t>(tiles[b]), 0);
  for (int64_t g = 0; g < launched; ++g) {
    const ScheduleEntry& x = e[static_cast<size_t>(g)];
    EXPECT_TRUE(x.slot >= 0 && x.slot < launched) << what << " group " << g;
    if (x.slot < 0 || x.slot >= launched) continue;
    ++slot_uses[static_cast<size_t>(x.slot)];
    if (g >= count) {  // past the pieces: nothing to run, a slot nobody reads
      EXPECT_EQ(x.lo, x.hi) << what << " group " << g;
      EXPECT_GE(x.slot, count) << what << " group " << g;
      continue;
    }
    EXPECT_TRUE(x.request >= 0 && x.request < static_cast<int32_t>(tiles.size())) << what;
    if (x.request < 0 || x.request >= static_cast<int32_t>(tiles.size())) continue;
    const size_t b = static_cast<size_t>(x.request);
    EXPECT_LT(x.lo, x.hi) << what << ": an empty piece";
    EXPECT_GE(x.slot, first[b]) << what;
    EXPECT_LT(x.slot, first[b] + pieces[b]) << what << ": a slot outside its request's run";
    for (int32_t t = std::max(x.lo, 0); t < std::min<int64_t>(x.hi, tiles[b]); ++t) {
      ++cover[b][static_cast<size_t>(t)];
    }
    if (g > 0) {
      const ScheduleEntry& prev = e[static_cast<size_t>(g - 1)];
      EXPECT_GE(prev.hi - prev.lo, x.hi - x.lo) << what << ": not longest first at " << g;
    }
  }
  EXPECT_EQ(std::count(slot_uses.begin(), slot_uses.end(), 1), launched)
      << what << ": two groups share a partial slot";
  for (size_t b = 0; b < tiles.size(); ++b) {
    EXPECT_EQ(std::count(cover[b].begin(), cover[b].end(), 1), tiles[b])
        << what << " request " << b;
    EXPECT_LE(pieces[b], kMaxPieces) << what << " request " << b;
    EXPECT_EQ(pieces[b] == 0, tiles[b] == 0) << what << " request " << b;
  }
  return e;
}

// Greedy launch on `groups` slots (a group to the slot that frees first), a group costing its
// tiles plus `overhead`; groups past the pieces cost nothing.
double Makespan(const std::vector<ScheduleEntry>& e, int64_t groups, double overhead) {
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int64_t i = 0; i < groups; ++i) free_at.push(0);
  double end = 0;
  for (const ScheduleEntry& x : e) {
    if (x.lo == x.hi) continue;
    const double start = free_at.top();
    free_at.pop();
    const double stop = start + (x.hi - x.lo) + overhead;
    free_at.push(stop);
    end = std::max(end, stop);
  }
  return end;
}

std::vector<int64_t> Lengths(int64_t n, int64_t max_tiles, int kind, std::mt19937_64& rng) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    switch (kind) {
      case 0: t[static_cast<size_t>(i)] = max_tiles; break;                   // equal
      case 1: t[static_cast<size_t>(i)] = 1 + r % max_tiles; break;           // uniform
      case 2: t[static_cast<size_t>(i)] = r % 4 == 0 ? max_tiles : 1; break;  // bimodal
      case 3: t[static_cast<size_t>(i)] = r % 3 == 0 ? 0 : 1 + r % 7; break;  // short, empty
      default: t[static_cast<size_t>(i)] = i == 0 ? max_tiles : 0; break;     // one long
    }
  }
  return t;
}

TEST(MlaDecodeSchedulePlan, EveryTileOnceSlotsContiguousLongestFirst) {
  std::mt19937_64 rng(20261207);
  for (const int64_t groups : {1, 2, 7, 33, 66, 132, 255, 511}) {
    for (const int64_t batch :
         {int64_t{1}, int64_t{2}, groups / 2, groups - 1, groups, 2 * groups, 512 - groups}) {
      if (batch < 1 || batch + groups > kScheduleMaxLaunched) continue;
      for (const int64_t max_tiles : {1, 3, 64, 512, 100000}) {
        if (max_tiles > 512 && batch > 2) continue;  // the host coverage check's size
        for (int kind = 0; kind < 5; ++kind) {
          const std::string what = "groups " + std::to_string(groups) + " B " +
                                   std::to_string(batch) + " tiles " + std::to_string(max_tiles) +
                                   " kind " + std::to_string(kind);
          const std::vector<int64_t> tiles = Lengths(batch, max_tiles, kind, rng);
          for (const int64_t even : {0, 2}) {
            Checked(tiles, groups, what + " even " + std::to_string(even), even);
          }
        }
      }
    }
  }
  // Nothing to read: no pieces, every group empty.
  std::vector<int32_t> first, pieces;
  const auto e = BuildSchedule({0, 0, 0}, 8, 11, 2, kMaxPieces, &first, &pieces);
  for (const ScheduleEntry& x : e) EXPECT_EQ(x.lo, x.hi);
  EXPECT_EQ(pieces, std::vector<int32_t>({0, 0, 0}));
  // One request of 100000 tiles over 511 groups would be 511 pieces: widened to 128 at most.
  EXPECT_LE(SchedulePiecesOf(0, 100000, ScheduleWidth(100000, 100000, 511, 2, kMaxPieces)),
            kMaxPieces);
}

TEST(MlaDecodeSchedulePlan, EvenCutWhereTheEndToEndCutGainsLittle) {
  // Equal lengths (512 tiles, a 32K table): B128 over 132 groups with one even split, B32 over
  // 66 with two. The end-to-end width (497, 249) is within 7/8 of the even makespan (512,
  // 256): each request is cut alone, as even splits cut it, with no short remainder.
  struct Shape {
    int64_t batch, groups, even_splits;
  };
  for (const Shape& k : {Shape{128, 132, 1}, Shape{32, 66, 2}, Shape{64, 66, 2}}) {
    const std::string what = "B " + std::to_string(k.batch) + " groups " +
                             std::to_string(k.groups) + " even " + std::to_string(k.even_splits);
    const std::vector<int64_t> tiles(static_cast<size_t>(k.batch), 512);
    const int64_t launched = k.groups + k.batch;
    const int64_t width = ScheduleWidth(512 * k.batch, 512, k.groups, 2, kMaxPieces);
    const int64_t per = 512 / k.even_splits;
    EXPECT_EQ(ScheduleEvenWidth(width, 512, k.batch, k.groups, launched, k.even_splits, 2), per)
        << what;
    std::vector<int32_t> first, pieces;
    const auto e =
        BuildSchedule(tiles, k.groups, launched, 2, kMaxPieces, &first, &pieces, k.even_splits);
    Checked(tiles, k.groups, what, k.even_splits);
    for (int64_t b = 0; b < k.batch; ++b) {
      EXPECT_EQ(pieces[static_cast<size_t>(b)], k.even_splits) << what << " request " << b;
    }
    for (int64_t g = 0; g < k.batch * k.even_splits; ++g) {
      EXPECT_EQ(e[static_cast<size_t>(g)].hi - e[static_cast<size_t>(g)].lo, per) << what;
    }
    // Without the even count, the end-to-end cut leaves short remainders.
    const auto cut = BuildSchedule(tiles, k.groups, launched, 2, kMaxPieces, &first, &pieces);
    int32_t shortest = 512;
    for (int64_t g = 0; g < launched; ++g) {
      const ScheduleEntry& x = cut[static_cast<size_t>(g)];
      if (x.hi > x.lo) shortest = std::min(shortest, x.hi - x.lo);
    }
    EXPECT_LT(shortest, per / 4) << what;
  }
  // Ragged lengths (uniform, bimodal) over the same shapes keep the end-to-end cut.
  std::mt19937_64 rng(11);
  for (const int kind : {1, 2}) {
    for (const Shape& k : {Shape{128, 132, 1}, Shape{32, 66, 2}}) {
      const std::vector<int64_t> tiles = Lengths(k.batch, 512, kind, rng);
      int64_t total = 0, longest = 0;
      for (const int64_t t : tiles) {
        total += t;
        longest = std::max(longest, t);
      }
      const int64_t width = ScheduleWidth(total, longest, k.groups, 2, kMaxPieces);
      EXPECT_EQ(ScheduleEvenWidth(width, longest, k.batch, k.groups, k.groups + k.batch,
                                  k.even_splits, 2),
                0)
          << "kind " << kind << " B " << k.batch;
    }
  }
  // Never where the even cut's pieces would not fit the launched groups, or without a count.
  EXPECT_EQ(ScheduleEvenWidth(497, 512, 128, 132, 260, 3, 2), 0);
  EXPECT_EQ(ScheduleEvenWidth(497, 512, 128, 132, 260, 0, 2), 0);
  EXPECT_EQ(ScheduleEvenWidth(497, 512, 128, 132, 260, 2, 2), 256);
}

TEST(MlaDecodeSchedulePlan, RaggedBatchesEndNearOneWidth) {
  // B128 H64 and B32 H128 over a 32K table (512 tiles) on 132 SMs, lengths uniform in [1, 512]
  // tiles: even splits (GpuSplits: one split at B128, two at B32) wait for the longest request;
  // the schedule ends within a few % of the width (the average per group, rounded up). Equal
  // lengths: the balanced plan's 497 and 249 tiles. A piece's fixed cost 0-2 tiles.
  struct Shape {
    int64_t batch, groups, even_splits;
    int kind;
  };
  // even_splits 0: more requests than groups (B128 H128: two waves of whole requests), where
  // only the width bound is checked.
  const Shape shapes[] = {{128, 132, 1, 1}, {32, 66, 2, 1}, {128, 132, 1, 0}, {32, 66, 2, 0},
                          {128, 132, 1, 2}, {64, 66, 1, 1}, {128, 66, 0, 1},  {128, 66, 0, 0}};
  std::mt19937_64 rng(7);
  for (const Shape& k : shapes) {
    const std::vector<int64_t> tiles = Lengths(k.batch, 512, k.kind, rng);
    int64_t total = 0, longest = 0;
    for (const int64_t t : tiles) {
      total += t;
      longest = std::max(longest, t);
    }
    const std::string what = "B " + std::to_string(k.batch) + " groups " +
                             std::to_string(k.groups) + " kind " + std::to_string(k.kind);
    const auto e = Checked(tiles, k.groups, what);
    const int64_t width = ScheduleWidth(total, longest, k.groups, 2, kMaxPieces);
    for (const double overhead : {0.0, 2.0}) {
      const double span = Makespan(e, k.groups, overhead);
      // Greedy placement of pieces up to `width` long overshoots the width by a fraction of
      // the last piece placed (uniform lengths: 3-5 % in this model).
      EXPECT_LE(span, 1.08 * width + 2 * overhead + 1) << what;
      if (k.even_splits == 0) continue;
      const double even =
          static_cast<double>((longest + k.even_splits - 1) / k.even_splits) + overhead;
      if (k.kind != 0) {
        EXPECT_LT(span, 0.75 * even) << what << ": the schedule should beat even splits";
      } else {
        EXPECT_LE(span, even) << what;
      }
    }
  }
}

}  // namespace
}  // namespace attnd::kernels::mla_decode
