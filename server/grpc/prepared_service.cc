// Stream-ordered and prepared calls (docs/SERVICE.md "Stream-ordered calls and prepared calls"):
// the bodies the unary RPCs and the Session stream share, and the unary PrepareCall, RunPrepared
// and ReleaseCall. A unary stream-ordered call is ordered behind the earlier stream-ordered calls
// of the same caller on the same connection; a Session's, behind those of its Session.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/log.h"
#include "server/grpc/service.h"
#include "server/grpc/status.h"
#include "server/grpc/unary_call.h"

namespace attnd::server::grpc_front {
absl::StatusOr<std::pair<ops::OpId, const google::protobuf::Message*>> PreparedOp(
    const v1::PrepareCallRequest& request) {
  using R = v1::PrepareCallRequest;
  switch (request.op_case()) {
    case R::kIndexerLogits:
      return std::make_pair(
          ops::OpId::kIndexerLogits,
          static_cast<const google::protobuf::Message*>(&request.indexer_logits()));
    case R::kIndexerLogitsPaged:
      return std::make_pair(
          ops::OpId::kIndexerLogitsPaged,
          static_cast<const google::protobuf::Message*>(&request.indexer_logits_paged()));
    case R::kTopK:
      return std::make_pair(ops::OpId::kTopK,
                            static_cast<const google::protobuf::Message*>(&request.top_k()));
    case R::kSparseMla:
      return std::make_pair(ops::OpId::kSparseMla,
                            static_cast<const google::protobuf::Message*>(&request.sparse_mla()));
    case R::kMlaDecode:
      return std::make_pair(ops::OpId::kMlaDecode,
                            static_cast<const google::protobuf::Message*>(&request.mla_decode()));
    case R::kMlaPrefill:
      return std::make_pair(ops::OpId::kMlaPrefill,
                            static_cast<const google::protobuf::Message*>(&request.mla_prefill()));
    case R::kDsaAttention:
      return std::make_pair(ops::OpId::kDsaAttention, static_cast<const google::protobuf::Message*>(
                                                          &request.dsa_attention()));
    case R::OP_NOT_SET: break;
  }
  return absl::InvalidArgumentError("PrepareCall: the request carries no op request");
}

absl::Status AttentionService::EnqueueStreamOrdered(
    const std::shared_ptr<ops::StreamOrderedRunner::Queue>& queue, ops::OpId id,
    std::shared_ptr<const google::protobuf::Message> request, const v1::Signal* ready,
    const v1::Signal* done, const ops::PreparedCallEntry* prepared, ops::CallContext ctx,
    std::function<void(absl::Status)> finished, v1::CallStats* stats) {
  if (ctx.request_id == 0) ctx.request_id = deps_.runner->NewRequestId();
  const uint64_t request_id = ctx.request_id;
  ops::StreamOrderedRunner::Submission s;
  s.id = id;
  s.request = std::move(request);
  s.ready = ready;
  s.done = done;
  s.ctx = std::move(ctx);
  // A prepared call was validated, and its regions' kinds looked at, when it was prepared.
  s.validated = prepared != nullptr;
  if (prepared != nullptr) s.names_host_region = prepared->names_host_region;
  s.finished = std::move(finished);
  absl::Status status = stream_->Enqueue(queue, std::move(s));
  if (status.ok() && stats != nullptr) {
    stats->set_enqueued(true);
    stats->set_request_id(request_id);
  }
  return status;
}

absl::StatusOr<uint64_t> AttentionService::Prepare(
    const Caller& caller, const v1::PrepareCallRequest& request, const std::string& lease,
    const std::shared_ptr<engine::CallMemory>& memory) {
  absl::StatusOr<std::pair<ops::OpId, const google::protobuf::Message*>> op = PreparedOp(request);
  if (!op.ok()) return op.status();
  if (ops::HasSignals(*op->second)) {
    return absl::InvalidArgumentError(
        "PrepareCall: the op request carries ready/done; a prepared call gets its signals from "
        "each RunPrepared");
  }
  if (!lease.empty() && !deps_.registry->LeaseOpen(lease)) {
    return absl::NotFoundError(absl::StrCat("lease_id: no open lease '", lease, "'"));
  }
  std::shared_ptr<google::protobuf::Message> copy(op->second->New());
  copy->CopyFrom(*op->second);
  ops::PrepareOptions prep;
  prep.registry = deps_.registry;
  prep.max_inline_bytes = 0;
  prep.memory = memory.get();
  prep.owner = caller.owner;
  ops::PreparedCallEntry entry;
  absl::Status c = ops::CheckCall(*deps_.ops, op->first, *copy, prep, ops::Placement::kAllInRegions,
                                  &entry.regions);
  if (!c.ok()) return c;
  entry.names_host_region = ops::NamesHostRegion(*copy, deps_.registry, caller.owner);
  entry.owner = caller.owner;
  entry.lease = lease;
  entry.op = op->first;
  entry.request = std::move(copy);
  absl::StatusOr<uint64_t> id = prepared_->Add(std::move(entry));
  if (id.ok()) {
    Log(LogLevel::kDebug, "call prepared",
        {{"call_id", *id},
         {"op", ops::OpName(op->first)},
         {"owner", caller.owner},
         {"lease", lease}});
  }
  return id;
}

void AttentionService::RegionsRemoved(const std::string& owner,
                                      const std::vector<std::string>& names) {
  prepared_->DropRegions(owner, names);
  rings_->DropRegions(owner, names);
}

void AttentionService::RegionsReleased(const std::string& owner,
                                       const std::vector<std::string>& removed) {
  if (removed.empty()) return;
  std::vector<std::string> live;
  for (const regions::RegionDescription& d : deps_.registry->List(owner)) live.push_back(d.name);
  std::vector<std::string> gone;
  for (const std::string& name : removed) {
    if (std::find(live.begin(), live.end(), name) == live.end()) gone.push_back(name);
  }
  RegionsRemoved(owner, gone);
}

std::vector<std::string> AttentionService::RegionsNamed(const std::string& owner,
                                                        const std::string& name,
                                                        const std::string& lease) const {
  if (!name.empty()) return {name};
  std::vector<std::string> names;
  for (const regions::RegionDescription& d : deps_.registry->List(owner)) {
    if (d.lease == lease) names.push_back(d.name);
  }
  return names;
}

void AttentionService::LeaseClosing(const std::string& owner, const std::string& lease) {
  prepared_->DropLease(lease);
  rings_->DropLease(lease);
  RegionsRemoved(owner, RegionsNamed(owner, "", lease));
}

grpc::ServerUnaryReactor* AttentionService::PrepareCall(grpc::CallbackServerContext* ctx,
                                                        const Raw* raw, Raw* reply) {
  auto* call =
      new UnaryCall<v1::PrepareCallRequest, v1::PrepareCallResponse>("PrepareCall", raw, reply);
  if (!call->parsed()) return call;
  const Caller caller = IdentifyCaller(deps_.peers, *ctx);
  absl::StatusOr<uint64_t> id =
      Prepare(caller, call->request(), call->request().lease_id(), NewCallMemory(ctx->peer()));
  if (id.ok()) {
    call->response()->set_call_id(*id);
    call->response()->set_op(ops::OpName(PreparedOp(call->request())->first));
  }
  call->Reply(id.status());
  return call;
}

grpc::ServerUnaryReactor* AttentionService::RunPrepared(grpc::CallbackServerContext* ctx,
                                                        const Raw* raw, Raw* reply) {
  auto* call =
      new UnaryCall<v1::RunPreparedRequest, v1::RunPreparedResponse>("RunPrepared", raw, reply);
  if (!call->parsed()) return call;
  const v1::RunPreparedRequest& request = call->request();
  const std::string owner = IdentifyCaller(deps_.peers, *ctx).owner;
  absl::StatusOr<std::shared_ptr<const ops::PreparedCallEntry>> entry =
      prepared_->Find(owner, request.call_id());
  if (!entry.ok()) {
    call->Reply(entry.status());
    return call;
  }
  ops::CallContext cc;
  cc.request_id = ClientRequestId(ctx);
  cc.deadline = CallDeadline(ctx);
  cc.origin = absl::StrCat("unary prepared ", request.call_id());
  cc.owner = owner;
  cc.memory = NewCallMemory(ctx->peer());
  if (request.has_ready() || request.has_done()) {
    // Answered at once: nothing may refer to the gRPC call afterwards.
    call->Reply(EnqueueStreamOrdered(stream_->KeyedQueue(absl::StrCat(owner, " ", ctx->peer())),
                                     (*entry)->op, (*entry)->request,
                                     request.has_ready() ? &request.ready() : nullptr,
                                     request.has_done() ? &request.done() : nullptr, entry->get(),
                                     std::move(cc), nullptr, call->response()->mutable_stats()));
    return call;
  }
  cc.cancelled = [ctx] { return ctx->IsCancelled(); };
  call->Hold(cc.memory);
  std::shared_ptr<google::protobuf::Message> response(ops::NewOpResponse((*entry)->op));
  const std::shared_ptr<const ops::PreparedCallEntry> keep = *entry;
  deps_.runner->Start(keep->op, *keep->request, response.get(), std::move(cc),
                      [call, keep, response](absl::Status s) {
                        if (v1::CallStats* stats = ops::MutableStats(response.get())) {
                          call->response()->mutable_stats()->Swap(stats);
                        }
                        call->Reply(s);
                      });
  return call;
}

grpc::ServerUnaryReactor* AttentionService::ReleaseCall(grpc::CallbackServerContext* ctx,
                                                        const Raw* raw, Raw* reply) {
  auto* call =
      new UnaryCall<v1::ReleaseCallRequest, v1::ReleaseCallResponse>("ReleaseCall", raw, reply);
  if (!call->parsed()) return call;
  call->Reply(
      prepared_->Release(IdentifyCaller(deps_.peers, *ctx).owner, call->request().call_id()));
  return call;
}

}  // namespace attnd::server::grpc_front
