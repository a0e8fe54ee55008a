// Validation of untrusted region names and POSIX shm keys (docs/SERVICE.md "Security rules"): a key
// is "/" followed by 1..kMaxShmKeyLength-1 printable characters without a further slash, and never
// one of the daemon's reserved prefixes.
//   ATTND_RETURN_IF_ERROR(ValidateShmKey(request.key()));
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attnd::server::regions {

inline constexpr size_t kMaxShmKeyLength = 255;  // NAME_MAX for /dev/shm entries
inline constexpr size_t kMaxRegionNameLength = 256;
// Keys the daemon keeps for itself; clients may not register them.
inline constexpr absl::string_view kReservedShmPrefixes[] = {"/attnd-internal"};

// INVALID_ARGUMENT naming the problem ("key '//' has a slash after the first character"), or
// PERMISSION_DENIED for a reserved prefix.
absl::Status ValidateShmKey(absl::string_view key);

// A region name: 1..kMaxRegionNameLength printable ASCII characters.
absl::Status ValidateRegionName(absl::string_view name);

}  // namespace attnd::server::regions
