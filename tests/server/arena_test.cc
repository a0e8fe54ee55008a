// The pools' host logic (no GPU): size classes, best-fit reuse at the same offset, coalescing,
// the hard limit as RESOURCE_EXHAUSTED (the pool keeps serving), statistics, RAII blocks.
#include "server/engine/arena.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "server/engine/memory_pool.h"

namespace attnd::server::engine {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(ArenaTest, SizeClassesRoundUpWithBoundedWaste) {
  EXPECT_EQ(Arena::SizeClass(0), 256u);
  EXPECT_EQ(Arena::SizeClass(1), 256u);
  EXPECT_EQ(Arena::SizeClass(256), 256u);
  EXPECT_EQ(Arena::SizeClass(257), 512u);
  EXPECT_EQ(Arena::SizeClass(2048), 2048u);
  EXPECT_EQ(Arena::SizeClass(2049), 2304u);  // 2048 + 256
  EXPECT_EQ(Arena::SizeClass(kMiB), kMiB);
  EXPECT_EQ(Arena::SizeClass(kMiB + 1), kMiB + kMiB / 8);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t bytes = 1 + rng() % (uint64_t{64} << 30);
    const uint64_t c = Arena::SizeClass(bytes);
    ASSERT_GE(c, bytes);
    ASSERT_EQ(c % Arena::kAlignment, 0u);
    // At most one eighth wasted (or one alignment unit for small requests).
    ASSERT_LE(c - bytes, std::max<uint64_t>(bytes / 8, Arena::kAlignment)) << bytes;
    ASSERT_EQ(Arena::SizeClass(c), c) << "a class is its own class";
  }
  // Huge requests do not wrap around.
  EXPECT_GE(Arena::SizeClass(~uint64_t{0} - 5), uint64_t{1} << 63);
}

TEST(ArenaTest, FreedBlocksComeBackAtTheSameOffset) {
  Arena arena(64 * kMiB, "test");
  auto a = arena.Allocate(3 * kMiB);
  auto b = arena.Allocate(1000);
  auto c = arena.Allocate(5 * kMiB);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*a % Arena::kAlignment, 0u);
  EXPECT_EQ(*b % Arena::kAlignment, 0u);
  EXPECT_NE(*a, *b);
  ASSERT_TRUE(arena.Free(*b));
  auto b2 = arena.Allocate(999);  // same class: the same block (stable pointers, graph hits)
  ASSERT_TRUE(b2.ok());
  EXPECT_EQ(*b2, *b);
  EXPECT_FALSE(arena.Free(*b + 1)) << "not a live block";
  ASSERT_TRUE(arena.Free(*b2));
  EXPECT_FALSE(arena.Free(*b2)) << "double free is refused";
}

