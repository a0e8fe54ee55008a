// The structured causes attnd sends with an error (docs/SERVICE.md "Status codes"): the
// google.rpc.Status in gRPC's binary details trailer, read into a small struct. FromGrpcStatus
// (channel.h) keeps that trailer on the absl::Status it returns, so every Client call's error can
// be asked:
//   absl::Status s = client->RegisterHostRegion(...);
//   ErrorDetails d = ErrorDetailsOf(s);
//   for (const auto& v : d.field_violations) std::cerr << v.field << ": " << v.description;
//   if (d.retry_delay) absl::SleepFor(*d.retry_delay);  // then try again
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"

namespace attnd::client {

struct ErrorDetails {
  // google.rpc.BadRequest: the request fields at fault ("q.shape[2]", "kv.dtype") and why.
  struct FieldViolation {
    std::string field;
    std::string description;
  };
  std::vector<FieldViolation> field_violations;
  // google.rpc.ResourceInfo: the resource the call named ("attnd.v1.Region", its name as sent);
  // both empty when none.
  std::string resource_type;
  std::string resource_name;
  // google.rpc.RetryInfo: try again after this (RESOURCE_EXHAUSTED, UNAVAILABLE); none: do not
  // retry the same call as it is.
  std::optional<absl::Duration> retry_delay;
  // google.rpc.ErrorInfo, when sent.
  std::string reason;
  std::string domain;

  bool empty() const {
    return field_violations.empty() && resource_type.empty() && resource_name.empty() &&
           !retry_delay.has_value() && reason.empty() && domain.empty();
  }
};

// The absl::Status payload under which FromGrpcStatus keeps the serialized google.rpc.Status.
inline constexpr absl::string_view kStatusDetailsPayload = "type.googleapis.com/google.rpc.Status";

// The details of a failed call; empty when it carries none (or they do not parse). Detail
// messages of other types are skipped.
ErrorDetails ErrorDetailsOf(const grpc::Status& s);
ErrorDetails ErrorDetailsOf(const absl::Status& s);
// The same from the serialized google.rpc.Status (the grpc-status-details-bin trailer).
ErrorDetails ParseErrorDetails(absl::string_view status_bytes);

}  // namespace attnd::client
