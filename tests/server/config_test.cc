// The daemon's configuration: byte sizes with units (--pool-bytes, --staging-bytes) and the range
// checks of the GPU flags.
#include "server/main/config.h"
#include "gtest/gtest.h"

namespace attnd::server {
namespace {

TEST(ParseByteSizeTest, UnitsAndPlainBytes) {
  EXPECT_EQ(*ParseByteSize("pool-bytes", "1048576"), 1048576);
  EXPECT_EQ(*ParseByteSize("pool-bytes", "8GiB"), int64_t{8} << 30);
  EXPECT_EQ(*ParseByteSize("pool-bytes", "512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("pool-bytes", "1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("pool-bytes", "4GB"), int64_t{4000000000});
  EXPECT_EQ(*ParseByteSize("pool-bytes", " 64 kib "), 65536);
  EXPECT_EQ(*ParseByteSize("pool-bytes", "2Gi"), int64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("staging-bytes", "0"), 0);
}

TEST(ParseByteSizeTest, Refusals) {
  for (const char* bad : {"", "GiB", "-1GiB", "8 parsecs", "1e3", "99999999999TiB"}) {
    auto r = ParseByteSize("pool-bytes", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--pool-bytes"), std::string::npos);
  }
}

TEST(CheckConfigTest, GpuFlags) {
  DaemonConfig c;
  EXPECT_TRUE(CheckConfig(c).ok());
  c.pool_bytes = 1000;
  EXPECT_FALSE(CheckConfig(c).ok());
  c = DaemonConfig();
  c.streams_per_device = 0;
  EXPECT_FALSE(CheckConfig(c).ok());
  c.streams_per_device = 65;
  EXPECT_FALSE(CheckConfig(c).ok());
  c = DaemonConfig();
  c.device_stall_timeout = absl::ZeroDuration();  // off
  EXPECT_TRUE(CheckConfig(c).ok());
  c.device_stall_timeout = -absl::Seconds(1);
  EXPECT_FALSE(CheckConfig(c).ok());
  c.device_stall_timeout = absl::Hours(25);
  EXPECT_FALSE(CheckConfig(c).ok());
  c = DaemonConfig();
  c.devices = {"GPU-x", ""};
  EXPECT_FALSE(CheckConfig(c).ok());
  c = DaemonConfig();
  c.backend = "rocm";
  EXPECT_FALSE(CheckConfig(c).ok());
}

}  // namespace
}  // namespace attnd::server
