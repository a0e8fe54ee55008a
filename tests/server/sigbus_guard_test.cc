// The SIGBUS guard of host mappings: a client that truncates its shm object under a registered
// mapping costs the daemon zero pages and a flag, never the process; a SIGBUS outside guarded
// ranges is not swallowed.
#include "server/regions/sigbus_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "server/regions/host_mapping.h"
#include "tests/server/shm_test_util.h"

namespace attnd::server::regions {
namespace {

using attnd::testing::ScopedShm;

constexpr int64_t kPage = 4096;

void Shrink(const ScopedShm& shm, int64_t size) {
  ASSERT_EQ(truncate(("/dev/shm" + shm.key()).c_str(), size), 0) << strerror(errno);
}

TEST(SigbusGuardTest, TruncatedObjectGivesZeroPagesAndAFlag) {
  ScopedShm shm(8 * kPage);
  ASSERT_TRUE(shm.ok());
  std::memset(shm.data(), 0x5a, 8 * kPage);
  absl::StatusOr<HostMapping> m = HostMapping::Map(shm.key(), kPage, 6 * kPage);
  ASSERT_TRUE(m.ok()) << m.status();
  ScopedShm other(kPage);
  absl::StatusOr<HostMapping> untouched = HostMapping::Map(other.key(), 0, kPage);
  ASSERT_TRUE(untouched.ok()) << untouched.status();
  EXPECT_FALSE(m->faulted());

  Shrink(shm, 3 * kPage);  // the mapping's pages 2.. are past the object's end now
  volatile char* p = m->data();
  EXPECT_EQ(p[0], 0x5a);  // still inside the object
  EXPECT_EQ(p[kPage], 0x5a);
  EXPECT_FALSE(m->faulted());
  EXPECT_EQ(p[3 * kPage + 7], 0);  // past it: a zero page instead of SIGBUS
  EXPECT_TRUE(m->faulted());
  p[5 * kPage] = 1;  // writes land in private memory
  EXPECT_EQ(p[5 * kPage], 1);
  EXPECT_EQ(p[0], 0x5a);  // pages before the fault keep the object's bytes
  EXPECT_FALSE(untouched->faulted());

  // Shrinking further: the pages before the first fault fault too.
  Shrink(shm, 0);
  EXPECT_EQ(p[0], 0);
  EXPECT_TRUE(m->faulted());
  m->Reset();
}

TEST(SigbusGuardTest, RangesComeAndGo) {
  for (int i = 0; i < 100; ++i) {
    ScopedShm shm(kPage);
    ASSERT_TRUE(shm.ok());
    absl::StatusOr<HostMapping> m = HostMapping::Map(shm.key(), 0, kPage);
    ASSERT_TRUE(m.ok()) << m.status();
    Shrink(shm, 0);
    EXPECT_EQ(m->data()[kPage - 1], 0);
    EXPECT_TRUE(m->faulted());
  }
  // A fresh mapping in a reused slot starts clean.
  ScopedShm shm(kPage);
  absl::StatusOr<HostMapping> m = HostMapping::Map(shm.key(), 0, kPage);
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE(m->faulted());
}

TEST(SigbusGuardDeathTest, OtherSigbusKeepsItsDefaultAction) {
  ASSERT_TRUE(InstallSigbusGuard().ok());
  // A file mapping that is not guarded: an access past the end of the file still kills.
  EXPECT_EXIT(
      {
        ScopedShm shm(2 * kPage);
        const int fd = shm_open(shm.key().c_str(), O_RDWR, 0);
        void* p = mmap(nullptr, 2 * kPage, PROT_READ, MAP_SHARED, fd, 0);
        // This process dies below, before ScopedShm would unlink the name: unlink it now (the
        // mapping stays), so no object is left in /dev/shm; shrink through the descriptor.
        shm_unlink(shm.key().c_str());
        if (ftruncate(fd, 0) != 0) _exit(1);
        volatile char c = static_cast<volatile char*>(p)[kPage];
        (void)c;
        _exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
  EXPECT_EXIT(raise(SIGBUS), ::testing::KilledBySignal(SIGBUS), "");
}

}  // namespace
}  // namespace attnd::server::regions
