// The indexer → top-k candidate scheme (kernels/topk/gpu/candidates.h; docs/KERNELS.md "Indexer
// → top-k candidates") on the host, without a GPU: a model of what the indexer kernel does per
// row — 64-column tiles in order, a value appended when its key is at or above the row's floor,
// the floor raised every kCandidateFloorEvery tiles from a histogram that may miss the latest
// appends (another warp's adds in flight), the final floor from the whole histogram — checked on
// rows built to hurt it: every entry of the row's exact top k (value order, ties to the lowest
// columns) must be a candidate at or above the final floor, and the candidates never outnumber
// the window. The kernel itself is checked against cuda_steps by dsa_test's Dsa.FusedTopk* on a
// GPU; this checks the scheme those kernels implement.
#include "kernels/topk/gpu/candidates.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/topk/gpu/radix.h"

namespace attnd::kernels::topk {
namespace {

using gpu::CandidateFloorKey;
using gpu::kCandidateBins;
using gpu::kCandidateFloorEvery;
using gpu::kCandidateShift;

uint32_t KeyOf(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return gpu::radix::KeyOfBits(bits);
}

struct ModelResult {
  std::vector<int64_t> candidates;  // columns, in append order
  std::vector<uint32_t> keys;
  uint32_t final_floor = 0;
};

// The kernel's scheme on one row's window [begin, end) of `row`. `stale`: how many of the
// latest appends a floor refresh may not see (the model drops up to that many, chosen by rng).
ModelResult RunModel(const std::vector<float>& row, int64_t begin, int64_t end, uint32_t k,
                     std::mt19937_64& rng, uint32_t stale) {
  ModelResult r;
  std::vector<uint32_t> hist(kCandidateBins, 0u);
  std::vector<uint32_t> recent;  // digits of the appends since the last refresh
  uint32_t floor = gpu::radix::kMinSelectableKey;
  const int64_t tiles = (static_cast<int64_t>(row.size()) + 63) / 64;
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t c = 64 * t; c < std::min<int64_t>(64 * (t + 1), row.size()); ++c) {
      const uint32_t key = KeyOf(row[c]);
      if (c < begin || c >= end || key < floor) continue;
      r.candidates.push_back(c);
      r.keys.push_back(key);
      hist[key >> kCandidateShift] += 1;
      recent.push_back(key >> kCandidateShift);
    }
    if (t % kCandidateFloorEvery == kCandidateFloorEvery - 1) {
      // A refresh that misses up to `stale` of the latest appends (counts at most the true ones).
      std::vector<uint32_t> seen = hist;
      const uint32_t miss =
          std::min<uint32_t>(static_cast<uint32_t>(recent.size()),
                             stale == 0 ? 0u : static_cast<uint32_t>(rng() % (stale + 1)));
      for (uint32_t i = 0; i < miss; ++i) seen[recent[recent.size() - 1 - i]] -= 1;
      floor = std::max(floor, CandidateFloorKey(seen.data(), k));
      recent.clear();
    }
  }
  r.final_floor = std::max(CandidateFloorKey(hist.data(), k), gpu::radix::kMinSelectableKey);
  return r;
}

// The exact top k of the window: selectable keys (not NaN, not -inf) by key descending, ties to
// the lowest columns.
std::vector<int64_t> ExactTopk(const std::vector<float>& row, int64_t begin, int64_t end,
                               uint32_t k) {
  std::vector<int64_t> cols;
  for (int64_t c = begin; c < end; ++c) {
    if (KeyOf(row[c]) >= gpu::radix::kMinSelectableKey) cols.push_back(c);
  }
  std::stable_sort(cols.begin(), cols.end(),
                   [&](int64_t a, int64_t b) { return KeyOf(row[a]) > KeyOf(row[b]); });
  if (cols.size() > k) cols.resize(k);
  return cols;
}

void ExpectTopkKept(const std::vector<float>& row, int64_t begin, int64_t end, uint32_t k,
                    const std::string& what, std::mt19937_64& rng) {
  SCOPED_TRACE(what + " k=" + std::to_string(k));
  for (const uint32_t stale : {0u, 64u, 100000u}) {
    const ModelResult m = RunModel(row, begin, end, k, rng, stale);
    ASSERT_LE(static_cast<int64_t>(m.candidates.size()), std::max<int64_t>(end - begin, 0));
    std::vector<char> kept(row.size(), 0);
    for (size_t i = 0; i < m.candidates.size(); ++i) {
      if (m.keys[i] >= m.final_floor) kept[m.candidates[i]] = 1;
    }
    for (const int64_t c : ExactTopk(row, begin, end, k)) {
      ASSERT_TRUE(kept[c]) << "column " << c << " of the top k was lost (stale " << stale << ")";
    }
  }
}

TEST(TopKCandidates, FloorKeyIsTheHighestBinReachingK) {
  std::vector<uint32_t> hist(kCandidateBins, 0u);
  EXPECT_EQ(CandidateFloorKey(hist.data(), 1), 0u);  // nothing counted
  hist[1000] = 3;
  hist[900] = 5;
  EXPECT_EQ(CandidateFloorKey(hist.data(), 3), 1000u << kCandidateShift);
  EXPECT_EQ(CandidateFloorKey(hist.data(), 4), 900u << kCandidateShift);
  EXPECT_EQ(CandidateFloorKey(hist.data(), 8), 900u << kCandidateShift);
  EXPECT_EQ(CandidateFloorKey(hist.data(), 9), 0u);
  hist[2047] = 1;  // +inf's bin (0xff800000 >> 21 = 2044) and above
  EXPECT_EQ(CandidateFloorKey(hist.data(), 1), 2047u << kCandidateShift);
}

TEST(TopKCandidates, TheTopKIsAlwaysKept) {
  std::mt19937_64 rng(20261205);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int64_t kN = 6000;
  auto fresh = [&](auto gen) {
    std::vector<float> row(kN);
    for (int64_t c = 0; c < kN; ++c) row[c] = gen(c);
    return row;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::pair<std::string, std::vector<float>>> rows = {
      {"normal", fresh([&](int64_t) { return normal(rng); })},
      {"ascending", fresh([&](int64_t c) { return static_cast<float>(c) * 1e-3f; })},
      {"descending", fresh([&](int64_t c) { return -static_cast<float>(c) * 1e-3f; })},
      {"all equal", fresh([&](int64_t) { return 0.75f; })},
      {"few values", fresh([&](int64_t) { return static_cast<float>(rng() % 4) - 1.5f; })},
      {"signed zeros", fresh([&](int64_t c) { return c % 2 == 0 ? 0.0f : -0.0f; })},
      {"one octave",
       fresh([&](int64_t) { return 1.0f + 1e-4f * static_cast<float>(rng() % 1000); })},
      {"specials", fresh([&](int64_t c) {
         switch (c % 7) {
           case 0: return nan;
           case 1: return -inf;
           case 2: return c % 3 == 0 ? inf : normal(rng);
           default: return normal(rng);
         }
       })},
      {"rising trend",
       fresh([&](int64_t c) { return normal(rng) + 4e-3f * static_cast<float>(c); })},
  };
  for (auto& [name, row] : rows) {
    for (const uint32_t k : {1u, 64u, 777u, 2048u, 5999u, 8000u}) {
      ExpectTopkKept(row, 0, kN, k, name, rng);
      ExpectTopkKept(row, 1234, 4321, k, name + " window", rng);
      ExpectTopkKept(row, 70, 90, k, name + " short window", rng);
    }
  }
}

}  // namespace
}  // namespace attnd::kernels::topk
