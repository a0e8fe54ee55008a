// RegionTable: which registered region a host pointer range lies in (client/region_table.h).
#include "client/region_table.h"

#include <vector>

#include "gtest/gtest.h"

namespace attnd::client {
namespace {

TEST(RegionTableTest, FindsRangesInsideARegionOnly) {
  // Two regions inside one buffer with a gap between them, so neighbours are known.
  std::vector<char> buffer(2000);
  char* a = buffer.data();         // [0, 1000)
  char* b = buffer.data() + 1200;  // [1200, 1700)
  RegionTable table;
  table.Add("a", a, 1000);
  table.Add("b", b, 500);
  EXPECT_EQ(table.size(), 2u);

  std::optional<RegionTable::Hit> hit = table.Find(a + 100, 900);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->region, "a");
  EXPECT_EQ(hit->offset, 100u);
  hit = table.Find(b, 500);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->region, "b");
  EXPECT_EQ(hit->offset, 0u);

  EXPECT_FALSE(table.Find(a + 100, 901).has_value());  // one byte past the end
  EXPECT_FALSE(table.Find(b + 500, 1).has_value());
  EXPECT_FALSE(table.Find(nullptr, 0).has_value());
  EXPECT_FALSE(table.Find(a + 1100, 4).has_value());   // in the gap
  EXPECT_FALSE(table.Find(a + 990, 300).has_value());  // from a across the gap into b

  table.Remove(a);
  EXPECT_FALSE(table.Find(a, 1).has_value());
  EXPECT_TRUE(table.Find(b + 10, 10).has_value());
}

}  // namespace
}  // namespace attnd::client
