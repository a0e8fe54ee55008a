// MLA decode's wave-balanced split plan (kernels/mla_decode/balanced_plan.h; docs/KERNELS.md
// "Wave-balanced splits"), on the host: every tile of every request runs in exactly one piece,
// each request's pieces fill its partial slots 0 .. BalancedPiecesOf - 1 once each (the
// combine reads exactly those), and a model of two waves on as many slots as ranges (second-wave
// groups taken in launch order by the slot that frees first) ends near one range's width, where
// even splits end at a whole request. The GPU side (the same pieces run by the kernels) is
// MlaDecodeGpu.WgmmaBalancedScheduledAndPrefetch.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/mla_decode/balanced_plan.h"

namespace attnd::kernels::mla_decode {
namespace {

struct Case {
  int64_t requests, tiles, ranges_wanted;
};

// The plan's pieces in launch order, every invariant checked on the way.
std::vector<BalancedPiece> CheckedPieces(const BalancedShape& s, const std::string& what) {
  std::vector<uint8_t> order(kBalancedMaxRanges);
  const int32_t cut = BalancedOrder(s, order.data());
  std::vector<uint8_t> seen(static_cast<size_t>(s.ranges), 0);
  for (int32_t g = 0; g < s.ranges; ++g) {
    EXPECT_LT(order[g], s.ranges) << what;
    ++seen[order[g]];
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), s.ranges) << what << ": not a permutation";
  std::vector<BalancedPiece> pieces;
  for (int64_t g = 0; g < s.ranges + cut; ++g) {
    pieces.push_back(BalancedPieceAt(s, order.data(), g));
    if (g >= s.ranges) {  // second wave: a cut range's other piece
      EXPECT_GE(BalancedRangeOf(s, order[g - s.ranges]).cut, 0) << what << " group " << g;
    }
  }
  // Coverage and slots, request by request.
  std::vector<std::vector<int64_t>> cover(static_cast<size_t>(s.requests),
                                          std::vector<int64_t>(static_cast<size_t>(s.tiles), 0));
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(s.requests));
  for (const BalancedPiece& p : pieces) {
    EXPECT_GE(p.request, 0) << what;
    EXPECT_LT(p.request, s.requests) << what;
    if (p.request < 0 || p.request >= s.requests) continue;
    EXPECT_LT(p.begin, p.end) << what << ": an empty piece";
    EXPECT_GE(p.begin, 0) << what;
    EXPECT_LE(p.end, s.tiles) << what;
    EXPECT_LE(p.end - p.begin, s.width) << what;
    for (int64_t t = std::max<int64_t>(p.begin, 0); t < std::min(p.end, s.tiles); ++t) {
      ++cover[static_cast<size_t>(p.request)][static_cast<size_t>(t)];
    }
    slots[static_cast<size_t>(p.request)].push_back(p.slot);
  }
  for (int64_t b = 0; b < s.requests; ++b) {
    const auto& c = cover[static_cast<size_t>(b)];
    EXPECT_EQ(std::count(c.begin(), c.end(), 1), s.tiles) << what << ": request " << b;
    std::vector<int64_t> got = slots[static_cast<size_t>(b)];
    std::sort(got.begin(), got.end());
    const int32_t n = BalancedPiecesOf(s, b);
    EXPECT_LE(n, s.max_pieces) << what << ": request " << b;
    std::vector<int64_t> want(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = i;
    EXPECT_EQ(got, want) << what << ": request " << b << "'s partial slots";
  }
  return pieces;
}

// Two waves on s.ranges slots: the first s.ranges groups start together, each later group goes
// to the slot that frees first (ties to the lower slot), a piece taking its tiles plus
// `overhead`. Returns the last slot's end.
double Makespan(const BalancedShape& s, const std::vector<BalancedPiece>& pieces, double overhead) {
  using Slot = std::pair<double, int64_t>;  // (free at, slot)
  std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>> free_at;
  double end = 0;
  for (size_t g = 0; g < pieces.size(); ++g) {
    const double t = static_cast<double>(pieces[g].end - pieces[g].begin) + overhead;
    double start = 0;
    int64_t slot = static_cast<int64_t>(g);
    if (g >= static_cast<size_t>(s.ranges)) {
      start = free_at.top().first;
      slot = free_at.top().second;
      free_at.pop();
    }
    free_at.push({start + t, slot});
    end = std::max(end, start + t);
  }
  return end;
}

TEST(MlaDecodeBalancedPlan, PiecesCoverEveryTileOnceAndFillEverySlot) {
  const Case cases[] = {
      {128, 512, 132},  // B128 H64 over 32K on 132 SMs: 128 items
      {32, 512, 66},    // B32 H128 (two row blocks a request): 66 groups of 2
      {64, 512, 66},    // B64 H128
      {1, 64, 132},     // B1 over 4K: one request, 32 ranges of 2 tiles
      {2, 64, 66},     {3, 7, 5},       {5, 100, 6},  {7, 9, 8},         {100, 1000, 101},
      {9, 3, 255},     {254, 513, 255}, {13, 2, 200}, {6, 1 << 20, 132},
  };
  for (const Case& k : cases) {
    const std::string what = "B " + std::to_string(k.requests) + " tiles " +
                             std::to_string(k.tiles) + " ranges " + std::to_string(k.ranges_wanted);
    const BalancedShape s = BalancedShapeFor(k.requests, k.tiles, k.ranges_wanted, 2, 128);
    if (s.ranges == 0) continue;  // checked below where it must apply
    EXPECT_LE(s.ranges, std::min<int64_t>(k.ranges_wanted, kBalancedMaxRanges)) << what;
    EXPECT_GT(s.ranges, k.requests) << what;
    EXPECT_GE(s.width, 2) << what;
    EXPECT_LT(s.width, s.tiles) << what;
    CheckedPieces(s, what);
  }
  // Where it must apply, and where it must not.
  EXPECT_EQ(BalancedShapeFor(128, 512, 132, 2, 128).width, 497);
  EXPECT_EQ(BalancedShapeFor(128, 512, 132, 2, 128).ranges, 132);
  EXPECT_EQ(BalancedShapeFor(32, 512, 66, 2, 128).width, 249);
  EXPECT_EQ(BalancedShapeFor(32, 512, 66, 2, 128).ranges, 66);
  EXPECT_EQ(BalancedShapeFor(132, 512, 132, 2, 128).ranges, 0);  // a range per request
  EXPECT_EQ(BalancedShapeFor(200, 512, 132, 2, 128).ranges, 0);
  EXPECT_EQ(BalancedShapeFor(3, 2, 100, 2, 128).ranges, 0);    // a range would be a request
  EXPECT_EQ(BalancedShapeFor(1, 4096, 132, 2, 16).ranges, 0);  // 33 slots > 16 allowed
  EXPECT_EQ(BalancedShapeFor(0, 512, 132, 2, 128).ranges, 0);
  EXPECT_EQ(BalancedShapeFor(4, 0, 132, 2, 128).ranges, 0);
}

TEST(MlaDecodeBalancedPlan, TwoWavesEndNearOneRange) {
  // The dense decode shapes of docs/BENCHMARKS.md: even splits end at a whole request (512 tiles
  // at B128 H64, 256 at B32 H128's two splits); the plan near its width, with a piece's fixed
  // cost of up to two tiles, and before even splits where they leave a tenth of a wave idle
  // (even_makespan > 0). B16 is the counter-case: 128 CTAs of 64 tiles against ranges of 63
  // and two pieces on some slots, so the plan gains nothing there (it is a launch option).
  struct Shape {
    int64_t requests, tiles, ranges_wanted, even_makespan;
  };
  const Shape shapes[] = {{128, 512, 132, 512}, {32, 512, 66, 256}, {64, 512, 66, 512},
                          {100, 512, 132, 512}, {16, 512, 132, 0},  {127, 512, 132, 512}};
  for (const Shape& k : shapes) {
    const std::string what =
        "B " + std::to_string(k.requests) + " ranges " + std::to_string(k.ranges_wanted);
    const BalancedShape s = BalancedShapeFor(k.requests, k.tiles, k.ranges_wanted, 2, 128);
    ASSERT_GT(s.ranges, 0) << what;
    const std::vector<BalancedPiece> pieces = CheckedPieces(s, what);
    for (const double overhead : {0.0, 1.0, 2.0}) {
      const double span = Makespan(s, pieces, overhead);
      EXPECT_LE(span, static_cast<double>(s.width) + 2 * overhead + 1) << what << " " << overhead;
      if (k.even_makespan > 0) {
        EXPECT_LT(span, static_cast<double>(k.even_makespan) + overhead) << what << " " << overhead;
      }
    }
  }
}

}  // namespace
}  // namespace attnd::kernels::mla_decode
