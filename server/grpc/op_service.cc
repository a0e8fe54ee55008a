// The unary operator RPCs: each hands its request to CallRunner (resolve, validate, queue) and
// Finishes from the call's completion; the reactor thread never waits for compute.
#include <chrono>

#include "absl/strings/numbers.h"
#include "server/grpc/service.h"
#include "server/grpc/status.h"

namespace attnd::server::grpc_front {
namespace {

absl::Time Deadline(const grpc::CallbackServerContext* ctx) {
  const auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

// A client-chosen request id from the "x-request-id" metadata (decimal), else 0.
uint64_t ClientRequestId(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("x-request-id");
  uint64_t id = 0;
  if (it != md.end()) {
    if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &id)) id = 0;
  }
  return id;
}

}  // namespace

grpc::ServerUnaryReactor* AttentionService::RunOp(ops::OpId id, grpc::CallbackServerContext* ctx,
                                                  const google::protobuf::Message& request,
                                                  google::protobuf::Message* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  ops::CallContext cc;
  cc.request_id = ClientRequestId(ctx);
  cc.deadline = Deadline(ctx);
  cc.cancelled = [ctx] { return ctx->IsCancelled(); };
  cc.origin = "unary";
  deps_.runner->Start(id, request, response, std::move(cc),
                      [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); });
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::IndexerLogits(grpc::CallbackServerContext* ctx,
                                                          const v1::IndexerLogitsRequest* request,
                                                          v1::IndexerLogitsResponse* response) {
  return RunOp(ops::OpId::kIndexerLogits, ctx, *request, response);
}

grpc::ServerUnaryReactor* AttentionService::IndexerLogitsPaged(
    grpc::CallbackServerContext* ctx, const v1::IndexerLogitsPagedRequest* request,
    v1::IndexerLogitsPagedResponse* response) {
  return RunOp(ops::OpId::kIndexerLogitsPaged, ctx, *request, response);
}

grpc::ServerUnaryReactor* AttentionService::TopK(grpc::CallbackServerContext* ctx,
                                                 const v1::TopKRequest* request,
                                                 v1::TopKResponse* response) {
  return RunOp(ops::OpId::kTopK, ctx, *request, response);
}

grpc::ServerUnaryReactor* AttentionService::SparseMla(grpc::CallbackServerContext* ctx,
                                                      const v1::SparseMlaRequest* request,
                                                      v1::SparseMlaResponse* response) {
  return RunOp(ops::OpId::kSparseMla, ctx, *request, response);
}

grpc::ServerUnaryReactor* AttentionService::MlaDecode(grpc::CallbackServerContext* ctx,
                                                      const v1::MlaDecodeRequest* request,
                                                      v1::MlaDecodeResponse* response) {
  return RunOp(ops::OpId::kMlaDecode, ctx, *request, response);
}

grpc::ServerUnaryReactor* AttentionService::MlaPrefill(grpc::CallbackServerContext* ctx,
                                                       const v1::MlaPrefillRequest* request,
                                                       v1::MlaPrefillResponse* response) {
  return RunOp(ops::OpId::kMlaPrefill, ctx, *request, response);
}

grpc::ServerUnaryReactor* AttentionService::DsaAttention(grpc::CallbackServerContext* ctx,
                                                         const v1::DsaAttentionRequest* request,
                                                         v1::DsaAttentionResponse* response) {
  return RunOp(ops::OpId::kDsaAttention, ctx, *request, response);
}

}  // namespace attnd::server::grpc_front
