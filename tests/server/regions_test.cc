// The region registry: Triton's shared-memory error matrix at the registry level, leases,
// unregister waiting for in-flight users, device handle checks, and no fd growth over 100k
// register/unregister cycles.
#include "server/regions/registry.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/regions/shm_key.h"
#include "tests/server/fake_device_opener.h"
#include "tests/server/shm_test_util.h"

namespace attnd::server::regions {
namespace {

using attnd::testing::ScopedShm;

RegionRegistry::Options Allowed() {
  RegionRegistry::Options o;
  o.allow_client_shm = true;
  return o;
}

HostRegionSpec Spec(const std::string& name, const std::string& key, uint64_t offset, uint64_t size,
                    const std::string& lease = "") {
  HostRegionSpec s;
  s.name = name;
  s.key = key;
  s.offset = offset;
  s.byte_size = size;
  s.lease = lease;
  return s;
}

int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

TEST(ShmKeyTest, AcceptsPlainKeys) {
  EXPECT_TRUE(ValidateShmKey("/a").ok());
  EXPECT_TRUE(ValidateShmKey("/attnd-client-1.kv").ok());
}

TEST(ShmKeyTest, RejectsMalformedKeys) {
  for (const char* key : {"", "/", "a", "//", "///", "/a/b", "/a/", "a/b", "/.", "/..", "/a b"}) {
    const absl::Status s = ValidateShmKey(key);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "key '" << key << "': " << s;
  }
  EXPECT_EQ(ValidateShmKey(std::string("/a\0b", 4)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateShmKey("/" + std::string(kMaxShmKeyLength, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ShmKeyTest, RejectsReservedPrefix) {
  EXPECT_EQ(ValidateShmKey("/attnd-internal").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ValidateShmKey("/attnd-internal-pool0").code(), absl::StatusCode::kPermissionDenied);
}

TEST(ShmKeyTest, RegionNames) {
  EXPECT_TRUE(ValidateRegionName("kv cache 0").ok());
  EXPECT_FALSE(ValidateRegionName("").ok());
  EXPECT_FALSE(ValidateRegionName(std::string(kMaxRegionNameLength + 1, 'a')).ok());
  EXPECT_FALSE(ValidateRegionName("a\nb").ok());
}

TEST(RegionRegistryTest, ClientShmOffByDefault) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry({});
  const absl::Status s = registry.RegisterHost(Spec("r", shm.key(), 0, 4096));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("--allow-client-shm"), absl::string_view::npos) << s;
}

TEST(RegionRegistryTest, RegisterAcquireAndReadThrough) {
  ScopedShm shm(3 * 4096);
  ASSERT_TRUE(shm.ok());
  std::memcpy(shm.data() + 5000, "hello", 5);
  RegionRegistry registry(Allowed());
  // A registration offset that is not page aligned.
  ASSERT_TRUE(registry.RegisterHost(Spec("r", shm.key(), 5000, 100)).ok());
  auto pin = registry.Acquire("r");
  ASSERT_TRUE(pin.ok()) << pin.status();
  EXPECT_EQ(std::memcmp((*pin)->data(), "hello", 5), 0);
  std::memcpy((*pin)->data() + 10, "world", 5);  // written in place, seen by the client
  EXPECT_EQ(std::memcmp(shm.data() + 5010, "world", 5), 0);
  EXPECT_EQ((*pin)->in_flight(), 1);
  const auto list = registry.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].name, "r");
  EXPECT_EQ(list[0].key, shm.key());
  EXPECT_EQ(list[0].offset, 5000u);
  EXPECT_EQ(list[0].byte_size, 100u);
  EXPECT_EQ(list[0].in_flight, 1);
}

TEST(RegionRegistryTest, UnregisterBeforeRegisterIsNotFound) {
  RegionRegistry registry(Allowed());
  EXPECT_EQ(registry.Unregister("never", "").status().code(), absl::StatusCode::kNotFound);
}

TEST(RegionRegistryTest, DuplicateNameIsAlreadyExists) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry(Allowed());
  ASSERT_TRUE(registry.RegisterHost(Spec("r", shm.key(), 0, 64)).ok());
  EXPECT_EQ(registry.RegisterHost(Spec("r", shm.key(), 64, 64)).code(),
            absl::StatusCode::kAlreadyExists);
  // After unregistering, the name is free again.
  ASSERT_TRUE(registry.Unregister("r", "").ok());
  EXPECT_TRUE(registry.RegisterHost(Spec("r", shm.key(), 64, 64)).ok());
}

TEST(RegionRegistryTest, UnknownRegionIsNotFound) {
  RegionRegistry registry(Allowed());
  EXPECT_EQ(registry.Acquire("nope").status().code(), absl::StatusCode::kNotFound);
}

// A name no registration could have used answers the naming rule's INVALID_ARGUMENT, with a
// bounded message, instead of a NOT_FOUND that echoes it (docs/SERVICE.md "Status codes").
TEST(RegionRegistryTest, UnregistrableNameIsInvalidAndNotEchoed) {
  RegionRegistry registry(Allowed());
  const std::string huge(1 << 20, 'a');
  for (const std::string& name : {huge, std::string("a\nb")}) {
    const absl::Status acquire = registry.Acquire(name).status();
    EXPECT_EQ(acquire.code(), absl::StatusCode::kInvalidArgument) << acquire;
    EXPECT_LT(acquire.message().size(), 2048u);
    const absl::Status unregister = registry.Unregister(name, "").status();
    EXPECT_EQ(unregister.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_LT(unregister.message().size(), 2048u);
  }
}

TEST(RegionRegistryTest, UnknownShmObjectIsNotFound) {
  RegionRegistry registry(Allowed());
  EXPECT_EQ(registry.RegisterHost(Spec("r", "/attnd-test-does-not-exist", 0, 64)).code(),
            absl::StatusCode::kNotFound);
}

TEST(RegionRegistryTest, RangeErrorMatrix) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry(Allowed());
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  struct Case {
    const char* what;
    uint64_t offset;
    uint64_t size;
  } cases[] = {
      {"offset == size", 4096, 1},
      {"offset > size", 8192, 1},
      {"offset + size past the end", 4000, 200},
      {"size past the object's size", 0, 4097},
      {"2^64 overflow", max - 10, 100},
      {"2^64 overflow, huge size", 1, max},
      {"zero size", 0, 0},
  };
  for (const Case& c : cases) {
    const absl::Status s = registry.RegisterHost(Spec("r", shm.key(), c.offset, c.size));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
  }
  EXPECT_TRUE(registry.List().empty());
  EXPECT_TRUE(registry.RegisterHost(Spec("whole", shm.key(), 0, 4096)).ok());
  EXPECT_TRUE(registry.RegisterHost(Spec("last byte", shm.key(), 4095, 1)).ok());
}

TEST(RegionRegistryTest, BadKeysAndNamesRefused) {
  RegionRegistry registry(Allowed());
  EXPECT_EQ(registry.RegisterHost(Spec("r", "/", 0, 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.RegisterHost(Spec("r", "//", 0, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.RegisterHost(Spec("r", "/a/b", 0, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.RegisterHost(Spec("r", "/attnd-internal-x", 0, 1)).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry.RegisterHost(Spec("", "/x", 0, 1)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RegionRegistryTest, UnregisterAllRemovesOnlyUnleasedRegions) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry(Allowed());
  const std::string lease = registry.OpenLease();
  ASSERT_TRUE(registry.RegisterHost(Spec("a", shm.key(), 0, 64)).ok());
  ASSERT_TRUE(registry.RegisterHost(Spec("b", shm.key(), 64, 64)).ok());
  ASSERT_TRUE(registry.RegisterHost(Spec("c", shm.key(), 128, 64, lease)).ok());
  auto removed = registry.Unregister("", "");
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->size(), 2u);
  ASSERT_EQ(registry.List().size(), 1u);
  EXPECT_EQ(registry.List()[0].name, "c");
  removed = registry.Unregister("", lease);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, std::vector<std::string>{"c"});
  EXPECT_TRUE(registry.List().empty());
  // Unregister-all with nothing registered is fine.
  EXPECT_TRUE(registry.Unregister("", "").ok());
}

TEST(RegionRegistryTest, LeaseRegionsGoWhenTheLeaseCloses) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry(Allowed());
  EXPECT_EQ(registry.RegisterHost(Spec("r", shm.key(), 0, 64, "lease-unknown")).code(),
            absl::StatusCode::kNotFound);
  const std::string lease = registry.OpenLease();
  EXPECT_TRUE(registry.LeaseOpen(lease));
  ASSERT_TRUE(registry.RegisterHost(Spec("r", shm.key(), 0, 64, lease)).ok());
  // Another lease cannot remove it by name.
  const std::string other = registry.OpenLease();
  EXPECT_EQ(registry.Unregister("r", other).status().code(), absl::StatusCode::kNotFound);
  registry.CloseLease(lease);
  EXPECT_FALSE(registry.LeaseOpen(lease));
  EXPECT_TRUE(registry.List().empty());
  int64_t count, bytes;
  registry.Totals(RegionKind::kHost, &count, &bytes);
  EXPECT_EQ(count, 0);
  EXPECT_EQ(bytes, 0);
  EXPECT_EQ(registry.RegisterHost(Spec("r2", shm.key(), 0, 64, lease)).code(),
            absl::StatusCode::kNotFound);
}

TEST(RegionRegistryTest, UnregisterWaitsForInFlightUsers) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry(Allowed());
  ASSERT_TRUE(registry.RegisterHost(Spec("r", shm.key(), 0, 4096)).ok());
  auto pin = registry.Acquire("r");
  ASSERT_TRUE(pin.ok());
  std::atomic<bool> done{false};
  std::vector<std::string> removed;
  ASSERT_TRUE(registry
                  .UnregisterAsync("r", "",
                                   [&](std::vector<std::string> names) {
                                     removed = std::move(names);
                                     done = true;
                                   })
                  .ok());
  EXPECT_FALSE(done.load());  // the pinned request still uses it
  EXPECT_EQ(registry.Acquire("r").status().code(), absl::StatusCode::kNotFound);
  (*pin)->data()[0] = 42;  // still mapped
  int64_t count, bytes;
  registry.Totals(RegionKind::kHost, &count, &bytes);
  EXPECT_EQ(count, 1);
  *pin = RegionPin();  // the request ends
  EXPECT_TRUE(done.load());
  EXPECT_EQ(removed, std::vector<std::string>{"r"});
  registry.Totals(RegionKind::kHost, &count, &bytes);
  EXPECT_EQ(count, 0);
  EXPECT_EQ(shm.data()[0], 42);
}

TEST(RegionRegistryTest, BlockingUnregisterReturnsAfterTheLastPin) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry(Allowed());
  ASSERT_TRUE(registry.RegisterHost(Spec("r", shm.key(), 0, 4096)).ok());
  auto pin = registry.Acquire("r");
  ASSERT_TRUE(pin.ok());
  std::atomic<bool> returned{false};
  std::thread t([&] {
    EXPECT_TRUE(registry.Unregister("r", "").ok());
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load());
  *pin = RegionPin();
  t.join();
  EXPECT_TRUE(returned.load());
}

using FakeOpener = attnd::server::testing::FakeDeviceOpener;

class FakePinner : public HostPinner {
 public:
  absl::Status Pin(void* p, size_t bytes) override ABSL_LOCKS_EXCLUDED(mu) {
    if (fail) return absl::InternalError("cannot pin");
    absl::MutexLock lock(&mu);
    pinned[p] = bytes;
    return absl::OkStatus();
  }
  void Unpin(void* p) override ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    unpinned.push_back(p);
    pinned.erase(p);
  }
  bool fail = false;
  absl::Mutex mu;
  std::map<void*, size_t> pinned ABSL_GUARDED_BY(mu);
  std::vector<void*> unpinned ABSL_GUARDED_BY(mu);
};

TEST(RegionRegistryTest, DeviceRegionsOnTheCpuDaemon) {
  RegionRegistry registry(Allowed());
  DeviceRegionSpec spec;
  spec.name = "d";
  spec.raw_handle = std::string(63, 'h');
  spec.byte_size = 1 << 20;
  EXPECT_EQ(registry.RegisterDevice(spec).code(), absl::StatusCode::kInvalidArgument);
  spec.raw_handle = std::string(65, 'h');
  EXPECT_EQ(registry.RegisterDevice(spec).code(), absl::StatusCode::kInvalidArgument);
  spec.raw_handle = std::string(64, 'h');
  const absl::Status s = registry.RegisterDevice(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("--backend=cuda|hip"), absl::string_view::npos) << s;
}

TEST(RegionRegistryTest, NamesAreOneNamespaceAcrossKinds) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry::Options o = Allowed();
  o.device_opener = std::make_shared<FakeOpener>(1 << 20);
  RegionRegistry registry(o);
  DeviceRegionSpec spec;
  spec.name = "x";
  spec.raw_handle = std::string(64, 'h');
  spec.byte_size = 4096;
  ASSERT_TRUE(registry.RegisterDevice(spec).ok());
  EXPECT_EQ(registry.RegisterHost(Spec("x", shm.key(), 0, 64)).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(registry.RegisterHost(Spec("y", shm.key(), 0, 64)).ok());
  spec.name = "y";
  EXPECT_EQ(registry.RegisterDevice(spec).code(), absl::StatusCode::kAlreadyExists);
  spec.offset = std::numeric_limits<uint64_t>::max();
  spec.name = "z";
  EXPECT_EQ(registry.RegisterDevice(spec).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RegionRegistryTest, DeviceRegionsShareOneMappingPerAllocation) {
  auto opener = std::make_shared<FakeOpener>(1 << 20);
  RegionRegistry::Options o = Allowed();
  o.device_opener = opener;
  RegionRegistry registry(o);
  DeviceRegionSpec spec;
  spec.raw_handle = std::string(64, 'a');
  spec.name = "q";
  spec.offset = 0;
  spec.byte_size = 4096;
  ASSERT_TRUE(registry.RegisterDevice(spec).ok());
  spec.name = "kv";
  spec.offset = 8192;
  ASSERT_TRUE(registry.RegisterDevice(spec).ok());
  spec.name = "past";
  spec.offset = (1 << 20) - 10;
  EXPECT_EQ(registry.RegisterDevice(spec).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(opener->opened.load(), 1);  // one allocation, opened once
  auto q = registry.Acquire("q");
  auto kv = registry.Acquire("kv");
  ASSERT_TRUE(q.ok() && kv.ok());
  EXPECT_EQ((*q)->data(), nullptr);  // device memory: never a host pointer
  EXPECT_EQ((*kv)->device_data() - (*q)->device_data(), 8192);
  EXPECT_EQ((*q)->device_ordinal(), 3);
  EXPECT_EQ((*q)->description().device_uuid, "GPU-00000000-0000-0000-0000-000000000003");
  // Unregistered while pinned: the mapping stays until the last request lets go.
  ASSERT_TRUE(registry.UnregisterAsync("", "", nullptr).ok());
  EXPECT_EQ(opener->closed.load(), 0);
  *q = RegionPin();
  EXPECT_EQ(opener->closed.load(), 0);
  *kv = RegionPin();
  EXPECT_EQ(opener->closed.load(), 1);
  // Registered again: opened again.
  spec.name = "q2";
  spec.offset = 0;
  ASSERT_TRUE(registry.RegisterDevice(spec).ok());
  EXPECT_EQ(opener->opened.load(), 2);
}

TEST(RegionRegistryTest, HostRegionsArePinnedWhileMapped) {
  ScopedShm shm(3 * 4096);
  ASSERT_TRUE(shm.ok());
  auto pinner = std::make_shared<FakePinner>();
  RegionRegistry::Options o = Allowed();
  o.host_pinner = pinner;
  std::vector<std::string> failures;
  o.on_pin_failure = [&](const std::string& name, const absl::Status&) {
    failures.push_back(name);
  };
  RegionRegistry registry(o);
  ASSERT_TRUE(registry.RegisterHost(Spec("h", shm.key(), 4096 + 100, 200)).ok());
  {
    auto pin = registry.Acquire("h");
    ASSERT_TRUE(pin.ok());
    EXPECT_TRUE((*pin)->pinned());
    absl::MutexLock lock(&pinner->mu);
    ASSERT_EQ(pinner->pinned.size(), 1u);
    // The whole page-aligned mapping is pinned, and it covers the region.
    char* base = static_cast<char*>(pinner->pinned.begin()->first);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % 4096, 0u);
    EXPECT_LE(base, (*pin)->data());
    EXPECT_GE(base + pinner->pinned.begin()->second, (*pin)->data() + 200);
  }
  ASSERT_TRUE(registry.Unregister("h", "").ok());
  {
    absl::MutexLock lock(&pinner->mu);
    EXPECT_TRUE(pinner->pinned.empty());
    EXPECT_EQ(pinner->unpinned.size(), 1u);
  }
  // A region that cannot be pinned still registers (copies are staged), and says so.
  pinner->fail = true;
  ASSERT_TRUE(registry.RegisterHost(Spec("u", shm.key(), 0, 64)).ok());
  auto pin = registry.Acquire("u");
  ASSERT_TRUE(pin.ok());
  EXPECT_FALSE((*pin)->pinned());
  EXPECT_EQ(failures, std::vector<std::string>{"u"});
}

// A pinner whose Release runs later (the GPU backend's teardown thread): the mapping stays mapped,
// and counts against max_host_mappings, until the unpin has run.
class DeferringPinner : public FakePinner {
 public:
  void Release(void* p, std::function<void()> then) override ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    later.emplace_back(p, std::move(then));
  }
  void RunLater() ABSL_LOCKS_EXCLUDED(mu) {
    std::vector<std::pair<void*, std::function<void()>>> now;
    {
      absl::MutexLock lock(&mu);
      now.swap(later);
    }
    for (auto& [p, then] : now) {
      Unpin(p);
      then();
    }
  }
  std::vector<std::pair<void*, std::function<void()>>> later ABSL_GUARDED_BY(mu);
};

TEST(RegionRegistryTest, ADeferredUnpinKeepsTheMappingUntilItRuns) {
  ScopedShm a(4096), b(4096);
  ASSERT_TRUE(a.ok() && b.ok());
  std::memset(a.data(), 5, 4096);
  auto pinner = std::make_shared<DeferringPinner>();
  RegionRegistry::Options o = Allowed();
  o.host_pinner = pinner;
  o.max_host_mappings = 1;
  RegionRegistry registry(o);
  ASSERT_TRUE(registry.RegisterHost(Spec("a", a.key(), 0, 4096)).ok());
  const char* mapped = nullptr;
  {
    auto pin = registry.Acquire("a");
    ASSERT_TRUE(pin.ok());
    mapped = (*pin)->data();
  }
  ASSERT_TRUE(registry.Unregister("a", "").ok());
  {
    absl::MutexLock lock(&pinner->mu);
    ASSERT_EQ(pinner->later.size(), 1u);  // handed over, not unpinned yet
    EXPECT_EQ(pinner->pinned.size(), 1u);
  }
  // Still mapped (the unpin has not run) and still counted.
  EXPECT_EQ(mapped[4095], 5);
  EXPECT_EQ(registry.RegisterHost(Spec("b", b.key(), 0, 4096)).code(),
            absl::StatusCode::kResourceExhausted);
  pinner->RunLater();
  {
    absl::MutexLock lock(&pinner->mu);
    EXPECT_TRUE(pinner->pinned.empty());
  }
  EXPECT_TRUE(registry.RegisterHost(Spec("b", b.key(), 0, 4096)).ok());
}

// A GPU backend copies pinned pages with DMA, which never faults after the object shrinks: the
// registry must see a truncation no CPU access has met yet (Region::truncated probes).
TEST(RegionRegistryTest, TruncationIsSeenBeforeAnyAccessFaults) {
  ScopedShm shm(2 * 4096);
  ASSERT_TRUE(shm.ok());
  std::memset(shm.data(), 7, 2 * 4096);
  RegionRegistry registry(Allowed());
  ASSERT_TRUE(registry.RegisterHost(Spec("t", shm.key(), 0, 2 * 4096)).ok());
  auto pin = registry.Acquire("t");
  ASSERT_TRUE(pin.ok());
  EXPECT_FALSE((*pin)->truncated());
  const int fd = shm_open(shm.key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);  // the region's second page is gone
  close(fd);
  EXPECT_TRUE((*pin)->truncated());
  EXPECT_TRUE((*pin)->truncated());  // sticky
}

TEST(RegionRegistryTest, StatsCallbackFollowsTheMappings) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  int64_t last_count = -1, last_bytes = -1;
  RegionRegistry::Options o = Allowed();
  o.on_stats = [&](RegionKind kind, int64_t count, int64_t bytes) {
    if (kind == RegionKind::kHost) {
      last_count = count;
      last_bytes = bytes;
    }
  };
  RegionRegistry registry(o);
  ASSERT_TRUE(registry.RegisterHost(Spec("a", shm.key(), 0, 100)).ok());
  ASSERT_TRUE(registry.RegisterHost(Spec("b", shm.key(), 0, 28)).ok());
  EXPECT_EQ(last_count, 2);
  EXPECT_EQ(last_bytes, 128);
  ASSERT_TRUE(registry.Unregister("a", "").ok());
  EXPECT_EQ(last_count, 1);
  EXPECT_EQ(last_bytes, 28);
}

TEST(RegionRegistryTest, HundredThousandCyclesLeakNoFds) {
  ScopedShm shm(1 << 16);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry(Allowed());
  const int fds_before = OpenFds();
  for (int i = 0; i < 100000; ++i) {
    ASSERT_TRUE(registry.RegisterHost(Spec("cycle", shm.key(), (i % 16) * 64, 4096)).ok());
    ASSERT_TRUE(registry.Unregister("cycle", "").ok());
  }
  EXPECT_EQ(OpenFds(), fds_before);
  int64_t count, bytes;
  registry.Totals(RegionKind::kHost, &count, &bytes);
  EXPECT_EQ(count, 0);
}

}  // namespace
}  // namespace attnd::server::regions
