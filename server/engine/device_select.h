// Which device runs a call (docs/SERVICE.md "GPU backend"; pure host logic): the device of its
// device regions (all on one device), else the device its `device_uuid` names, else the first
// served device. Devices are keyed by UUID, spelled as nvidia-smi does
// ("GPU-xxxxxxxx-xxxx-xxxx-xxxx- xxxxxxxxxxxx"); ordinals only mean something inside this process.
//   ATTND_ASSIGN_OR_RETURN(size_t i, SelectDevice(call.tensors(), call.device_uuid(), served));
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/engine/op_call.h"

namespace attnd::server::engine {

// "GPU-" + the 16 bytes as 8-4-4-4-12 lowercase hex digits.
std::string FormatGpuUuid(const unsigned char bytes[16]);

// A UUID as a client may write it (any case, with or without the "GPU-" prefix) in the form
// FormatGpuUuid produces; empty when it is not 32 hex digits in that layout (or bare).
std::string NormalizeGpuUuid(absl::string_view uuid);

struct ServedDevice {
  int ordinal = 0;   // this process's ordinal
  std::string uuid;  // FormatGpuUuid form
};

// The index in `served` of the device that runs a call with `tensors` and `device_uuid`.
// INVALID_ARGUMENT when device regions sit on different devices (naming two tensors and their
// devices), when `device_uuid` is not a served device, or when it differs from the regions'
// device; FAILED_PRECONDITION when nothing is served.
absl::StatusOr<size_t> SelectDevice(const std::vector<TensorUse>& tensors,
                                    absl::string_view device_uuid,
                                    const std::vector<ServedDevice>& served);

// The served device with `uuid` (any accepted spelling); -1 when none.
int FindServedDevice(absl::string_view uuid, const std::vector<ServedDevice>& served);

}  // namespace attnd::server::engine
