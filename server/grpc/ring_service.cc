// Submission rings (docs/SERVICE.md "Submission rings"): the unary OpenRing and CloseRing, and
// OpenRing's body shared with the Session stream. A ring's entries run the caller's prepared
// calls stream-ordered through EnqueueStreamOrdered, as RunPrepared with signals does: a unary
// ring's on the caller's ordered queue of its connection, a Session's on the Session's.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/grpc/service.h"
#include "server/grpc/status.h"
#include "server/grpc/unary_call.h"

namespace attnd::server::grpc_front {

absl::StatusOr<v1::OpenRingResponse> AttentionService::OpenRingFor(
    const Caller& caller, const v1::OpenRingRequest& request, const std::string& lease,
    RingTarget target) {
  if (!lease.empty() && !deps_.registry->LeaseOpen(lease)) {
    return absl::NotFoundError(absl::StrCat("lease_id: no open lease '", lease, "'"));
  }
  ops::SubmissionRingTable::Spec spec;
  spec.owner = caller.owner;
  spec.lease = lease;
  spec.region = request.region();
  spec.offset = request.offset();
  spec.entries = request.entries();
  spec.signal_region = request.signal_region();
  spec.label = target.label;
  // The poller thread calls this for every valid-looking entry; everything it uses is captured
  // by value or outlives the ring table (the service's tables and runner).
  spec.submit = [this, owner = caller.owner, t = std::move(target)](
                    uint64_t call_id, const v1::Signal* ready,
                    const v1::Signal& done) -> absl::Status {
    absl::StatusOr<std::shared_ptr<const ops::PreparedCallEntry>> entry =
        prepared_->Find(owner, call_id);
    if (!entry.ok()) return entry.status();
    ops::CallContext cc;
    cc.deadline = t.deadline;
    cc.cancelled = t.cancelled;
    cc.origin = absl::StrCat(t.label, " ring call ", call_id);
    cc.owner = owner;
    cc.memory = NewCallMemory(t.grpc_peer);
    return EnqueueStreamOrdered(t.queue, (*entry)->op, (*entry)->request, ready, &done,
                                entry->get(), std::move(cc), nullptr, nullptr);
  };
  absl::StatusOr<uint64_t> id = rings_->Open(std::move(spec));
  if (!id.ok()) return id.status();
  v1::OpenRingResponse response;
  response.set_ring_id(*id);
  response.set_byte_size(ops::ring_layout::Bytes(request.entries()));
  return response;
}

grpc::ServerUnaryReactor* AttentionService::OpenRing(grpc::CallbackServerContext* ctx,
                                                     const Raw* raw, Raw* reply) {
  auto* call = new UnaryCall<v1::OpenRingRequest, v1::OpenRingResponse>("OpenRing", raw, reply);
  if (!call->parsed()) return call;
  const Caller caller = IdentifyCaller(deps_.peers, *ctx);
  RingTarget target;
  // The same queue as the caller's unary stream-ordered calls on this connection.
  const std::string key = absl::StrCat(caller.owner, " ", ctx->peer());
  target.queue = stream_->KeyedQueue(key);
  target.grpc_peer = ctx->peer();
  target.label = absl::StrCat("unary ", key);
  absl::StatusOr<v1::OpenRingResponse> r =
      OpenRingFor(caller, call->request(), call->request().lease_id(), std::move(target));
  if (r.ok()) call->response()->Swap(&*r);
  call->Reply(r.status());
  return call;
}

grpc::ServerUnaryReactor* AttentionService::CloseRing(grpc::CallbackServerContext* ctx,
                                                      const Raw* raw, Raw* reply) {
  auto* call = new UnaryCall<v1::CloseRingRequest, v1::CloseRingResponse>("CloseRing", raw, reply);
  if (!call->parsed()) return call;
  call->Reply(rings_->Close(IdentifyCaller(deps_.peers, *ctx).owner, call->request().ring_id()));
  return call;
}

}  // namespace attnd::server::grpc_front
