// The streaming GPU top-k's plan (kernels/topk/gpu/stream_plan.h) on the host: the admission
// floats, the floor a compaction leaves, window groups and cluster segments, the speculation rank,
// and a sequential emulation of the whole kernel (segments per cluster rank, chunked admission,
// the speculative floor from the first chunks' histogram with its fallback, exact compactions,
// the cluster-wide radix select and the ordered output) that must reproduce RowSelector's output
// exactly. Runs without a GPU.
#include "kernels/topk/gpu/stream_plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/topk/gpu/radix.h"
#include "kernels/topk/row_select.h"
#include "tests/harness/harness.h"

namespace attnd::kernels::topk {
namespace {

using gpu::PlanSegment;
using gpu::SegmentPlan;
using gpu::radix::Threshold;
using testing::MakeRng;

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
float FloatOf(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

TEST(TopKStreamPlan, AdmitBitsIsAFloatFloorForKeys) {
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
  std::vector<uint32_t> keys = {gpu::radix::kMinSelectableKey, gpu::radix::kPosInfKey,
                                gpu::radix::kPosInfKey + 1, LogitKey(0.0f), LogitKey(-0.0f)};
  for (int i = 0; i < 2000; ++i) {
    keys.push_back(std::clamp(static_cast<uint32_t>(rng()), gpu::radix::kMinSelectableKey,
                              gpu::radix::kPosInfKey + 1));
  }
  std::vector<float> xs(std::begin(specials), std::end(specials));
  for (int i = 0; i < 2000; ++i) xs.push_back(FloatOf(static_cast<uint32_t>(rng())));
  for (uint32_t key : keys) {
    const float floor = FloatOf(gpu::AdmitBits(key));
    for (float x : xs) {
      const bool by_key = LogitKey(x) >= key && LogitKey(x) >= gpu::radix::kMinSelectableKey;
      const bool by_float = x >= floor;
      if (by_key) {
        ASSERT_TRUE(by_float) << std::hex << key << " " << Bits(x);
      }
      if (by_float && !by_key) {  // the only extra: -0.0 over the key of +0.0
        ASSERT_EQ(Bits(x), 0x80000000u) << std::hex << key;
        ASSERT_EQ(key, LogitKey(0.0f));
      }
    }
  }
  for (float x : xs) {  // selectable keys round-trip
    if (LogitKey(x) >= gpu::radix::kMinSelectableKey) {
      ASSERT_EQ(gpu::BitsOfKey(LogitKey(x)), Bits(x)) << x;
    }
  }
}

// SplitPoint is floor(groups * part / cluster) without 64-bit arithmetic, and the one-CTA
// shortcut (no divisions) agrees with it.
TEST(TopKStreamPlan, SplitPointIsTheFlooredShare) {
  for (uint32_t groups : {0u, 1u, 3u, 7u, 1000u, 65535u, 1u << 20, (1u << 29) + 7u, 0xffffffffu}) {
    for (uint32_t cluster : {1u, 2u, 3u, 4u, 8u}) {
      for (uint32_t part = 0; part <= cluster; ++part) {
        const uint64_t want = uint64_t{groups} * part / cluster;
        ASSERT_EQ(gpu::SplitPoint(groups, part, cluster), want)
            << groups << " " << part << "/" << cluster;
      }
    }
  }
}

TEST(TopKStreamPlan, SegmentsCoverTheWindowInOrder) {
  for (int64_t begin : {0, 1, 2, 3, 5, 1000}) {
    for (uint32_t len : {0u, 1u, 3u, 4u, 5u, 63u, 4096u, 100003u}) {
      for (uint32_t misalign : {0u, 1u, 2u, 3u}) {
        for (uint32_t cs : {1u, 2u, 4u, 8u}) {
          uint32_t next = 0;
          for (uint32_t r = 0; r < cs; ++r) {
            const SegmentPlan s = PlanSegment(begin, len, misalign, r, cs);
            ASSERT_EQ(s.first_col, begin - misalign);
            ASSERT_EQ(s.group_lo, next);
            ASSERT_LE(s.group_lo, s.group_hi);
            next = s.group_hi;
            // Full groups lie inside the window; the others hold at least one column outside.
            for (uint32_t g = 0; g < s.groups; ++g) {
              const int64_t c = s.first_col + 4 * int64_t{g};
              const bool inside = c >= begin && c + 4 <= begin + len;
              ASSERT_EQ(inside, g >= s.full_lo && g < s.full_hi) << g;
            }
            ASSERT_GE(s.first_col + 4 * int64_t{s.groups}, begin + len);
            ASSERT_LT(s.first_col + 4 * int64_t{s.groups}, begin + len + 4);
          }
          ASSERT_EQ(next, PlanSegment(begin, len, misalign, 0, cs).groups);
        }
      }
    }
  }
}

TEST(TopKStreamPlan, SpeculationRankAndClusterSize) {
  EXPECT_EQ(gpu::SpeculationRank(2048, 0, 32768), 0u);
  EXPECT_EQ(gpu::SpeculationRank(2048, 20000, 32768), 0u);     // over half the window
  const uint32_t r = gpu::SpeculationRank(2048, 4096, 32768);  // mean 256, sd 16
  EXPECT_GE(r, 256u + 48u);
  EXPECT_LE(r, 256u + 52u);
  EXPECT_EQ(gpu::SpeculationRank(64, 10, 20), 0u);  // the rank would pass the sample
  EXPECT_EQ(gpu::ClusterSizeFor(4096, 32768, 132, 8), 1);
  EXPECT_EQ(gpu::ClusterSizeFor(128, 32768, 132, 8), 1);  // one CTA per SM already
  EXPECT_EQ(gpu::ClusterSizeFor(40, 32768, 132, 8), 2);
  EXPECT_EQ(gpu::ClusterSizeFor(8, 131072, 132, 8), 8);
  EXPECT_EQ(gpu::ClusterSizeFor(1, 131072, 132, 8), 8);
  EXPECT_EQ(gpu::ClusterSizeFor(1, 16384, 132, 8), 2);  // >= 8192 columns per CTA
  EXPECT_EQ(gpu::ClusterSizeFor(1, 131072, 132, 1), 1);
}

// ---- A sequential emulation of stream.cu.

struct EmuConfig {
  uint32_t chunk_groups = 1024;  // threads x groups per thread
  uint32_t capacity = 8192;
  uint32_t cluster = 1;
  bool speculate = true;
  uint32_t misalign = 0;
};

struct Entry {
  uint32_t key;
  int32_t col;
};

struct Choice {
  uint32_t bin = 0, above = 0, count = 0, total = 0;
  bool found = false;
};

Choice Choose(const std::vector<uint32_t>& hist, uint32_t need) {
  Choice c;
  uint32_t above = 0;
  for (int b = gpu::radix::kBins - 1; b >= 0; --b) {
    if (gpu::radix::HoldsRank(above, hist[b], need)) {
      c.bin = static_cast<uint32_t>(b);
      c.above = above;
      c.count = hist[b];
    }
    above += hist[b];
  }
  c.total = above;
  c.found = above >= need;
  return c;
}

std::vector<uint32_t> Hist(const std::vector<std::vector<Entry>>& bufs, int level,
                           const Threshold& t) {
  std::vector<uint32_t> hist(gpu::radix::kBins, 0);
  for (const auto& buf : bufs) {
    for (const Entry& e : buf) {
      if (gpu::radix::InLevel(e.key, level, t)) ++hist[gpu::radix::Digit(e.key, level)];
    }
  }
  return hist;
}

// SelectK over the given buffers (one CTA's or the cluster's).
Threshold SelectK(const std::vector<std::vector<Entry>>& bufs, uint32_t k, uint32_t* total) {
  Threshold t = gpu::radix::Start(k);
  Choice c = Choose(Hist(bufs, 0, t), k);
  *total = c.total;
  if (c.total <= k) return gpu::radix::AllSelectable();
  t = gpu::radix::Refine(t, 0, c.bin, c.above);
  for (int level = 1; level < gpu::radix::kLevels && c.count != t.need; ++level) {
    c = Choose(Hist(bufs, level, t), t.need);
    EXPECT_TRUE(c.found);
    t = gpu::radix::Refine(t, level, c.bin, c.above);
  }
  return t;
}

// The ordered pass: chosen entries in order, from counts gt / eq of lower columns.
template <class Emit>
void Ordered(const std::vector<Entry>& buf, const Threshold& t, uint32_t* gt, uint32_t* eq,
             Emit emit) {
  for (const Entry& e : buf) {
    const bool above = gpu::radix::AboveThreshold(t, e.key);
    const bool at = gpu::radix::AtThreshold(t, e.key) && e.key != 0;
    if (gpu::radix::IsChosen(t, above, at, *eq)) emit(gpu::radix::OutputPosition(t, *gt, *eq), e);
    *gt += above ? 1 : 0;
    *eq += at ? 1 : 0;
  }
}

void Compact(std::vector<Entry>& buf, const Threshold& t) {
  std::vector<Entry> kept;
  uint32_t gt = 0, eq = 0;
  Ordered(buf, t, &gt, &eq, [&](uint32_t pos, const Entry& e) {
    EXPECT_EQ(pos, kept.size());
    kept.push_back(e);
  });
  buf = kept;
}

// The output (columns in order) of the kernel on row[begin, begin + len), and how many times the
// window was streamed.
std::vector<int32_t> EmulateStream(const std::vector<float>& row, int64_t begin, uint32_t len,
                                   uint32_t k, const EmuConfig& cfg, int* passes) {
  const uint32_t cs = cfg.cluster;
  const uint32_t chunk_elems = cfg.chunk_groups * gpu::kGroupElems;
  uint32_t spec_rank = 0;
  if (cfg.speculate && gpu::Speculates(len, k)) {
    spec_rank =
        gpu::SpeculationRank(k, gpu::SampleColumns(len, cfg.misalign, cs, cfg.chunk_groups), len);
  }
  std::vector<std::vector<Entry>> bufs;
  uint32_t total = 0;
  Threshold t;
  *passes = 0;
  for (bool spec = spec_rank > 0;; spec = false) {
    ++*passes;
    bufs.assign(cs, {});
    std::vector<uint32_t> admit(cs, gpu::radix::kMinSelectableKey);
    auto append = [&](uint32_t r, uint32_t g_from, uint32_t g_to) {
      const SegmentPlan s = PlanSegment(begin, len, cfg.misalign, r, cs);
      const float floor = FloatOf(gpu::AdmitBits(admit[r]));
      for (uint32_t g = g_from; g < std::min(g_to, s.group_hi); ++g) {
        for (int q = 0; q < 4; ++q) {
          const int64_t c = s.first_col + 4 * int64_t{g} + q;
          if (c < begin || c >= begin + len) continue;
          const float x = row[static_cast<size_t>(c)];
          if (x >= floor) bufs[r].push_back({LogitKey(x), static_cast<int32_t>(c)});
        }
      }
    };
    // The first chunks: their selectable logits' level-0 histogram (summed over the cluster)
    // sets the speculative floor before they are appended.
    bool speculated = false;
    if (spec) {
      std::vector<uint32_t> hist(gpu::radix::kBins, 0);
      for (uint32_t r = 0; r < cs; ++r) {
        const SegmentPlan s = PlanSegment(begin, len, cfg.misalign, r, cs);
        for (uint32_t g = s.group_lo; g < std::min(s.group_lo + cfg.chunk_groups, s.group_hi);
             ++g) {
          for (int q = 0; q < 4; ++q) {
            const int64_t c = s.first_col + 4 * int64_t{g} + q;
            if (c < begin || c >= begin + len) continue;
            const uint32_t key = LogitKey(row[static_cast<size_t>(c)]);
            if (key >= gpu::radix::kMinSelectableKey) ++hist[gpu::radix::Digit(key, 0)];
          }
        }
      }
      const Choice c = Choose(hist, spec_rank);
      if (c.found) {
        speculated = true;
        for (uint32_t r = 0; r < cs; ++r) admit[r] = c.bin << gpu::radix::DigitShift(0);
      }
    }
    for (uint32_t r = 0; r < cs; ++r) {
      const SegmentPlan s = PlanSegment(begin, len, cfg.misalign, r, cs);
      append(r, s.group_lo, s.group_lo + cfg.chunk_groups);
    }
    for (uint32_t r = 0; r < cs; ++r) {
      const SegmentPlan s = PlanSegment(begin, len, cfg.misalign, r, cs);
      for (uint32_t g = s.group_lo + cfg.chunk_groups; g < s.group_hi; g += cfg.chunk_groups) {
        if (bufs[r].size() + chunk_elems > cfg.capacity) {
          uint32_t local_total;
          const Threshold lt = SelectK({bufs[r]}, k, &local_total);
          EXPECT_GT(local_total, k);
          Compact(bufs[r], lt);
          EXPECT_EQ(bufs[r].size(), k);
          admit[r] = std::max(admit[r], gpu::AdmitKeyAfter(lt));
        }
        append(r, g, g + cfg.chunk_groups);
        EXPECT_LE(bufs[r].size(), cfg.capacity);
      }
    }
    t = SelectK(bufs, k, &total);
    if (!(speculated && total < k)) break;
  }
  const uint32_t count = std::min(total, k);
  std::vector<int32_t> out(count, -1);
  uint32_t gt = 0, eq = 0;
  for (uint32_t r = 0; r < cs; ++r) {
    Ordered(bufs[r], t, &gt, &eq, [&](uint32_t pos, const Entry& e) {
      EXPECT_LT(pos, count);
      if (pos < count) out[pos] = e.col;
    });
  }
  return out;
}

std::vector<int32_t> CpuSelect(const std::vector<float>& row, int64_t begin, uint32_t len,
                               uint32_t k) {
  RowSelector selector;
  const int64_t count = selector.Select(row.data(), begin, begin + len, k);
  return std::vector<int32_t>(selector.cols(), selector.cols() + count);
}

// Rows for every branch: unique values, heavy ties, NaN / -inf / signed zeros, one octave (huge
// level-0 bins), all equal, a short large prefix (fewer than k past the speculative floor: a
// second pass), a small prefix (a low floor: compactions), rising values (a compaction per chunk).
std::vector<float> MakeRow(int kind, int64_t n, std::mt19937_64& rng) {
  std::vector<float> row(static_cast<size_t>(n));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> octave(1.0f, 2.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    float& x = row[static_cast<size_t>(j)];
    switch (kind) {
      case 0: x = normal(rng); break;
      case 1: x = static_cast<float>(rng() % 16); break;
      case 2: x = (rng() % 10 == 0) ? normal(rng) : ((rng() % 2) ? -inf : nan); break;
      case 3: {
        const float pick[] = {0.0f, -0.0f, 1.0f, -1.0f, nan, -nan, -inf, inf};
        x = pick[rng() % 8];
        break;
      }
      case 4: x = octave(rng); break;
      case 5: x = 0.75f; break;
      case 6: x = normal(rng) + (j < n / 64 ? 100.0f : 0.0f); break;
      case 7: x = normal(rng) - (j < n / 8 ? 100.0f : 0.0f); break;
      default: x = static_cast<float>(j) * 0.001f; break;
    }
  }
  return row;
}

TEST(TopKStreamPlan, EmulationMatchesRowSelectorExactly) {
  auto rng = MakeRng();
  struct Shape {
    uint32_t chunk_groups, capacity, k;
  };
  // Small chunks and buffers (many compactions) and the kernel's own (1024 groups, 8192).
  const Shape shapes[] = {{16, 64 + 64, 64},
                          {16, 3 * 64, 7},
                          {32, 200 + 128, 200},
                          {1024, 8192, 2048},
                          {1024, 8192, 4096}};
  int second_passes = 0, total_rows = 0;
  for (const Shape& sh : shapes) {
    for (int kind = 0; kind < 9; ++kind) {
      for (uint32_t cs : {1u, 2u, 8u}) {
        const bool big = sh.chunk_groups >= 1024;
        const int64_t n = big ? 70000 : 5000;
        const std::vector<float> row = MakeRow(kind, n, rng);
        for (int w = 0; w < 3; ++w) {
          const int64_t begin = w == 0 ? 0 : (w == 1 ? 3 : 1234);
          const uint32_t len = static_cast<uint32_t>(w == 2 ? n / 3 + 1 : n - begin);
          EmuConfig cfg;
          cfg.chunk_groups = sh.chunk_groups;
          cfg.capacity = sh.capacity;
          cfg.cluster = cs;
          cfg.speculate = (kind + w) % 4 != 3;
          cfg.misalign = static_cast<uint32_t>(begin + kind) % 4;
          SCOPED_TRACE(::testing::Message() << "kind " << kind << " k " << sh.k << " chunk "
                                            << sh.chunk_groups << " cs " << cs << " begin " << begin
                                            << " len " << len << " misalign " << cfg.misalign);
          int passes = 0;
          ASSERT_EQ(EmulateStream(row, begin, len, sh.k, cfg, &passes),
                    CpuSelect(row, begin, len, sh.k));
          second_passes += passes > 1 ? 1 : 0;
          ++total_rows;
        }
      }
    }
  }
  EXPECT_GT(second_passes, 0) << "no row exercised the speculation's fallback";
  EXPECT_LT(second_passes, total_rows / 3);
}

}  // namespace
}  // namespace attnd::kernels::topk
