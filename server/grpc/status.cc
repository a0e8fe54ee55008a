#include "server/grpc/status.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "kernels/common/status_details.h"

namespace attnd::server::grpc_front {
namespace {

// Any.type_url of a google.rpc detail message (the standard prefix and the full message name).
template <class Message>
void Pack(const Message& m, google::rpc::Status* out) {
  out->add_details()->PackFrom(m);  // "type.googleapis.com/google.rpc.<Name>"
}

// Details must not push the trailers past a client's metadata limit (gRPC's default is 8 KiB,
// and the message is there already): texts are cut, a name too long to send whole is left out.
constexpr size_t kMaxDetailText = 512;

std::string Bounded(absl::string_view text) {
  if (text.size() <= kMaxDetailText) return std::string(text);
  size_t cut = kMaxDetailText - 3;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // UTF-8
  return absl::StrCat(text.substr(0, cut), "...");
}

std::optional<absl::Duration> RetryDelayOf(const absl::Status& s) {
  if (std::optional<absl::Duration> d = kernels::RetryDelay(s); d.has_value()) return d;
  switch (s.code()) {
    case absl::StatusCode::kResourceExhausted: return kRetryDelayResourceExhausted;
    case absl::StatusCode::kUnavailable: return kRetryDelayUnavailable;
    default: return std::nullopt;
  }
}

}  // namespace

std::string StatusDetails(const absl::Status& s) {
  if (s.ok()) return "";
  google::rpc::Status out;
  if (std::optional<std::string> field = kernels::BadField(s); field.has_value()) {
    google::rpc::BadRequest bad;
    google::rpc::BadRequest::FieldViolation* v = bad.add_field_violations();
    v->set_field(Bounded(*field));
    v->set_description(Bounded(s.message()));
    Pack(bad, &out);
  }
  if (std::optional<kernels::ResourceRef> r = kernels::Resource(s);
      r.has_value() && r->name.size() <= kMaxDetailText) {
    google::rpc::ResourceInfo info;
    info.set_resource_type(r->type);
    info.set_resource_name(r->name);
    info.set_description(Bounded(s.message()));
    Pack(info, &out);
  }
  if (std::optional<absl::Duration> delay = RetryDelayOf(s); delay.has_value()) {
    google::rpc::RetryInfo retry;
    const int64_t ns = absl::ToInt64Nanoseconds(*delay);
    retry.mutable_retry_delay()->set_seconds(ns / 1000000000);
    retry.mutable_retry_delay()->set_nanos(static_cast<int32_t>(ns % 1000000000));
    Pack(retry, &out);
  }
  if (out.details_size() == 0) return "";
  out.set_code(static_cast<int32_t>(s.code()));
  out.set_message(std::string(s.message()));
  return out.SerializeAsString();
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(s.code());
  std::string details = StatusDetails(s);
  if (details.empty()) return grpc::Status(code, std::string(s.message()));
  return grpc::Status(code, std::string(s.message()), details);
}

}  // namespace attnd::server::grpc_front
