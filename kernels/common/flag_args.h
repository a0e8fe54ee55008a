// Command-line spelling shared by attnd and attnctl: public flag names use hyphens
// (--metrics-listen, --tls-ca) while absl flags are defined with underscores.
//   std::vector<std::string> args = NormalizeFlagArgs(argc, argv);
//   (then absl::ParseCommandLine over pointers to args' data)
#pragma once

#include <string>
#include <vector>

namespace attnd {

// argv with the name part of every "--flag[=value]" before a bare "--" rewritten '-' -> '_'
// ("--tls-ca=x" -> "--tls_ca=x", "--no-allow-client-shm" -> "--noallow_client_shm"). argv[0],
// values, single-dash and positional arguments, and everything after "--" are kept as they are.
std::vector<std::string> NormalizeFlagArgs(int argc, char** argv);

}  // namespace attnd
