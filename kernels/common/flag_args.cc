#include "kernels/common/flag_args.h"

#include <utility>

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

}  // namespace attnd
