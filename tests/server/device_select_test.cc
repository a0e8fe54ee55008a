// Device keying and choice (no GPU): UUID spelling as nvidia-smi prints it, normalisation of what
// clients send, the device of a call (regions, device_uuid, default) and its refusals.
#include "server/engine/device_select.h"

#include "gtest/gtest.h"

namespace attnd::server::engine {
namespace {

const std::vector<ServedDevice> kServed = {{0, "GPU-0a1b2c3d-0000-1111-2222-333344445555"},
                                           {2, "GPU-ffffffff-eeee-dddd-cccc-bbbbaaaa9999"}};

TensorUse DeviceTensor(const char* name, int ordinal, const std::string& uuid) {
  TensorUse t;
  t.name = name;
  t.residence = Residence::kDeviceRegion;
  t.device_ordinal = ordinal;
  t.device_uuid = uuid;
  return t;
}

TensorUse InlineTensor(const char* name) {
  TensorUse t;
  t.name = name;
  return t;
}

TEST(GpuUuidTest, FormattedLikeNvidiaSmi) {
  const unsigned char bytes[16] = {0x0a, 0x1b, 0x2c, 0x3d, 0x00, 0x00, 0x11, 0x11,
                                   0x22, 0x22, 0x33, 0x33, 0x44, 0x44, 0x55, 0x55};
  EXPECT_EQ(FormatGpuUuid(bytes), "GPU-0a1b2c3d-0000-1111-2222-333344445555");
}

TEST(GpuUuidTest, NormalisesClientSpellings) {
  const std::string want = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
  EXPECT_EQ(NormalizeGpuUuid(want), want);
  EXPECT_EQ(NormalizeGpuUuid("GPU-0A1B2C3D-0000-1111-2222-333344445555"), want);
  EXPECT_EQ(NormalizeGpuUuid("0a1b2c3d-0000-1111-2222-333344445555"), want);  // torch's str()
  EXPECT_EQ(NormalizeGpuUuid("gpu-0a1b2c3d000011112222333344445555"), want);
  EXPECT_EQ(NormalizeGpuUuid(""), "");
  EXPECT_EQ(NormalizeGpuUuid("GPU-0a1b2c3d-0000-1111-2222-33334444555"), "");   // short
  EXPECT_EQ(NormalizeGpuUuid("GPU-0a1b2c3d-0000-1111-2222x333344445555"), "");  // bad dash
  EXPECT_EQ(NormalizeGpuUuid("GPU-0g1b2c3d-0000-1111-2222-333344445555"), "");  // not hex
  EXPECT_EQ(FindServedDevice("ffffffff-eeee-dddd-cccc-bbbbaaaa9999", kServed), 1);
  EXPECT_EQ(FindServedDevice("GPU-00000000-0000-0000-0000-000000000000", kServed), -1);
  EXPECT_EQ(FindServedDevice("cpu-0", kServed), -1);
}

TEST(SelectDeviceTest, RegionsDecide) {
  const std::vector<TensorUse> t = {InlineTensor("q"), DeviceTensor("kv", 2, kServed[1].uuid),
                                    DeviceTensor("out", 2, kServed[1].uuid)};
  auto d = SelectDevice(t, "", kServed);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, 1u);
  d = SelectDevice(t, "GPU-FFFFFFFF-EEEE-DDDD-CCCC-BBBBAAAA9999", kServed);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, 1u);
}

TEST(SelectDeviceTest, DefaultsAndExplicitDevice) {
  const std::vector<TensorUse> t = {InlineTensor("q"), InlineTensor("out")};
  EXPECT_EQ(*SelectDevice(t, "", kServed), 0u);
  EXPECT_EQ(*SelectDevice(t, kServed[1].uuid, kServed), 1u);
  EXPECT_EQ(*SelectDevice({}, "", kServed), 0u);
}

TEST(SelectDeviceTest, Refusals) {
  const std::vector<TensorUse> mixed = {DeviceTensor("q", 0, kServed[0].uuid),
                                        DeviceTensor("kv", 2, kServed[1].uuid)};
  auto d = SelectDevice(mixed, "", kServed);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("q is on GPU-0a1b2c3d"), std::string::npos) << d.status();
  EXPECT_NE(d.status().message().find("kv on GPU-ffffffff"), std::string::npos) << d.status();

  const std::vector<TensorUse> on_second = {DeviceTensor("kv", 2, kServed[1].uuid)};
  d = SelectDevice(on_second, kServed[0].uuid, kServed);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  d = SelectDevice({InlineTensor("q")}, "GPU-12345678-1234-1234-1234-123456789abc", kServed);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("not a device this daemon serves"), std::string::npos);
  d = SelectDevice({InlineTensor("q")}, "nonsense", kServed);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<TensorUse> unserved = {DeviceTensor("kv", 1, "GPU-1")};
  EXPECT_EQ(SelectDevice(unserved, "", kServed).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SelectDevice({}, "", {}).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace attnd::server::engine
