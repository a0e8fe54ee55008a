#include "common/flag_args.h"

#include <utility>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace attnd {

std::vector<std::string> NormalizeFlagArgs(int argc, char** argv) {
  std::vector<std::string> out;
  bool flags_done = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (i > 0 && !flags_done && arg == "--") {
      flags_done = true;  // everything after a bare "--" is positional, kept as it is
      out.push_back(std::move(arg));
      continue;
    }
    if (i == 0 || flags_done || arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      out.push_back(std::move(arg));
      continue;
    }
    const size_t eq = arg.find('=');
    std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (name.compare(0, 3, "no-") == 0) name = "no" + name.substr(3);
    for (char& c : name) {
      if (c == '-') c = '_';
    }
    out.push_back(absl::StrCat("--", name, eq == std::string::npos ? "" : arg.substr(eq)));
  }
  return out;
}

std::vector<std::string> ParseFlags(int argc, char** argv, const CommandLineInfo& info) {
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [dir = info.help_flags_dir](absl::string_view file) {
    return absl::StrContains(file, dir);
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [version = info.version] { return version; };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(info.usage);

  std::vector<std::string> args = NormalizeFlagArgs(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  const std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  return std::vector<std::string>(positional.begin(), positional.end());
}

}  // namespace attnd
