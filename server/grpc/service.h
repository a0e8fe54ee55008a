// The attnd.v1.Attention gRPC service (callback API). Reactors never block: op calls go to the
// engine's scheduler through CallRunner and Finish from its completion; region unregistration
// finishes when the region's in-flight requests end. Methods are defined one file per RPC family:
// info_service.cc, region_service.cc, op_service.cc, session_service.cc. The unary methods take
// their messages raw and parse them in UnaryCall (unary_call.h), so that an unparsable request is
// INVALID_ARGUMENT with a message.
//   AttentionService service(deps);
//   builder.RegisterService(&service);
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attnd/v1/attention.grpc.pb.h"
#include "server/engine/backend.h"
#include "server/engine/call_memory.h"
#include "server/engine/scheduler.h"
#include "server/grpc/peers.h"
#include "server/ops/call_runner.h"
#include "server/ops/op_handler.h"
#include "server/ops/prepared_calls.h"
#include "server/ops/stream_ordered.h"
#include "server/ops/submission_rings.h"
#include "server/regions/registry.h"

namespace attnd::server::grpc_front {

struct ServiceLimits {
  uint64_t max_message_bytes = 0;
  int queue_capacity = 0;
  int workers = 0;
  int cpu_threads = 0;
  bool allow_client_shm = false;
  uint64_t pool_bytes_per_device = 0;  // GPU backends
  bool graphs = false;
  int streams_per_device = 0;
  absl::Duration worker_spin = absl::ZeroDuration();  // --worker-spin resolved
};

// Everything the service uses; borrowed, must outlive the service (and the grpc::Server).
struct ServiceDeps {
  std::string version;
  const engine::Backend* backend = nullptr;
  const ops::OpTable* ops = nullptr;
  ops::CallRunner* runner = nullptr;
  regions::RegionRegistry* registry = nullptr;
  // Host memory of op calls (inline outputs, aligned copies, index snapshots), per client and in
  // total; null: no budget.
  engine::CallMemoryBudget* call_memory = nullptr;
  // Peer credentials of the unix listener's connections (the per-client key); may be null.
  const UnixPeers* peers = nullptr;
  ServiceLimits limits;
  // The longest a stream-ordered call waits for its ready word (--signal-timeout).
  absl::Duration signal_timeout = absl::Seconds(60);
  // How long the submission-ring poller keeps polling after it took an entry, and the
  // stream-ordered waiter after a call was queued or started (--worker-spin).
  absl::Duration poll_spin = absl::ZeroDuration();
};

// Every unary method raw (grpc::ByteBuffer in and out; UnaryCall parses), Session typed.
using RawUnaryAttentionService = v1::Attention::WithRawCallbackMethod_GetInfo<
    v1::Attention::WithRawCallbackMethod_RegisterHostRegion<
        v1::Attention::WithRawCallbackMethod_RegisterDeviceRegion<
            v1::Attention::WithRawCallbackMethod_UnregisterRegion<v1::Attention::WithRawCallbackMethod_ListRegions<
                v1::Attention::WithRawCallbackMethod_IndexerLogits<
                    v1::Attention::WithRawCallbackMethod_IndexerLogitsPaged<
                        v1::Attention::WithRawCallbackMethod_TopK<
                            v1::Attention::WithRawCallbackMethod_SparseMla<
                                v1::Attention::WithRawCallbackMethod_MlaDecode<
                                    v1::Attention::WithRawCallbackMethod_MlaPrefill<
                                        v1::Attention::WithRawCallbackMethod_DsaAttention<
                                            v1::Attention::WithRawCallbackMethod_PrepareCall<
                                                v1::Attention::WithRawCallbackMethod_RunPrepared<
                                                    v1::Attention::WithRawCallbackMethod_ReleaseCall<
                                                        v1::Attention::WithRawCallbackMethod_OpenRing<
                                                            v1::Attention::WithRawCallbackMethod_CloseRing<
                                                                v1::Attention::
                                                                    WithCallbackMethod_Session<
                                                                        v1::Attention::
                                                                            Service>>>>>>>>>>>>>>>>>>;

class AttentionService final : public RawUnaryAttentionService {
 public:
  explicit AttentionService(ServiceDeps deps);
  using Raw = grpc::ByteBuffer;

