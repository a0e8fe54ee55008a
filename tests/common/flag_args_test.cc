#include "common/flag_args.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(std::string, flag_args_test_text, "", "A string flag for ParseFlags' test.");
ABSL_FLAG(bool, flag_args_test_switch, true, "A boolean flag for ParseFlags' test.");

namespace attnd {
namespace {

std::vector<std::string> Normalize(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return NormalizeFlagArgs(static_cast<int>(argv.size()), argv.data());
}

TEST(NormalizeFlagArgs, RewritesNamesNotValues) {
  EXPECT_EQ(Normalize({"attnd", "--metrics-listen=127.0.0.1:9-4", "--tls-ca", "/a-b/ca.pem"}),
            (std::vector<std::string>{"attnd", "--metrics_listen=127.0.0.1:9-4", "--tls_ca",
                                      "/a-b/ca.pem"}));
}

TEST(NormalizeFlagArgs, NegatedBooleans) {
  EXPECT_EQ(Normalize({"attnd", "--no-allow-client-shm", "--noallow_client_shm"}),
            (std::vector<std::string>{"attnd", "--noallow_client_shm", "--noallow_client_shm"}));
}

TEST(NormalizeFlagArgs, KeepsProgramPositionalsSingleDashAndAfterDoubleDash) {
  EXPECT_EQ(Normalize({"./my-prog", "run", "sparse-mla", "-x-y", "--", "--a-b=c-d", "--"}),
            (std::vector<std::string>{"./my-prog", "run", "sparse-mla", "-x-y", "--", "--a-b=c-d",
                                      "--"}));
  EXPECT_EQ(Normalize({"p", "--", "x", "--under_score-x"}),
            (std::vector<std::string>{"p", "--", "x", "--under_score-x"}));
  EXPECT_EQ(Normalize({"p", "--a", "--b-c"}), (std::vector<std::string>{"p", "--a", "--b_c"}));
}

// ParseFlags sets absl's usage message, which absl accepts once per process: this is the only
// test that calls it.
TEST(ParseFlags, ParsesHyphenatedFlagsAndReturnsPositionals) {
  std::vector<std::string> args = {
      "prog", "run",  "--flag-args-test-text=a-b", "--no-flag-args-test-switch", "x-y",
      "--",   "--z-w"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  const std::vector<std::string> positional =
      ParseFlags(static_cast<int>(argv.size()), argv.data(), {"usage", "prog 1\n", "tests/"});
  EXPECT_EQ(positional, (std::vector<std::string>{"prog", "run", "x-y", "--z-w"}));
  EXPECT_EQ(absl::GetFlag(FLAGS_flag_args_test_text), "a-b");
  EXPECT_FALSE(absl::GetFlag(FLAGS_flag_args_test_switch));
}

}  // namespace
}  // namespace attnd
