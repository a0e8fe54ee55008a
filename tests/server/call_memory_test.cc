// The host memory budget of calls: per-client and total limits, reservations returned when a
// call's memory goes, and refusals that name the flag to raise.
#include "server/engine/call_memory.h"

#include "gtest/gtest.h"

namespace attnd::server::engine {
namespace {

TEST(CallMemoryBudgetTest, PerClientAndTotalLimits) {
  CallMemoryBudget budget({/*total_bytes=*/100, /*per_client_bytes=*/60});
  ASSERT_TRUE(budget.Reserve("a", 60, "out").ok());
  absl::Status s = budget.Reserve("a", 1, "lse");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("lse of 1 bytes"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("--call-memory-bytes-per-client"), absl::string_view::npos) << s;
  ASSERT_TRUE(budget.Reserve("b", 40, "out").ok());
  s = budget.Reserve("c", 1, "out");  // c has room of its own, the daemon has none
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("(--call-memory-bytes)"), absl::string_view::npos) << s;
  EXPECT_EQ(budget.used(), 100u);
  budget.Release("a", 60);
  EXPECT_EQ(budget.used_by("a"), 0u);
  EXPECT_TRUE(budget.Reserve("c", 60, "out").ok());
}

TEST(CallMemoryBudgetTest, HugeRequestsNeverWrap) {
  CallMemoryBudget budget({/*total_bytes=*/1 << 20, /*per_client_bytes=*/1 << 20});
  ASSERT_TRUE(budget.Reserve("a", 10, "x").ok());
  EXPECT_FALSE(budget.Reserve("a", ~uint64_t{0} - 5, "x").ok());
  EXPECT_FALSE(budget.Reserve("b", ~uint64_t{0}, "x").ok());
  EXPECT_EQ(budget.used(), 10u);
}

TEST(CallMemoryTest, ReturnsItsBytesWhenDestroyed) {
  CallMemoryBudget budget({/*total_bytes=*/100, /*per_client_bytes=*/100});
  {
    CallMemory call(&budget, "uid:1000");
    ASSERT_TRUE(call.Reserve(30, "out").ok());
    ASSERT_TRUE(call.Reserve(20, "copy").ok());
    EXPECT_FALSE(call.Reserve(51, "more").ok());
    EXPECT_EQ(call.bytes(), 50u);
    EXPECT_EQ(budget.used_by("uid:1000"), 50u);
  }
  EXPECT_EQ(budget.used(), 0u);
  CallMemory unbudgeted(nullptr, "x");
  EXPECT_TRUE(unbudgeted.Reserve(~uint64_t{0}, "anything").ok());
}

}  // namespace
}  // namespace attnd::server::engine
