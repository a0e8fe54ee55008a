// The registry's owners (docs/SERVICE.md "Trust model"): per-owner namespaces of region names,
// leases that only their owner can use, the per-owner cap, shm objects checked against the
// caller's uid, and one mapping however often an object's range is registered.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/regions/registry.h"
#include "tests/server/shm_test_util.h"

namespace attnd::server::regions {
namespace {

using attnd::testing::ScopedShm;

RegionRegistry::Options Allowed() {
  RegionRegistry::Options o;
  o.allow_client_shm = true;
  return o;
}

HostRegionSpec Spec(const std::string& owner, const std::string& name, const std::string& key,
                    uint64_t offset = 0, uint64_t size = 64, const std::string& lease = "") {
  HostRegionSpec s;
  s.owner = owner;
  s.name = name;
  s.key = key;
  s.offset = offset;
  s.byte_size = size;
  s.lease = lease;
  return s;
}

std::vector<std::string> Names(const std::vector<RegionDescription>& regions) {
  std::vector<std::string> names;
  for (const RegionDescription& d : regions) names.push_back(d.name);
  return names;
}

int MapCount() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) ++n;
  return n;
}

TEST(RegionOwnersTest, EachOwnerHasItsOwnNamespace) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry(Allowed());
  ASSERT_TRUE(registry.RegisterHost(Spec("uid:1", "kv", shm.key(), 0)).ok());
  ASSERT_TRUE(registry.RegisterHost(Spec("uid:1", "kv2", shm.key(), 64)).ok());
  // Another owner neither sees nor uses nor removes them, and takes the same name for its own.
  EXPECT_TRUE(registry.List("uid:2").empty());
  EXPECT_EQ(registry.Acquire("uid:2", "kv").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Unregister("uid:2", "kv", "").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(registry.RegisterHost(Spec("uid:2", "kv", shm.key(), 128)).ok());
  // An unregister-all removes the caller's unleased regions only.
  auto removed = registry.Unregister("uid:2", "", "");
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, std::vector<std::string>{"kv"});
  EXPECT_EQ(Names(registry.List("uid:1")), (std::vector<std::string>{"kv", "kv2"}));
  // The owner's own name still resolves to its own bytes.
  auto pin = registry.Acquire("uid:1", "kv");
  ASSERT_TRUE(pin.ok());
  EXPECT_EQ((*pin)->description().owner, "uid:1");
  EXPECT_EQ((*pin)->description().offset, 0u);
  EXPECT_EQ(registry.Acquire("", "kv").status().code(), absl::StatusCode::kNotFound);
}

TEST(RegionOwnersTest, LeasesBelongToTheirOwner) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry(Allowed());
  const std::string lease = registry.OpenLease("uid:1");
  ASSERT_TRUE(registry.RegisterHost(Spec("uid:1", "a", shm.key(), 0, 64, lease)).ok());
  // Another owner can neither join the lease nor wipe it.
  EXPECT_EQ(registry.RegisterHost(Spec("uid:2", "b", shm.key(), 0, 64, lease)).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Unregister("uid:2", "", lease).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Names(registry.List("uid:1")), std::vector<std::string>{"a"});
  // Its owner's lease closes with its regions.
  registry.CloseLease(lease);
  EXPECT_TRUE(registry.List("uid:1").empty());
}

TEST(RegionOwnersTest, PerOwnerCap) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry::Options o = Allowed();
  o.max_regions_per_owner = 3;
  RegionRegistry registry(o);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(registry.RegisterHost(Spec("uid:1", absl::StrCat("r", i), shm.key())).ok());
  }
  const absl::Status full = registry.RegisterHost(Spec("uid:1", "r3", shm.key()));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("--max-regions-per-client=3"), std::string::npos) << full;
  // Another owner has its own allowance; freeing one makes room again.
  EXPECT_TRUE(registry.RegisterHost(Spec("uid:2", "r0", shm.key())).ok());
  ASSERT_TRUE(registry.Unregister("uid:1", "r0", "").ok());
  EXPECT_TRUE(registry.RegisterHost(Spec("uid:1", "r3", shm.key())).ok());
}

TEST(RegionOwnersTest, ObjectsOfAnotherUidAreRefused) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry(Allowed());
  HostRegionSpec spec = Spec("uid:x", "theirs", shm.key());
  spec.object_uid = geteuid() + 1;
  const absl::Status s = registry.RegisterHost(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  spec.object_uid = geteuid();
  EXPECT_TRUE(registry.RegisterHost(spec).ok());
}

TEST(RegionOwnersTest, SymlinksAreNotFollowed) {
  ScopedShm target(4096);
  ASSERT_TRUE(target.ok());
  const std::string link = absl::StrCat("/attnd-test-link-", getpid());
  ASSERT_EQ(symlink(absl::StrCat("/dev/shm", target.key()).c_str(),
                    absl::StrCat("/dev/shm", link).c_str()),
            0);
  RegionRegistry registry(Allowed());
  const absl::Status s = registry.RegisterHost(Spec("", "link", link));
  unlink(absl::StrCat("/dev/shm", link).c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

// One object's range is mapped once however often it is registered, so registrations cannot use
// up vm.max_map_count (the daemon's next allocation would fail).
TEST(RegionOwnersTest, RegistrationsOfOneRangeShareOneMapping) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionRegistry::Options o = Allowed();
  o.max_regions = 1 << 20;
  RegionRegistry registry(o);
  const int maps_before = MapCount();
  constexpr int kRegions = 70000;  // more than vm.max_map_count's default of 65530
  for (int i = 0; i < kRegions; ++i) {
    const absl::Status s = registry.RegisterHost(Spec("uid:1", absl::StrCat("r", i), shm.key()));
    ASSERT_TRUE(s.ok()) << "registration " << i << ": " << s;
  }
  EXPECT_LT(MapCount() - maps_before, 100);
  // Allocations still succeed (each large one is an mmap of its own).
  std::vector<std::vector<char>> blocks;
  for (int i = 0; i < 16; ++i) blocks.emplace_back(1 << 20, 'x');
  {
    auto a = registry.Acquire("uid:1", "r0");
    auto b = registry.Acquire("uid:1", "r69999");
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ((*a)->data(), (*b)->data());
  }  // the pins go before the blocking Unregister below
  auto removed = registry.Unregister("uid:1", "", "");
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->size(), static_cast<size_t>(kRegions));
}

TEST(RegionOwnersTest, DistinctMappingsAreCapped) {
  ScopedShm shm(1 << 16);
  ASSERT_TRUE(shm.ok());
  RegionRegistry::Options o = Allowed();
  o.max_host_mappings = 4;
  RegionRegistry registry(o);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(registry.RegisterHost(Spec("", absl::StrCat("r", i), shm.key(), i * 4096)).ok());
  }
  const absl::Status s = registry.RegisterHost(Spec("", "r4", shm.key(), 4 * 4096));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // A range mapped already costs no new mapping.
  EXPECT_TRUE(registry.RegisterHost(Spec("", "again", shm.key(), 0)).ok());
  ASSERT_TRUE(registry.Unregister("r1", "").ok());
  EXPECT_TRUE(registry.RegisterHost(Spec("", "r4", shm.key(), 4 * 4096)).ok());
}

}  // namespace
}  // namespace attnd::server::regions
