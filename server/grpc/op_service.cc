// The unary operator RPCs: each hands its request to CallRunner (resolve, validate, queue) and
// Finishes from the call's completion; the reactor thread never waits for compute.
#include <memory>

#include "absl/strings/str_cat.h"
#include "server/grpc/service.h"
#include "server/grpc/status.h"
#include "server/grpc/unary_call.h"

namespace attnd::server::grpc_front {
std::shared_ptr<engine::CallMemory> AttentionService::NewCallMemory(
    absl::string_view grpc_peer) const {
  if (deps_.call_memory == nullptr) return nullptr;
  return std::make_shared<engine::CallMemory>(deps_.call_memory, ClientKey(deps_.peers, grpc_peer));
}

template <class Request, class Response>
grpc::ServerUnaryReactor* AttentionService::RunOp(ops::OpId id, grpc::CallbackServerContext* ctx,
                                                  const Raw* request, Raw* response) {
  auto* call = new UnaryCall<Request, Response>(ops::OpRpc(id), request, response);
  if (!call->parsed()) return call;
  ops::CallContext cc;
  cc.request_id = ClientRequestId(ctx);
  cc.deadline = CallDeadline(ctx);
  cc.origin = "unary";
  cc.owner = IdentifyCaller(deps_.peers, *ctx).owner;
  if (ops::HasSignals(call->request())) {
    // Stream-ordered: answered "enqueued" at once, ordered behind this caller's earlier
    // stream-ordered calls on this connection (docs/SERVICE.md "Stream-ordered calls and
    // prepared calls"); nothing refers to the gRPC call afterwards.
    cc.origin = "unary stream-ordered";
    cc.memory = NewCallMemory(ctx->peer());
    auto request_copy = std::make_shared<Request>(call->request());
    const v1::Signal* ready = ops::FindSignal(*request_copy, "ready");
    const v1::Signal* done = ops::FindSignal(*request_copy, "done");
    const std::string key = absl::StrCat(cc.owner, " ", ctx->peer());
    call->Reply(EnqueueStreamOrdered(stream()->KeyedQueue(key), id, std::move(request_copy), ready,
                                     done, /*prepared=*/nullptr, std::move(cc), nullptr,
                                     call->response()->mutable_stats()));
    return call;
  }
  cc.cancelled = [ctx] { return ctx->IsCancelled(); };
  // The reply's inline outputs stay reserved until gRPC has sent them.
  cc.memory = NewCallMemory(ctx->peer());
  call->Hold(cc.memory);
  deps_.runner->Start(id, call->request(), call->response(), std::move(cc),
                      [call](absl::Status s) { call->Reply(s); });
  return call;
}

grpc::ServerUnaryReactor* AttentionService::IndexerLogits(grpc::CallbackServerContext* ctx,
                                                          const Raw* request, Raw* response) {
  return RunOp<v1::IndexerLogitsRequest, v1::IndexerLogitsResponse>(ops::OpId::kIndexerLogits, ctx,
                                                                    request, response);
}

grpc::ServerUnaryReactor* AttentionService::IndexerLogitsPaged(grpc::CallbackServerContext* ctx,
                                                               const Raw* request, Raw* response) {
  return RunOp<v1::IndexerLogitsPagedRequest, v1::IndexerLogitsPagedResponse>(
      ops::OpId::kIndexerLogitsPaged, ctx, request, response);
}

grpc::ServerUnaryReactor* AttentionService::TopK(grpc::CallbackServerContext* ctx,
                                                 const Raw* request, Raw* response) {
  return RunOp<v1::TopKRequest, v1::TopKResponse>(ops::OpId::kTopK, ctx, request, response);
}

grpc::ServerUnaryReactor* AttentionService::SparseMla(grpc::CallbackServerContext* ctx,
                                                      const Raw* request, Raw* response) {
  return RunOp<v1::SparseMlaRequest, v1::SparseMlaResponse>(ops::OpId::kSparseMla, ctx, request,
                                                            response);
}

grpc::ServerUnaryReactor* AttentionService::MlaDecode(grpc::CallbackServerContext* ctx,
                                                      const Raw* request, Raw* response) {
  return RunOp<v1::MlaDecodeRequest, v1::MlaDecodeResponse>(ops::OpId::kMlaDecode, ctx, request,
                                                            response);
}

grpc::ServerUnaryReactor* AttentionService::MlaPrefill(grpc::CallbackServerContext* ctx,
                                                       const Raw* request, Raw* response) {
  return RunOp<v1::MlaPrefillRequest, v1::MlaPrefillResponse>(ops::OpId::kMlaPrefill, ctx, request,
                                                              response);
}

grpc::ServerUnaryReactor* AttentionService::DsaAttention(grpc::CallbackServerContext* ctx,
                                                         const Raw* request, Raw* response) {
  return RunOp<v1::DsaAttentionRequest, v1::DsaAttentionResponse>(ops::OpId::kDsaAttention, ctx,
                                                                  request, response);
}

}  // namespace attnd::server::grpc_front
