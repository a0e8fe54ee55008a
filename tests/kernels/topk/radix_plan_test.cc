// The GPU top-k's radix-select arithmetic (kernels/topk/gpu/radix.h) on the host: the key map
// equals the CPU's, and a sequential emulation of the SIMT kernel's plan (digit levels, the
// threshold, the ordered pass's positions) reproduces RowSelector's output exactly — the same
// columns in the same order, ties to the lowest columns. Runs without a GPU.
#include "kernels/topk/gpu/radix.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/topk/row_select.h"
#include "tests/harness/harness.h"

namespace attnd::kernels::topk {
namespace {

using gpu::radix::Threshold;
using testing::MakeRng;

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// The kernel's plan for one window, sequentially: histogram levels walked from the top bin, the
// early stop when a bin is taken whole, then the ordered pass. Returns the chosen columns in
// output order.
std::vector<int32_t> EmulateKernel(const std::vector<float>& row, int64_t k) {
  std::vector<uint32_t> keys;
  for (float x : row) keys.push_back(gpu::radix::KeyOfBits(Bits(x)));
  Threshold t = gpu::radix::Start(static_cast<uint32_t>(k));
  uint32_t bin_count = 0;
  uint32_t total = 0;
  auto choose = [&](int level) {  // returns the threshold after `level`
    std::vector<uint32_t> hist(gpu::radix::kBins, 0);
    for (uint32_t key : keys) {
      if (gpu::radix::InLevel(key, level, t)) ++hist[gpu::radix::Digit(key, level)];
    }
    uint32_t above = 0;
    total = 0;
    Threshold next = t;
    int found = 0;
    for (int b = gpu::radix::kBins - 1; b >= 0; --b) {
      if (gpu::radix::HoldsRank(above, hist[b], t.need)) {
        next = gpu::radix::Refine(t, level, static_cast<uint32_t>(b), above);
        bin_count = hist[b];
        ++found;
      }
      above += hist[b];
    }
    total = above;
    EXPECT_LE(found, 1) << "two bins hold the rank";
    return next;
  };
  const Threshold after_first = choose(0);
  if (total == 0) return {};
  uint32_t count = static_cast<uint32_t>(k);
  if (total <= k) {
    t = gpu::radix::AllSelectable();
    count = total;
  } else {
    t = after_first;
    for (int level = 1; level < gpu::radix::kLevels && bin_count != t.need; ++level)
      t = choose(level);
  }
  std::vector<int32_t> out(count, -1);
  uint32_t gt_before = 0, eq_before = 0;
  for (size_t n = 0; n < keys.size(); ++n) {
    const bool above = gpu::radix::AboveThreshold(t, keys[n]);
    const bool at = gpu::radix::AtThreshold(t, keys[n]);
    if (gpu::radix::IsChosen(t, above, at, eq_before)) {
      const uint32_t pos = gpu::radix::OutputPosition(t, gt_before, eq_before);
      EXPECT_LT(pos, count);
      if (pos < count) out[pos] = static_cast<int32_t>(n);
    }
    gt_before += above ? 1 : 0;
    eq_before += at ? 1 : 0;
  }
  return out;
}

std::vector<int32_t> CpuSelect(const std::vector<float>& row, int64_t k) {
  RowSelector selector;
  const int64_t count = selector.Select(row.data(), 0, static_cast<int64_t>(row.size()), k);
  return std::vector<int32_t>(selector.cols(), selector.cols() + count);
}

TEST(TopKRadixPlan, KeysAreTheCpuKeys) {
  auto rng = MakeRng();
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f,
                            -1.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min()};
  for (float x : specials) EXPECT_EQ(gpu::radix::KeyOfBits(Bits(x)), LogitKey(x)) << x;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng());
    float x;
    std::memcpy(&x, &u, sizeof(x));
    ASSERT_EQ(gpu::radix::KeyOfBits(u), LogitKey(x)) << std::hex << u;
  }
  EXPECT_EQ(gpu::radix::kMinSelectableKey, kMinSelectableKey);
  // The digits of the three levels rebuild the key.
  for (int i = 0; i < 1000; ++i) {
    const uint32_t key = static_cast<uint32_t>(rng());
    EXPECT_EQ((gpu::radix::Digit(key, 0) << 21) | (gpu::radix::Digit(key, 1) << 10) |
                  gpu::radix::Digit(key, 2),
              key);
  }
}

