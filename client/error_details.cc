#include "client/error_details.h"

#include <optional>

#include "absl/strings/cord.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"

namespace attnd::client {

ErrorDetails ParseErrorDetails(absl::string_view status_bytes) {
  ErrorDetails out;
  google::rpc::Status status;
  if (status_bytes.empty() ||
      !status.ParseFromArray(status_bytes.data(), static_cast<int>(status_bytes.size()))) {
    return out;
  }
  for (const google::protobuf::Any& any : status.details()) {
    google::rpc::BadRequest bad;
    google::rpc::ResourceInfo resource;
    google::rpc::RetryInfo retry;
    google::rpc::ErrorInfo info;
    if (any.Is<google::rpc::BadRequest>() && any.UnpackTo(&bad)) {
      for (const auto& v : bad.field_violations()) {
        out.field_violations.push_back({v.field(), v.description()});
      }
    } else if (any.Is<google::rpc::ResourceInfo>() && any.UnpackTo(&resource)) {
      out.resource_type = resource.resource_type();
      out.resource_name = resource.resource_name();
    } else if (any.Is<google::rpc::RetryInfo>() && any.UnpackTo(&retry)) {
      out.retry_delay = absl::Seconds(retry.retry_delay().seconds()) +
                        absl::Nanoseconds(retry.retry_delay().nanos());
    } else if (any.Is<google::rpc::ErrorInfo>() && any.UnpackTo(&info)) {
      out.reason = info.reason();
      out.domain = info.domain();
    }
  }
  return out;
}

ErrorDetails ErrorDetailsOf(const grpc::Status& s) {
  if (s.ok()) return ErrorDetails();
  return ParseErrorDetails(s.error_details());
}

ErrorDetails ErrorDetailsOf(const absl::Status& s) {
  auto bytes = s.GetPayload(kStatusDetailsPayload);
  if (!bytes.has_value()) return ErrorDetails();
  return ParseErrorDetails(std::string(*bytes));
}

}  // namespace attnd::client
