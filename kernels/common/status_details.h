// Structured causes of an error, carried as absl::Status payloads beside the message so that the
// gRPC layer can turn them into google.rpc error details (docs/SERVICE.md "Status codes") without
// reading the text: the request field at fault (a tensor, its dimension), the resource a call
// named, and how long a client should wait before trying again. Header-only, absl only: kernels,
// regions and the engine set them, server/grpc/status.cc reads them.
//   absl::Status s = absl::InvalidArgumentError("q: dim 2 is 575, want 576");
//   SetBadField(&s, TensorDimField("q", 2));                    // "q.shape[2]"
//   SetResource(&s, kRegionResource, name);                     // NOT_FOUND of a region
//   return WithPrefix(s, "indexer: ");                          // keeps the payloads
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attnd::kernels {

// Payload keys (absl::Status type URLs; private to attnd, never sent as they are).
inline constexpr absl::string_view kBadFieldPayload = "attnd.status/bad_field";
inline constexpr absl::string_view kResourceTypePayload = "attnd.status/resource_type";
inline constexpr absl::string_view kResourceNamePayload = "attnd.status/resource_name";
inline constexpr absl::string_view kRetryDelayPayload = "attnd.status/retry_delay_ms";

// Resource types of ResourceInfo (the proto's message names).
inline constexpr absl::string_view kRegionResource = "attnd.v1.Region";
inline constexpr absl::string_view kLeaseResource = "attnd.v1.Lease";

// Field paths of BadRequest.FieldViolation.field: the tensor ("q"), one of its dimensions
// ("q.shape[2]"), strides ("q.strides[1]") or dtype ("q.dtype").
inline std::string TensorDimField(absl::string_view tensor, int dim) {
  return absl::StrCat(tensor, ".shape[", dim, "]");
}
inline std::string TensorStrideField(absl::string_view tensor, int dim) {
  return absl::StrCat(tensor, ".strides[", dim, "]");
}
inline std::string TensorDtypeField(absl::string_view tensor) {
  return absl::StrCat(tensor, ".dtype");
}

// The request field that an INVALID_ARGUMENT (or OUT_OF_RANGE) status is about. No-op on OK.
inline void SetBadField(absl::Status* s, absl::string_view field) {
  if (!s->ok()) s->SetPayload(kBadFieldPayload, absl::Cord(field));
}
inline std::optional<std::string> BadField(const absl::Status& s) {
  auto c = s.GetPayload(kBadFieldPayload);
  if (!c.has_value()) return std::nullopt;
  return std::string(*c);
}

// INVALID_ARGUMENT about `field`, with `message` as the text.
inline absl::Status InvalidField(absl::string_view field, absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(message);
  SetBadField(&s, field);
  return s;
}

// The resource (type and name as the caller sent it) that a NOT_FOUND status is about.
inline void SetResource(absl::Status* s, absl::string_view type, absl::string_view name) {
  if (s->ok()) return;
  s->SetPayload(kResourceTypePayload, absl::Cord(type));
  s->SetPayload(kResourceNamePayload, absl::Cord(name));
}
struct ResourceRef {
  std::string type;
  std::string name;
};
inline std::optional<ResourceRef> Resource(const absl::Status& s) {
  auto type = s.GetPayload(kResourceTypePayload);
  auto name = s.GetPayload(kResourceNamePayload);
  if (!type.has_value() || !name.has_value()) return std::nullopt;
  return ResourceRef{std::string(*type), std::string(*name)};
}

// A retry delay other than the default of the status's code (docs/SERVICE.md "Status codes").
inline void SetRetryDelay(absl::Status* s, absl::Duration delay) {
  if (!s->ok())
    s->SetPayload(kRetryDelayPayload, absl::Cord(absl::StrCat(delay / absl::Milliseconds(1))));
}
inline std::optional<absl::Duration> RetryDelay(const absl::Status& s) {
  auto c = s.GetPayload(kRetryDelayPayload);
  int64_t ms = 0;
  if (!c.has_value() || !absl::SimpleAtoi(std::string(*c), &ms) || ms < 0) return std::nullopt;
  return absl::Milliseconds(ms);
}

// `s` with `prefix` before its message and the same code and payloads (absl::Status(code, msg)
// would drop them).
inline absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  absl::Status out(s.code(), absl::StrCat(prefix, s.message()));
  s.ForEachPayload(
      [&out](absl::string_view key, const absl::Cord& value) { out.SetPayload(key, value); });
  return out;
}

// `s` with `message` in place of its own, the same code and payloads.
inline absl::Status WithMessage(const absl::Status& s, absl::string_view message) {
  if (s.ok()) return s;
  absl::Status out(s.code(), message);
  s.ForEachPayload(
      [&out](absl::string_view key, const absl::Cord& value) { out.SetPayload(key, value); });
  return out;
}

// The bad field renamed from tensor `from` to tensor `to` ("q.shape[2]" -> "q_nope.shape[2]"),
// for a composite op whose step names its tensors otherwise than the caller. No-op when the
// field is another tensor's.
inline void RenameBadField(absl::Status* s, absl::string_view from, absl::string_view to) {
  std::optional<std::string> field = BadField(*s);
  if (!field.has_value()) return;
  const absl::string_view f = *field;
  if (f == from) {
    SetBadField(s, to);
  } else if (f.size() > from.size() && f.substr(0, from.size()) == from &&
             (f[from.size()] == '.' || f[from.size()] == '[')) {
    SetBadField(s, absl::StrCat(to, f.substr(from.size())));
  }
}

}  // namespace attnd::kernels
