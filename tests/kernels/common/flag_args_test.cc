#include "kernels/common/flag_args.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace attnd
