// RowSelector and its pieces (kernels/topk/row_select.h): key order, the vectorised filter, the
// radix select, the documented output order (ascending columns, lowest-column ties) and the
// sampled-threshold paths, including the fallback when the sample misleads.
#include "kernels/topk/row_select.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/harness/harness.h"

namespace attnd::kernels::topk {
namespace {

using testing::MakeRng;

float RandomBitsFloat(std::mt19937_64& rng) {
  const uint32_t u = static_cast<uint32_t>(rng());
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

TEST(TopKRowSelect, KeysOrderLikeFloats) {
  auto rng = MakeRng();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(LogitKey(-inf), kMinSelectableKey - 1);
  EXPECT_EQ(LogitKey(-std::numeric_limits<float>::max()), kMinSelectableKey);
  EXPECT_EQ(LogitKey(inf), kPosInfKey);
  EXPECT_EQ(LogitKey(std::numeric_limits<float>::quiet_NaN()), 0u);
  EXPECT_LT(LogitKey(-std::numeric_limits<float>::quiet_NaN()), kMinSelectableKey);
  for (int i = 0; i < 100000; ++i) {
    const float a = RandomBitsFloat(rng), b = RandomBitsFloat(rng);
    if (std::isnan(a) || std::isnan(b)) continue;
    if (a < b) {
      EXPECT_LT(LogitKey(a), LogitKey(b)) << a << " " << b;
    } else if (a > b) {
      EXPECT_GT(LogitKey(a), LogitKey(b)) << a << " " << b;
    }
    if (a != -inf) {
      const float back = KeyToLogit(LogitKey(a));
      EXPECT_EQ(std::memcmp(&back, &a, sizeof(a)), 0) << a;
    }
  }
}

TEST(TopKRowSelect, FilterMatchesScalar) {
  auto rng = MakeRng();
  for (int64_t len : {0, 1, 7, 8, 9, 100, 1003}) {
    std::vector<float> row(static_cast<size_t>(len));
    for (auto& x : row) {
      x = (rng() % 8 == 0) ? RandomBitsFloat(rng) : static_cast<float>(rng() % 64) - 32.0f;
      if (rng() % 16 == 0) x = -0.0f;
    }
    for (float t : {kMinSelectable, -3.0f, 0.0f, -0.0f, 5.0f, 1e30f}) {
      std::vector<uint32_t> keys(static_cast<size_t>(len) + 8);
      std::vector<int32_t> cols(static_cast<size_t>(len) + 8);
      const int64_t n = FilterAtLeast(row.data(), len, t, 1000, keys.data(), cols.data());
      int64_t want = 0;
      for (int64_t i = 0; i < len; ++i) {
        const float x = row[static_cast<size_t>(i)];
        if (!(x >= t)) continue;  // NaN never passes
        ASSERT_LT(want, n) << "len " << len;
        EXPECT_EQ(keys[static_cast<size_t>(want)], LogitKey(x));
        EXPECT_EQ(cols[static_cast<size_t>(want)], 1000 + i);
        ++want;
      }
      EXPECT_EQ(n, want) << "len " << len << " threshold " << t;
    }
  }
}

TEST(TopKRowSelect, KthLargestKeyMatchesSort) {
  auto rng = MakeRng();
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 5000);
    std::vector<uint32_t> keys(static_cast<size_t>(n));
    const uint32_t spread = trial % 3 == 0 ? 4u : 0xffffffffu;  // some with heavy ties
    for (auto& k : keys) k = 0x40000000u + static_cast<uint32_t>(rng()) % spread;
    std::vector<uint32_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end(), std::greater<uint32_t>());
    const int64_t k = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
    std::vector<uint32_t> tmp(static_cast<size_t>(n));
    int64_t greater = -1;
    const uint32_t kth = KthLargestKey(keys.data(), n, k, tmp.data(), &greater);
    EXPECT_EQ(kth, sorted[static_cast<size_t>(k - 1)]);
    EXPECT_EQ(greater,
              std::count_if(keys.begin(), keys.end(), [&](uint32_t x) { return x > kth; }));
  }
}

// The CPU implementation's documented order: ascending columns; ties go to the lowest columns.
// Ties are equal keys: +0 sorts above -0 (row_select.h), so the reference orders by key, not by
// float comparison (which calls ±0 equal; std::round makes both here).
TEST(TopKRowSelect, AscendingColumnsLowestTies) {
  auto rng = MakeRng();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t len : {50, 3000, 40000}) {
    std::vector<float> row(static_cast<size_t>(len));
    for (auto& x : row) x = std::round(normal(rng) * 4.0f);  // ties at every value
    const int64_t lo = len / 10, hi = len - 3, k = std::min<int64_t>(512, len / 4);
    RowSelector sel;
    const int64_t count = sel.Select(row.data(), lo, hi, k);
    ASSERT_EQ(count, k);
    std::vector<std::pair<uint32_t, int64_t>> want;  // by key desc, then column asc
    for (int64_t i = lo; i < hi; ++i) want.emplace_back(LogitKey(row[static_cast<size_t>(i)]), i);
    std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    std::vector<int64_t> want_cols;
    for (int64_t i = 0; i < k; ++i) want_cols.push_back(want[static_cast<size_t>(i)].second);
    std::sort(want_cols.begin(), want_cols.end());
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_EQ(sel.cols()[i], want_cols[static_cast<size_t>(i)]) << "len " << len << " i " << i;
      EXPECT_EQ(KeyToLogit(sel.keys()[i]), row[static_cast<size_t>(sel.cols()[i])]);
    }
  }
}

TEST(TopKRowSelect, SampledThresholdPaths) {
  auto rng = MakeRng();
  const int64_t len = 65536, k = 2048;
  std::vector<float> row(static_cast<size_t>(len));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& x : row) x = normal(rng);
  RowSelector sel;
  EXPECT_EQ(sel.Select(row.data(), 0, len, k), k);
  EXPECT_EQ(sel.last_path(), 1);  // the sample's threshold held
  // Spikes on a stride the sample lands on: only len / 64 = 1024 < k of them, so the sampled
  // threshold is too high and the row is filtered again at the floor.
  for (int64_t j = 0; j < len; ++j) {
    if (j % 64 == 32) row[static_cast<size_t>(j)] = 100.0f + normal(rng);
  }
  EXPECT_EQ(sel.Select(row.data(), 0, len, k), k);
  EXPECT_EQ(sel.last_path(), 2);
  int64_t spikes = 0;
  for (int64_t i = 0; i < k; ++i) spikes += sel.cols()[i] % 64 == 32 ? 1 : 0;
  EXPECT_EQ(spikes, len / 64);
  EXPECT_EQ(sel.Select(row.data(), 0, 3 * k, k), k);
  EXPECT_EQ(sel.last_path(), 0);  // short row: no sampling
}

}  // namespace
}  // namespace attnd::kernels::topk