TEST(TopKRadixPlan, SlotOfMatchesTheContract) {
  const int32_t table[4] = {3, -1, 0x7fffffff / 64 + 10, 7};
  for (int64_t page_size : {1, 48, 64}) {
    const int shift = page_size == 64 ? 6 : (page_size == 1 ? 0 : -1);
    for (int64_t block_stride : {page_size, 2 * page_size, page_size + 3}) {
      for (int32_t col = 0; col < 400; ++col) {
        const int64_t page = col / page_size;
        int64_t want = -1;
        if (page < 4 && table[page] >= 0) {
          want = int64_t{table[page]} * block_stride + col % page_size;
        }
        if (want > 0x7fffffff) want = -1;
        ASSERT_EQ(gpu::radix::SlotOf(col, table, 4, static_cast<uint32_t>(page_size), shift,
                                     static_cast<uint32_t>(block_stride)),
                  want)
            << col << " page_size " << page_size << " block_stride " << block_stride;
      }
      // max_blocks 0 (a row without a request): -1, the table is not read.
      ASSERT_EQ(gpu::radix::SlotOf(0, nullptr, 0, static_cast<uint32_t>(page_size), shift,
                                   static_cast<uint32_t>(block_stride)),
                -1);
    }
  }
}

// Rows that drive every branch of the plan: a unique top-k, heavy ties (levels down to shift 0),
// a whole bin taken (early stop), fewer selectable than k, NaN / -inf / signed zeros, one octave
// (a huge level-0 bin), all equal.
std::vector<float> MakeRow(int kind, int64_t n, std::mt19937_64& rng) {
  std::vector<float> row(static_cast<size_t>(n));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> octave(1.0f, 2.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (auto& x : row) {
    switch (kind) {
      case 0: x = normal(rng); break;
      case 1: x = static_cast<float>(rng() % 16); break;
      case 2: x = std::round(normal(rng) * 256.0f) / 256.0f; break;
      case 3: x = (rng() % 10 == 0) ? normal(rng) : ((rng() % 2) ? -inf : nan); break;
      case 4: {
        const float pick[] = {0.0f, -0.0f, 1.0f, -1.0f, nan, -nan, -inf, inf};
        x = pick[rng() % 8];
        break;
      }
      case 5: x = octave(rng); break;
      case 6: x = 0.75f; break;
      default: x = normal(rng) - 10.0f; break;
    }
  }
  if (kind == 7) {  // exactly 100 values of 5.0 and 300 of 4.0: a whole level-0 bin at k = 100
    for (int i = 0; i < 100; ++i) row[static_cast<size_t>(i * 7 % n)] = 5.0f;
    for (int i = 0; i < 300; ++i) row[static_cast<size_t>((i * 13 + 3) % n)] = 4.0f;
  }
  return row;
}

TEST(TopKRadixPlan, EmulationMatchesRowSelectorExactly) {
  auto rng = MakeRng();
  for (int kind = 0; kind < 8; ++kind) {
    for (int64_t n : {1, 63, 2048, 5000, 40000}) {
      for (int64_t k : {1, 64, 100, 2048, 4096}) {
        SCOPED_TRACE(::testing::Message() << "kind " << kind << " n " << n << " k " << k);
        const std::vector<float> row = MakeRow(kind, n, rng);
        ASSERT_EQ(EmulateKernel(row, k), CpuSelect(row, k));
      }
    }
  }
}

}  // namespace
}  // namespace attnd::kernels::topk
