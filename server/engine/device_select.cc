#include "server/engine/device_select.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnd::server::engine {
namespace {

std::string ServedList(const std::vector<ServedDevice>& served) {
  std::vector<std::string> uuids;
  for (const ServedDevice& d : served) uuids.push_back(d.uuid);
  return absl::StrJoin(uuids, ", ");
}

}  // namespace

std::string FormatGpuUuid(const unsigned char bytes[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 15]);
  }
  return out;
}

std::string NormalizeGpuUuid(absl::string_view uuid) {
  std::string s = absl::AsciiStrToLower(uuid);
  absl::string_view body = s;
  if (absl::StartsWith(body, "gpu-")) body.remove_prefix(4);
  // Accept 8-4-4-4-12 with dashes, or 32 bare hex digits.
  std::string hex;
  if (body.size() == 36) {
    for (size_t i = 0; i < body.size(); ++i) {
      const bool dash_here = i == 8 || i == 13 || i == 18 || i == 23;
      if (dash_here != (body[i] == '-')) return "";
      if (!dash_here) hex.push_back(body[i]);
    }
  } else if (body.size() == 32) {
    hex = std::string(body);
  } else {
    return "";
  }
  unsigned char bytes[16];
  for (int i = 0; i < 16; ++i) {
    int v = 0;
    for (int j = 0; j < 2; ++j) {
      const char c = hex[2 * i + j];
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else {
        return "";
      }
      v = v * 16 + d;
    }
    bytes[i] = static_cast<unsigned char>(v);
  }
  return FormatGpuUuid(bytes);
}

int FindServedDevice(absl::string_view uuid, const std::vector<ServedDevice>& served) {
  const std::string want = NormalizeGpuUuid(uuid);
  if (want.empty()) return -1;
  for (size_t i = 0; i < served.size(); ++i) {
    if (served[i].uuid == want) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<size_t> SelectDevice(const std::vector<TensorUse>& tensors,
                                    absl::string_view device_uuid,
                                    const std::vector<ServedDevice>& served) {
  if (served.empty()) return absl::FailedPreconditionError("no GPU is served");
  const TensorUse* first = nullptr;
  for (const TensorUse& t : tensors) {
    if (t.residence != Residence::kDeviceRegion) continue;
    if (first == nullptr) {
      first = &t;
    } else if (t.device_ordinal != first->device_ordinal) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensors on different devices: ", first->name, " is on ", first->device_uuid,
                       ", ", t.name, " on ", t.device_uuid, " (one call runs on one device)"));
    }
  }
  int chosen = -1;
  if (first != nullptr) {
    for (size_t i = 0; i < served.size(); ++i) {
      if (served[i].ordinal == first->device_ordinal) chosen = static_cast<int>(i);
    }
    if (chosen < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(first->name, ": its region is on ", first->device_uuid,
                       ", which this daemon does not serve (", ServedList(served), ")"));
    }
  }
  if (!device_uuid.empty()) {
    const int named = FindServedDevice(device_uuid, served);
    if (named < 0) {
      return absl::InvalidArgumentError(absl::StrCat("device_uuid: '", device_uuid,
                                                     "' is not a device this daemon serves (",
                                                     ServedList(served), ")"));
    }
    if (chosen >= 0 && named != chosen) {
      return absl::InvalidArgumentError(absl::StrCat("device_uuid: '", device_uuid,
                                                     "' differs from the device of ", first->name,
                                                     "'s region (", served[chosen].uuid, ")"));
    }
    chosen = named;
  }
  return static_cast<size_t>(chosen < 0 ? 0 : chosen);
}

}  // namespace attnd::server::engine
