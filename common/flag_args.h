// Command-line parsing shared by attnd and attnctl: public flag names use hyphens
// (--metrics-listen, --tls-ca) while absl flags are defined with underscores.
//   std::vector<std::string> words = ParseFlags(argc, argv, {kUsage, kVersion, "server/main/"});
#pragma once

#include <string>
#include <vector>

namespace attnd {

// argv with the name part of every "--flag[=value]" before a bare "--" rewritten '-' -> '_'
// ("--tls-ca=x" -> "--tls_ca=x", "--no-allow-client-shm" -> "--noallow_client_shm"). argv[0],
// values, single-dash and positional arguments, and everything after "--" are kept as they are.
std::vector<std::string> NormalizeFlagArgs(int argc, char** argv);

// How a binary presents itself on --help and --version.
struct CommandLineInfo {
  std::string usage;           // the program usage message, printed first by --help
  std::string version;         // what --version prints, newline included
  std::string help_flags_dir;  // --help lists the flags defined in files whose path contains it
};

// Sets absl's usage message and usage config from `info`, rewrites the flag names
// (NormalizeFlagArgs) and parses them with absl::ParseCommandLine, which exits on --help,
// --version and unknown or malformed flags. Returns the positional arguments, argv[0] first.
// Call once, at the start of main (absl accepts one usage message per process).
std::vector<std::string> ParseFlags(int argc, char** argv, const CommandLineInfo& info);

}  // namespace attnd
