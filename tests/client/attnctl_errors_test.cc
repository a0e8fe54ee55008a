// attnctl's error output shows the daemon's google.rpc details (docs/SERVICE.md "Error details"):
// the field violations, the resource and the retry delay, as text on stderr and as keys of the
// --json object.
#include <string>

#include "client/attnctl/commands.h"
#include "client/channel.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "gtest/gtest.h"

namespace attnd::attnctl {
namespace {

absl::Status WithDetails() {
  google::rpc::Status status;
  status.set_code(3);
  status.set_message("q: dim 2 is 575, want 576");
  google::rpc::BadRequest bad;
  auto* v = bad.add_field_violations();
  v->set_field("q.shape[2]");
  v->set_description("q: dim 2 is 575, want 576");
  status.add_details()->PackFrom(bad);
  google::rpc::ResourceInfo info;
  info.set_resource_type("attnd.v1.Region");
  info.set_resource_name("kv-cache");
  status.add_details()->PackFrom(info);
  google::rpc::RetryInfo retry;
  retry.mutable_retry_delay()->set_nanos(250'000'000);
  status.add_details()->PackFrom(retry);
  return client::FromGrpcStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, status.message(),
                                             status.SerializeAsString()),
                                "SparseMla");
}

TEST(AttnctlErrorsTest, TextNamesTheFieldTheResourceAndTheDelay) {
  CtlOptions o;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(Fail(o, WithDetails(), kExitService), kExitService);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("attnctl: INVALID_ARGUMENT: SparseMla: q: dim 2 is 575, want 576\n"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("field q.shape[2]"), std::string::npos) << err;
  EXPECT_NE(err.find("resource attnd.v1.Region 'kv-cache'"), std::string::npos) << err;
  EXPECT_NE(err.find("retry after 250ms"), std::string::npos) << err;
}

TEST(AttnctlErrorsTest, JsonCarriesTheDetailsAsKeys) {
  CtlOptions o;
  o.json = true;
  ::testing::internal::CaptureStdout();
  Fail(o, WithDetails(), kExitService);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("\"field_violations\":[{\"field\":\"q.shape[2]\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"resource_name\":\"kv-cache\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"retry_delay_seconds\":0.25"), std::string::npos) << out;
}

TEST(AttnctlErrorsTest, NoDetailsNoExtraLines) {
  CtlOptions o;
  ::testing::internal::CaptureStderr();
  Fail(o, absl::InternalError("boom"), kExitService);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "attnctl: INTERNAL: boom\n");
}

}  // namespace
}  // namespace attnd::attnctl
