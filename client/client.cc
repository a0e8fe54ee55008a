#include "client/client.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/polled_unary.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace attnd::client {
namespace {

using Clock = std::chrono::steady_clock;

// grpc.health.v1.HealthCheckRequest{service} in wire format (field 1, string).
std::string EncodeHealthRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.WriteTag(10);  // field 1, length-delimited
  coded.WriteVarint32(static_cast<uint32_t>(service.size()));
  coded.WriteString(service);
  return out;
}

// grpc.health.v1.HealthCheckResponse.status (field 1, enum); unknown fields skipped.
absl::StatusOr<HealthStatus> DecodeHealthResponse(const std::string& bytes) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  uint32_t status = 0;
  for (uint32_t tag = in.ReadTag(); tag != 0; tag = in.ReadTag()) {
    if (tag == 8) {
      if (!in.ReadVarint32(&status)) break;
    } else if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag)) {
      return absl::DataLossError("malformed HealthCheckResponse");
    }
  }
  if (status > 3) return HealthStatus::kUnknown;
  return static_cast<HealthStatus>(status);
}

}  // namespace

const char* HealthStatusName(HealthStatus s) {
  switch (s) {
    case HealthStatus::kUnknown: return "UNKNOWN";
    case HealthStatus::kServing: return "SERVING";
    case HealthStatus::kNotServing: return "NOT_SERVING";
    case HealthStatus::kServiceUnknown: return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

void SetTimeout(grpc::ClientContext* ctx, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration() || timeout <= absl::ZeroDuration()) return;
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMicroseconds(timeout));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ConnectOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateChannel(options);
  if (!channel.ok()) return channel.status();
  return std::make_unique<Client>(*std::move(channel), options.wait_spin);
}

Client::Client(std::shared_ptr<grpc::Channel> channel, absl::Duration wait_spin)
    : channel_(std::move(channel)),
      wait_spin_(std::max(wait_spin, absl::ZeroDuration())),
      stub_(v1::Attention::NewStub(channel_)) {}

absl::StatusOr<v1::GetInfoResponse> Client::GetInfo(absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetTimeout(&ctx, timeout);
  v1::GetInfoResponse response;
  const v1::GetInfoRequest request;
  grpc::Status s = wait_spin_ > absl::ZeroDuration()
                       ? PolledUnary(
                             [&](grpc::CompletionQueue* cq) {
                               return stub_->PrepareAsyncGetInfo(&ctx, request, cq);
                             },
                             &response, wait_spin_)
                       : stub_->GetInfo(&ctx, request, &response);
  if (!s.ok()) return FromGrpcStatus(s, "GetInfo");
  return response;
}

absl::StatusOr<HealthStatus> Client::Health(const std::string& service, absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetTimeout(&ctx, timeout);
  const std::string request_bytes = EncodeHealthRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::GenericStub stub(channel_);
  // `status` is written before Notify and read after WaitForNotification (which orders them).
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return FromGrpcStatus(status, "Health");
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::DataLossError("Health: unreadable reply");
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return DecodeHealthResponse(bytes);
}

absl::StatusOr<v1::ListRegionsResponse> Client::ListRegions(absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetTimeout(&ctx, timeout);
  v1::ListRegionsResponse response;
  grpc::Status s = stub_->ListRegions(&ctx, v1::ListRegionsRequest(), &response);
  if (!s.ok()) return FromGrpcStatus(s, "ListRegions");
  return response;
}

absl::Status Client::RegisterHostRegion(const v1::RegisterHostRegionRequest& request,
                                        absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetTimeout(&ctx, timeout);
  v1::RegisterRegionResponse response;
  return FromGrpcStatus(stub_->RegisterHostRegion(&ctx, request, &response), "RegisterHostRegion");
}

absl::Status Client::RegisterDeviceRegion(const v1::RegisterDeviceRegionRequest& request,
                                          absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetTimeout(&ctx, timeout);
  v1::RegisterRegionResponse response;
  return FromGrpcStatus(stub_->RegisterDeviceRegion(&ctx, request, &response),
                        "RegisterDeviceRegion");
}

absl::StatusOr<std::vector<std::string>> Client::UnregisterRegion(const std::string& name,
                                                                  const std::string& lease_id,
                                                                  absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetTimeout(&ctx, timeout);
  v1::UnregisterRegionRequest request;
  request.set_name(name);
  request.set_lease_id(lease_id);
  v1::UnregisterRegionResponse response;
  grpc::Status s = stub_->UnregisterRegion(&ctx, request, &response);
  if (!s.ok()) return FromGrpcStatus(s, "UnregisterRegion");
  return std::vector<std::string>(response.removed().begin(), response.removed().end());
}

template <class Params>
absl::StatusOr<CallResult> Client::Call(const Params& p, const CallOptions& options) {
  using Traits = OpTraits<Params>;
  typename Traits::Request request;
  if (absl::Status s = BuildRequest(p, &regions_, options.inline_only, &request); !s.ok()) {
    return s;
  }
  SetSignals(options, &request);
  typename Traits::Response response;
  grpc::ClientContext ctx;
  SetTimeout(&ctx, options.timeout);
  if (options.request_id != 0) ctx.AddMetadata("x-request-id", absl::StrCat(options.request_id));
  const Clock::time_point start = Clock::now();
  grpc::Status s = wait_spin_ > absl::ZeroDuration()
                       ? PolledUnary(
                             [&](grpc::CompletionQueue* cq) {
                               return Traits::PrepareAsync(stub_.get(), &ctx, request, cq);
                             },
                             &response, wait_spin_)
                       : Traits::Unary(stub_.get(), &ctx, request, &response);
  const Clock::time_point end = Clock::now();
  if (!s.ok()) return FromGrpcStatus(s, Traits::kRpc);
  CallResult result;
  result.round_trip_seconds = std::chrono::duration<double>(end - start).count();
  if (absl::Status a = ApplyReply(p, response, &result); !a.ok()) {
    return absl::Status(a.code(), absl::StrCat(Traits::kRpc, ": ", a.message()));
  }
  return result;
}

#define ATTND_CLIENT_INSTANTIATE(P) \
  template absl::StatusOr<CallResult> Client::Call(const P&, const CallOptions&);
ATTND_CLIENT_FOR_EACH_PARAMS(ATTND_CLIENT_INSTANTIATE)
#undef ATTND_CLIENT_INSTANTIATE

absl::StatusOr<CallResult> Client::IndexerLogits(const kernels::indexer_logits::Params& p,
                                                 const CallOptions& options) {
  return Call(p, options);
}
absl::StatusOr<CallResult> Client::IndexerLogitsPaged(
    const kernels::indexer_logits_paged::Params& p, const CallOptions& options) {
  return Call(p, options);
}
absl::StatusOr<CallResult> Client::TopK(const kernels::topk::Params& p,
                                        const CallOptions& options) {
  return Call(p, options);
}
absl::StatusOr<CallResult> Client::SparseMla(const kernels::sparse_mla::Params& p,
                                             const CallOptions& options) {
  return Call(p, options);
}
absl::StatusOr<CallResult> Client::MlaDecode(const kernels::mla_decode::Params& p,
                                             const CallOptions& options) {
  return Call(p, options);
}
absl::StatusOr<CallResult> Client::MlaPrefill(const kernels::mla_prefill::Params& p,
                                              const CallOptions& options) {
  return Call(p, options);
}
absl::StatusOr<CallResult> Client::DsaAttention(const kernels::dsa::Params& p,
                                                const CallOptions& options) {
  return Call(p, options);
}

}  // namespace attnd::client
