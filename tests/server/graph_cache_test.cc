// The graph cache's host logic (no GPU): hit / update / capture decisions from launch keys and
// pointers, LRU eviction that destroys executables, replacement.
#include "server/engine/graph_cache.h"

#include <vector>

#include "gtest/gtest.h"

namespace attnd::server::engine {
namespace {

// Fake executables: integers whose destruction is recorded.
struct Destroyed {
  std::vector<intptr_t> ids;
  std::function<void(void*)> fn() {
    return [this](void* p) { ids.push_back(reinterpret_cast<intptr_t>(p)); };
  }
};

void* Exec(intptr_t id) { return reinterpret_cast<void*>(id); }

TEST(GraphCacheTest, PlanFromKeyAndPointers) {
  int a = 0, b = 0;
  const std::vector<const void*> pa = {&a, &b}, pb = {&b, &a};
  EXPECT_EQ(GraphCache::Plan(nullptr, pa), GraphResult::kCapture);
  GraphCache::Entry e;
  e.exec = Exec(1);
  e.pointers = pa;
  EXPECT_EQ(GraphCache::Plan(&e, pa), GraphResult::kHit);
  EXPECT_EQ(GraphCache::Plan(&e, pb), GraphResult::kUpdate);
  EXPECT_EQ(GraphCache::Plan(&e, {&a}), GraphResult::kUpdate);
  e.exec = nullptr;  // an entry without an executable must be captured
  EXPECT_EQ(GraphCache::Plan(&e, pa), GraphResult::kCapture);
  EXPECT_STREQ(GraphResultName(GraphResult::kHit), "hit");
  EXPECT_STREQ(GraphResultName(GraphResult::kUpdate), "update");
  EXPECT_STREQ(GraphResultName(GraphResult::kCapture), "capture");
}

TEST(GraphCacheTest, LeastRecentlyUsedIsEvictedAndDestroyed) {
  Destroyed d;
  {
    GraphCache cache(2, d.fn());
    cache.Insert("k1", {Exec(1), {}, true});
    cache.Insert("k2", {Exec(2), {}, true});
    ASSERT_NE(cache.Find("k1"), nullptr);  // k1 is now most recent
    cache.Insert("k3", {Exec(3), {}, true});
    EXPECT_EQ(cache.size(), 2u);
    EXPECT_EQ(cache.Find("k2"), nullptr);
    EXPECT_EQ(d.ids, std::vector<intptr_t>{2});
    ASSERT_NE(cache.Find("k1"), nullptr);
    EXPECT_EQ(cache.Find("k1")->exec, Exec(1));
    // Replacing an entry destroys the old executable, not the new one.
    cache.Insert("k1", {Exec(4), {}, true});
    EXPECT_EQ(d.ids, (std::vector<intptr_t>{2, 1}));
    EXPECT_EQ(cache.Find("k1")->exec, Exec(4));
    cache.Erase("k3");
    EXPECT_EQ(d.ids, (std::vector<intptr_t>{2, 1, 3}));
    EXPECT_EQ(cache.size(), 1u);
  }
  EXPECT_EQ(d.ids, (std::vector<intptr_t>{2, 1, 3, 4})) << "the rest go with the cache";
}

TEST(GraphCacheTest, UpdatingPointersInPlaceKeepsTheEntry) {
  Destroyed d;
  GraphCache cache(4, d.fn());
  int x = 0, y = 0;
  GraphCache::Entry* e = cache.Insert("op", {Exec(7), {&x}, true});
  EXPECT_EQ(GraphCache::Plan(cache.Find("op"), {&y}), GraphResult::kUpdate);
  e->pointers = {&y};  // what the runner does after a successful executable update
  EXPECT_EQ(GraphCache::Plan(cache.Find("op"), {&y}), GraphResult::kHit);
  EXPECT_TRUE(d.ids.empty());
}

TEST(GraphCacheTest, UncapturableKeysAreRemembered) {
  Destroyed d;
  GraphCache cache(4, d.fn());
  GraphCache::Entry direct;
  direct.capturable = false;
  cache.Insert("bad", direct);
  ASSERT_NE(cache.Find("bad"), nullptr);
  EXPECT_FALSE(cache.Find("bad")->capturable);
  cache.Clear();
  EXPECT_TRUE(d.ids.empty()) << "no executable to destroy";
}

TEST(GraphCacheTest, CapacityIsAtLeastOne) {
  Destroyed d;
  GraphCache cache(0, d.fn());
  cache.Insert("a", {Exec(1), {}, true});
  cache.Insert("b", {Exec(2), {}, true});
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_NE(cache.Find("b"), nullptr);
}

}  // namespace
}  // namespace attnd::server::engine