  // info_service.cc
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* ctx, const Raw* request,
                                    Raw* response) override;

  // region_service.cc
  grpc::ServerUnaryReactor* RegisterHostRegion(grpc::CallbackServerContext* ctx, const Raw* request,
                                               Raw* response) override;
  grpc::ServerUnaryReactor* RegisterDeviceRegion(grpc::CallbackServerContext* ctx,
                                                 const Raw* request, Raw* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* ctx, const Raw* request,
                                             Raw* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* ctx, const Raw* request,
                                        Raw* response) override;

  // op_service.cc
  grpc::ServerUnaryReactor* IndexerLogits(grpc::CallbackServerContext* ctx, const Raw* request,
                                          Raw* response) override;
  grpc::ServerUnaryReactor* IndexerLogitsPaged(grpc::CallbackServerContext* ctx, const Raw* request,
                                               Raw* response) override;
  grpc::ServerUnaryReactor* TopK(grpc::CallbackServerContext* ctx, const Raw* request,
                                 Raw* response) override;
  grpc::ServerUnaryReactor* SparseMla(grpc::CallbackServerContext* ctx, const Raw* request,
                                      Raw* response) override;
  grpc::ServerUnaryReactor* MlaDecode(grpc::CallbackServerContext* ctx, const Raw* request,
                                      Raw* response) override;
  grpc::ServerUnaryReactor* MlaPrefill(grpc::CallbackServerContext* ctx, const Raw* request,
                                       Raw* response) override;
  grpc::ServerUnaryReactor* DsaAttention(grpc::CallbackServerContext* ctx, const Raw* request,
                                         Raw* response) override;

  // prepared_service.cc
  grpc::ServerUnaryReactor* PrepareCall(grpc::CallbackServerContext* ctx, const Raw* request,
                                        Raw* response) override;
  grpc::ServerUnaryReactor* RunPrepared(grpc::CallbackServerContext* ctx, const Raw* request,
                                        Raw* response) override;
  grpc::ServerUnaryReactor* ReleaseCall(grpc::CallbackServerContext* ctx, const Raw* request,
                                        Raw* response) override;
  // ring_service.cc
  grpc::ServerUnaryReactor* OpenRing(grpc::CallbackServerContext* ctx, const Raw* request,
                                     Raw* response) override;
  grpc::ServerUnaryReactor* CloseRing(grpc::CallbackServerContext* ctx, const Raw* request,
                                      Raw* response) override;

  // session_service.cc
  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* Session(
      grpc::CallbackServerContext* ctx) override;

  const ServiceDeps& deps() const { return deps_; }
  // Sessions open now (for logs and tests).
  int64_t open_sessions() const { return open_sessions_.load(); }
  void AddSession(int delta) { open_sessions_.fetch_add(delta); }
  // A new CallMemory for a call of the client on `grpc_peer` (null without a budget).
  std::shared_ptr<engine::CallMemory> NewCallMemory(absl::string_view grpc_peer) const;

