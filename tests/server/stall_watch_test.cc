// StallWatch (server/engine/stall_watch.h): a wait past the limit is reported once, with its tag
// and text; waits that end in time, and ended tokens, never are; the thread stops cleanly.
#include "server/engine/stall_watch.h"

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace attnd::server::engine {
namespace {

struct Seen {
  absl::Mutex mu;
  std::vector<std::pair<int, std::string>> reports ABSL_GUARDED_BY(mu);
  absl::Duration last_waited ABSL_GUARDED_BY(mu);
  StallWatch::OnStall Callback() {
    return [this](int tag, const std::string& what, absl::Duration waited) {
      absl::MutexLock lock(&mu);
      reports.emplace_back(tag, what);
      last_waited = waited;
    };
  }
  size_t count() {
    absl::MutexLock lock(&mu);
    return reports.size();
  }
  // Waits up to `limit` for at least n reports.
  bool WaitFor(size_t n, absl::Duration limit) {
    absl::MutexLock lock(&mu);
    const auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return reports.size() >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&enough), limit);
  }
};

TEST(StallWatchTest, ReportsAWaitPastTheLimitOnceWithItsTagAndText) {
  Seen seen;
  StallWatch watch(absl::Milliseconds(50), seen.Callback(), absl::Milliseconds(5));
  StallWatch::Token t = watch.Begin(3, "running sparse_mla on GPU-x");
  ASSERT_TRUE(seen.WaitFor(1, absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(100));  // more periods: still one report
  EXPECT_EQ(seen.count(), 1u);
  EXPECT_EQ(watch.stalls(), 1);
  {
    absl::MutexLock lock(&seen.mu);
    EXPECT_EQ(seen.reports[0].first, 3);
    EXPECT_EQ(seen.reports[0].second, "running sparse_mla on GPU-x");
    EXPECT_GE(seen.last_waited, absl::Milliseconds(50));
  }
  EXPECT_EQ(watch.waiting(), 1);
  t.End();
  EXPECT_EQ(watch.waiting(), 0);
}

TEST(StallWatchTest, WaitsThatEndInTimeAreNeverReported) {
  Seen seen;
  // A limit far above the 2 ms waits, so that a test thread descheduled mid-wait on a loaded
  // machine does not make one of them a real stall.
  StallWatch watch(absl::Seconds(1), seen.Callback(), absl::Milliseconds(5));
  for (int i = 0; i < 20; ++i) {
    StallWatch::Token t = watch.Begin(i, "short");
    absl::SleepFor(absl::Milliseconds(2));
  }
  absl::SleepFor(absl::Milliseconds(1100));  // past the limit of every one of them
  EXPECT_EQ(seen.count(), 0u);
  EXPECT_EQ(watch.stalls(), 0);
  EXPECT_EQ(watch.waiting(), 0);
}

TEST(StallWatchTest, OnlyTheStalledWaitOfSeveralIsReported) {
  Seen seen;
  StallWatch watch(absl::Seconds(1), seen.Callback(), absl::Milliseconds(5));  // (as above)
  StallWatch::Token stuck = watch.Begin(1, "stuck");
  for (int i = 0; i < 10; ++i) {
    StallWatch::Token t = watch.Begin(2, "quick");
    absl::SleepFor(absl::Milliseconds(3));
  }
  ASSERT_TRUE(seen.WaitFor(1, absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(50));
  absl::MutexLock lock(&seen.mu);
  ASSERT_EQ(seen.reports.size(), 1u);
  EXPECT_EQ(seen.reports[0].first, 1);
}

TEST(StallWatchTest, MovedTokensEndOnceAndDefaultTokensWatchNothing) {
  Seen seen;
  StallWatch watch(absl::Seconds(60), seen.Callback(), absl::Milliseconds(5));
  StallWatch::Token a = watch.Begin(0, "a");
  StallWatch::Token b = std::move(a);
  EXPECT_EQ(watch.waiting(), 1);
  a.End();  // moved from: nothing
  EXPECT_EQ(watch.waiting(), 1);
  StallWatch::Token c = watch.Begin(0, "c");
  b = std::move(c);  // ends b's wait, takes c's
  EXPECT_EQ(watch.waiting(), 1);
  StallWatch::Token none;
  none.End();
  b.End();
  EXPECT_EQ(watch.waiting(), 0);
}

TEST(StallWatchTest, StopsAfterTheCallbackInProgress) {
  std::atomic<int> calls{0};
  {
    StallWatch watch(
        absl::Milliseconds(10),
        [&calls](int, const std::string&, absl::Duration) {
          calls.fetch_add(1);
          absl::SleepFor(absl::Milliseconds(50));  // the destructor waits for it
        },
        absl::Milliseconds(2));
    StallWatch::Token t = watch.Begin(0, "held past the watch's end");
    const absl::Time until = absl::Now() + absl::Seconds(10);  // reported: the callback runs
    while (calls.load() == 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
    t.End();
  }
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace attnd::server::engine
