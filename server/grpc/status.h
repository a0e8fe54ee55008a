// absl::Status -> grpc::Status: the same code (absl's codes are gRPC's codes) and message, and
// the structured causes the status carries (kernels/common/status_details.h payloads) as a
// google.rpc.Status in gRPC's binary details trailer (grpc-status-details-bin), per
// docs/SERVICE.md "Status codes":
//   INVALID_ARGUMENT (or any code) with a bad field   BadRequest, one field violation
//   a status naming a resource (NOT_FOUND)             ResourceInfo
//   RESOURCE_EXHAUSTED, UNAVAILABLE                    RetryInfo (kRetryDelay* or the payload's)
// A status with none of these has no details trailer, as before.
//   Finish(ToGrpcStatus(status));
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"

namespace attnd::server::grpc_front {

// The retry delays of RetryInfo when the status sets none (docs/SERVICE.md "Status codes"):
// a full queue or memory budget drains within a few calls' time; UNAVAILABLE means a drain,
// a restart or a lost device, which take seconds.
inline constexpr absl::Duration kRetryDelayResourceExhausted = absl::Milliseconds(100);
inline constexpr absl::Duration kRetryDelayUnavailable = absl::Seconds(1);

// The serialized google.rpc.Status of `s`, or empty when it has no details to send.
std::string StatusDetails(const absl::Status& s);

grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace attnd::server::grpc_front