  // Stream-ordered and prepared calls (prepared_service.cc; docs/SERVICE.md "Stream-ordered
  // calls and prepared calls"), shared by the unary RPCs and the Session stream.
  ops::StreamOrderedRunner* stream() const { return stream_.get(); }
  ops::PreparedCallTable* prepared() const { return prepared_.get(); }
  ops::SubmissionRingTable* rings() const { return rings_.get(); }
  // Where a ring's entries go and as what (ring_service.cc).
  struct RingTarget {
    std::shared_ptr<ops::StreamOrderedRunner::Queue> queue;  // the caller's ordered queue
    std::string grpc_peer;                                   // the call memory budget's client
    absl::Time deadline = absl::InfiniteFuture();            // of every call it queues
    std::function<bool()> cancelled;  // of every call it queues; may be empty
    std::string label;                // for logs
  };
  // OpenRing's body (docs/SERVICE.md "Submission rings"): opens a ring in `caller`'s namespace
  // under `lease` (may be empty; must be open) whose entries run the caller's prepared calls
  // stream-ordered on `target.queue`, each exactly as RunPrepared with signals would.
  absl::StatusOr<v1::OpenRingResponse> OpenRingFor(const Caller& caller,
                                                   const v1::OpenRingRequest& request,
                                                   const std::string& lease, RingTarget target);
  // Queues a stream-ordered call of op `id` (its request has ready and/or done, or they are given
  // by RunPrepared) on `queue`; on OK `op_response`'s stats say enqueued. `ctx.request_id` is
  // assigned when 0. `finished` as in StreamOrderedRunner::Submission.
  absl::Status EnqueueStreamOrdered(const std::shared_ptr<ops::StreamOrderedRunner::Queue>& queue,
                                    ops::OpId id,
                                    std::shared_ptr<const google::protobuf::Message> request,
                                    const v1::Signal* ready, const v1::Signal* done,
                                    const ops::PreparedCallEntry* prepared, ops::CallContext ctx,
                                    std::function<void(absl::Status)> finished,
                                    v1::CallStats* stats);
  // PrepareCall's body: validates the op request (every tensor in a region) in `caller`'s
  // namespace and keeps it under `lease` (may be empty).
  absl::StatusOr<uint64_t> Prepare(const Caller& caller, const v1::PrepareCallRequest& request,
                                   const std::string& lease,
                                   const std::shared_ptr<engine::CallMemory>& memory);
  // The regions of `owner`'s that went (unregistered, or their lease ended): prepared calls
  // naming them are released and the submission rings using them closed.
  void RegionsRemoved(const std::string& owner, const std::vector<std::string>& names);
  // An unregistration's completion (its regions released, possibly long after the names were
  // freed): RegionsRemoved for those of `removed` that `owner` has not registered again since.
  // A name registered anew names a different region, whose prepared calls and rings stay.
  void RegionsReleased(const std::string& owner, const std::vector<std::string>& removed);
  // The names an UnregisterRegion{name, lease} of `owner`'s removes at once: `name`, or (empty)
  // the regions of `lease` (empty: those under no lease). Call before unregistering.
  std::vector<std::string> RegionsNamed(const std::string& owner, const std::string& name,
                                        const std::string& lease) const;
  // The lease ended: its prepared calls and rings, and the prepared calls and rings naming its
  // regions, are released.
  // Call before the registry's CloseLease.
  void LeaseClosing(const std::string& owner, const std::string& lease);

 private:
  template <class Request, class Response>
  grpc::ServerUnaryReactor* RunOp(ops::OpId id, grpc::CallbackServerContext* ctx,
                                  const Raw* request, Raw* response);

  const ServiceDeps deps_;
  std::atomic<int64_t> open_sessions_{0};
  std::unique_ptr<ops::PreparedCallTable> prepared_;
  std::unique_ptr<ops::StreamOrderedRunner> stream_;  // after prepared_: destroyed first
  std::unique_ptr<ops::SubmissionRingTable> rings_;   // after stream_: its poller queues there
};

// The op a PrepareCallRequest carries (its oneof), or NOT set: INVALID_ARGUMENT.
absl::StatusOr<std::pair<ops::OpId, const google::protobuf::Message*>> PreparedOp(
    const v1::PrepareCallRequest& request);

// Region RPC bodies shared by the unary RPCs and the Session stream, registering in `caller`'s
// namespace; `lease` overrides the request's lease_id when not empty. Host regions:
// PERMISSION_DENIED unless the caller is a local (unix) peer and the shm object is its own
// (docs/SERVICE.md "Trust model").
absl::Status RegisterHostRegion(regions::RegionRegistry* registry, const Caller& caller,
                                const v1::RegisterHostRegionRequest& request,
                                const std::string& lease);
absl::Status RegisterDeviceRegion(regions::RegionRegistry* registry, const Caller& caller,
                                  const v1::RegisterDeviceRegionRequest& request,
                                  const std::string& lease);

}  // namespace attnd::server::grpc_front