TEST(ArenaTest, ExhaustionIsResourceExhaustedAndTheArenaKeepsServing) {
  Arena arena(16 * kMiB, "GPU-test");
  auto big = arena.Allocate(12 * kMiB);
  ASSERT_TRUE(big.ok());
  auto too_big = arena.Allocate(8 * kMiB);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(too_big.status().message());
  EXPECT_NE(msg.find("GPU-test"), std::string::npos) << msg;
  EXPECT_NE(msg.find("8.00 MiB requested"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4.00 MiB free of 16.00 MiB"), std::string::npos) << msg;
  EXPECT_EQ(arena.stats().failures, 1u);
  auto small = arena.Allocate(kMiB);  // still serving
  ASSERT_TRUE(small.ok());
  ASSERT_TRUE(arena.Free(*big));
  auto again = arena.Allocate(8 * kMiB);
  EXPECT_TRUE(again.ok());
  EXPECT_FALSE(arena.Allocate(17 * kMiB).ok()) << "never past the reservation";
}

TEST(ArenaTest, FreeRangesCoalesce) {
  Arena arena(8 * kMiB, "test");
  std::vector<uint64_t> blocks;
  for (int i = 0; i < 8; ++i) {
    auto b = arena.Allocate(kMiB);
    ASSERT_TRUE(b.ok());
    blocks.push_back(*b);
  }
  EXPECT_FALSE(arena.Allocate(1).ok());
  // Free in an order that needs both forward and backward merges.
  for (int i : {1, 3, 2, 0, 7, 5, 6, 4}) ASSERT_TRUE(arena.Free(blocks[i]));
  EXPECT_EQ(arena.stats().largest_free, 8 * kMiB);
  auto whole = arena.Allocate(8 * kMiB);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(*whole, 0u);
}

TEST(ArenaTest, StatisticsTrackUseAndPeak) {
  Arena arena(32 * kMiB, "test");
  ArenaStats s = arena.stats();
  EXPECT_EQ(s.reserved, 32 * kMiB);
  EXPECT_EQ(s.used, 0u);
  auto a = arena.Allocate(kMiB + 1);  // class kMiB + kMiB/8
  auto b = arena.Allocate(100);       // class 256
  ASSERT_TRUE(a.ok() && b.ok());
  s = arena.stats();
  EXPECT_EQ(s.used, kMiB + kMiB / 8 + 256);
  EXPECT_EQ(s.live_blocks, 2u);
  EXPECT_EQ(s.allocations, 2u);
  arena.Free(*a);
  s = arena.stats();
  EXPECT_EQ(s.used, 256u);
  EXPECT_EQ(s.peak_used, kMiB + kMiB / 8 + 256);
  EXPECT_EQ(s.live_blocks, 1u);
}

TEST(ArenaTest, RandomAllocationsNeverOverlapAndAllReturn) {
  Arena arena(256 * kMiB, "test");
  std::mt19937_64 rng(11);
  struct Live {
    uint64_t offset, size;
  };
  std::vector<Live> live;
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const uint64_t bytes = 1 + rng() % (4 * kMiB);
      auto o = arena.Allocate(bytes);
      if (!o.ok()) {
        ASSERT_EQ(o.status().code(), absl::StatusCode::kResourceExhausted);
        continue;
      }
      const uint64_t size = Arena::SizeClass(bytes);
      ASSERT_LE(*o + size, 256 * kMiB);
      for (const Live& l : live) {
        ASSERT_TRUE(*o + size <= l.offset || l.offset + l.size <= *o) << "overlap";
      }
      live.push_back({*o, size});
    } else {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(arena.Free(live[i].offset));
      live.erase(live.begin() + static_cast<ptrdiff_t>(i));
    }
  }
  uint64_t used = 0;
  for (const Live& l : live) used += l.size;
  EXPECT_EQ(arena.stats().used, used);
  for (const Live& l : live) ASSERT_TRUE(arena.Free(l.offset));
  EXPECT_EQ(arena.stats().used, 0u);
  EXPECT_EQ(arena.stats().largest_free, 256 * kMiB);
}

TEST(MemoryPoolTest, BlocksReturnThemselves) {
  std::vector<char> memory(4 * kMiB);
  bool released = false;
  {
    MemoryPool pool("host-test", memory.data(), memory.size(),
                    [&](char* p) { released = p == memory.data(); });
    {
      auto a = pool.Allocate(kMiB);
      ASSERT_TRUE(a.ok());
      EXPECT_EQ(a->data(), memory.data());
      EXPECT_EQ(a->size(), kMiB);
      EXPECT_EQ(pool.stats().used, kMiB);
      PoolBlock moved = *std::move(a);
      EXPECT_EQ(pool.stats().used, kMiB);
      auto b = pool.Allocate(4 * kMiB);
      EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
    }
    EXPECT_EQ(pool.stats().used, 0u);
    auto c = pool.Allocate(4 * kMiB);
    ASSERT_TRUE(c.ok());
    c->Reset();
    EXPECT_EQ(pool.stats().used, 0u);
    EXPECT_FALSE(released);
  }
  EXPECT_TRUE(released);
}

TEST(FormatBytesTest, Units) {
  EXPECT_EQ(FormatBytes(12), "12 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{8} << 30), "8.00 GiB");
}

}  // namespace
}  // namespace attnd::server::engine
