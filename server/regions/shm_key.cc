#include "server/regions/shm_key.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attnd::server::regions {
namespace {

bool Printable(char c) { return c >= 0x21 && c <= 0x7e; }

}  // namespace

absl::Status ValidateShmKey(absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("shm key is empty");
  if (key.size() > kMaxShmKeyLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm key is ", key.size(), " bytes, want at most ", kMaxShmKeyLength));
  }
  if (key[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrFormat("shm key %s must start with '/'", absl::CHexEscape(key)));
  }
  if (key.size() == 1) return absl::InvalidArgumentError("shm key '/' names no object");
  for (size_t i = 1; i < key.size(); ++i) {
    if (key[i] == '/') {
      return absl::InvalidArgumentError(absl::StrFormat(
          "shm key '%s' has a slash after the first character", absl::CHexEscape(key)));
    }
    if (!Printable(key[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "shm key '%s' has a non-printable character at %d", absl::CHexEscape(key), i));
    }
  }
  if (key == "/." || key == "/..") {
    return absl::InvalidArgumentError(absl::StrCat("shm key '", key, "' is not an object name"));
  }
  for (absl::string_view prefix : kReservedShmPrefixes) {
    if (absl::StartsWith(key, prefix)) {
      return absl::PermissionDeniedError(
          absl::StrCat("shm key '", key, "' uses the reserved prefix '", prefix, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRegionName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("region name is empty");
  if (name.size() > kMaxRegionNameLength) {
    return absl::InvalidArgumentError(absl::StrCat("region name is ", name.size(),
                                                   " bytes, want at most ", kMaxRegionNameLength));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!Printable(name[i]) && name[i] != ' ') {
      return absl::InvalidArgumentError(absl::StrFormat(
          "region name '%s' has a non-printable character at %d", absl::CHexEscape(name), i));
    }
  }
  return absl::OkStatus();
}

}  // namespace attnd::server::regions
