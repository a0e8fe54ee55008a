// One unary RPC of the Attention service, taken raw (grpc::ByteBuffer) and parsed here: a request
// that does not parse is INVALID_ARGUMENT with a message naming the RPC and the message type.
// (gRPC 1.51's generated callback handlers parse the request themselves and answer a failure with
// UNIMPLEMENTED and an empty message, inside gRPC: grpc::internal::CallbackUnaryHandler::RunHandler
// replaces the reactor by an UnimplementedUnaryReactor; the raw methods are the generated API's
// way to parse in our code instead.)
//   auto* call = new UnaryCall<v1::GetInfoRequest, v1::GetInfoResponse>("GetInfo", in, out);
//   if (!call->parsed()) return call;  // finished INVALID_ARGUMENT already
//   call->response()->set_version(...);
//   call->Reply(absl::OkStatus());
//   return call;
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "server/grpc/status.h"

namespace attnd::server::grpc_front {

// The unary call's deadline (InfiniteFuture when the client set none).
inline absl::Time CallDeadline(const grpc::CallbackServerContext* ctx) {
  const auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

// A client-chosen request id from the "x-request-id" metadata (decimal), else 0.
inline uint64_t ClientRequestId(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("x-request-id");
  uint64_t id = 0;
  if (it != md.end()) {
    if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &id)) id = 0;
  }
  return id;
}

template <class Request, class Response>
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  // Parses `in` into request(); when it does not parse the call is finished INVALID_ARGUMENT at
  // once and parsed() is false. `out` is where Reply serializes the response (gRPC's buffer).
  UnaryCall(absl::string_view rpc, const grpc::ByteBuffer* in, grpc::ByteBuffer* out) : out_(out) {
    grpc::ByteBuffer copy(*in);  // shares the slices; Deserialize consumes its argument
    const size_t bytes = copy.Length();
    grpc::Status s = grpc::SerializationTraits<Request>::Deserialize(&copy, &request_);
    parsed_ = s.ok();
    if (!parsed_) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(rpc, ": the request (", bytes, " bytes) does not parse as ",
                                       Request::descriptor()->full_name(),
                                       s.error_message().empty() ? "" : ": ", s.error_message())));
    }
  }

  bool parsed() const { return parsed_; }
  const Request& request() const { return request_; }
  Response* response() { return &response_; }

  // Keeps `keep` alive until gRPC is done with the call (the reply sent or the call cancelled).
  void Hold(std::shared_ptr<void> keep) { held_ = std::move(keep); }

  // Finishes the call with `status`; on OK the response is serialized into the reply first (and
  // dropped here, so that a large reply is held once, by gRPC). Call once. Thread-safe with
  // respect to gRPC (any thread).
  void Reply(const absl::Status& status) {
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    bool own_buffer = false;
    grpc::Status s = grpc::SerializationTraits<Response>::Serialize(response_, out_, &own_buffer);
    response_.Clear();
    Finish(s.ok() ? grpc::Status::OK
                  : grpc::Status(grpc::StatusCode::INTERNAL,
                                 absl::StrCat("cannot serialize the reply: ", s.error_message())));
  }

  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer* const out_;
  Request request_;
  Response response_;
  bool parsed_ = false;
  std::shared_ptr<void> held_;
};

}  // namespace attnd::server::grpc_front
