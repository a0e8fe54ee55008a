// The Session stream: a lease (regions registered under it are removed when the stream ends,
// however it ends) and pipelined calls on one stream. The stream's caller is identified once,
// when it opens: its lease, regions and calls belong to that owner (docs/SERVICE.md "Trust
// model"). Replies carry the request_id of their
// request and may come out of order. One write is in flight at a time; Finish comes once the
// client half-closed (or the call was cancelled), every call has completed and every reply was
// written; OnDone closes the lease.
#include <deque>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/common/log.h"
#include "server/grpc/service.h"
#include "server/grpc/status.h"

namespace attnd::server::grpc_front {
namespace {

using SessionReactorBase = grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>;
using ServiceRingTarget = AttentionService::RingTarget;

class SessionReactor final : public SessionReactorBase {
 public:
  SessionReactor(AttentionService* service, grpc::CallbackServerContext* ctx)
      : service_(service),
        deps_(service->deps()),
        ctx_(ctx),
        caller_(IdentifyCaller(deps_.peers, *ctx)) {
    service_->AddSession(1);
    const auto d = ctx->deadline();
    if (d != std::chrono::system_clock::time_point::max()) stream_deadline_ = absl::FromChrono(d);
    StartRead(&read_buf_);
  }

  void OnReadDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    if (!ok) {
      bool finish;
      {
        absl::MutexLock lock(&mu_);
        reads_done_ = true;
        finish = ShouldFinishLocked();
      }
      if (finish) FinishNow();
      return;
    }
    auto request = std::make_shared<v1::SessionRequest>();
    request->Swap(&read_buf_);
    if (!Handle(std::move(request))) {
      // Protocol error: stop reading and end the stream once pending work is done.
      bool finish;
      {
        absl::MutexLock lock(&mu_);
        reads_done_ = true;
        finish = ShouldFinishLocked();
      }
      if (finish) FinishNow();
      return;
    }
    bool pause;
    {
      absl::MutexLock lock(&mu_);
      pause = PendingLocked() >= kMaxPending;
      read_paused_ = pause;
    }
    if (!pause) StartRead(&read_buf_);
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<v1::SessionResponse> next;
    bool finish = false, resume = false;
    {
      absl::MutexLock lock(&mu_);
      writes_.pop_front();
      if (!ok) {
        broken_ = true;  // the client is gone: drop what is left
        writes_.clear();
        CancelAllLocked();
      }
      if (!writes_.empty()) {
        next = writes_.front();
      } else {
        writing_ = false;
      }
      resume = ResumeReadLocked();
      finish = ShouldFinishLocked();
    }
    if (next) StartWrite(next.get());
    if (resume) StartRead(&read_buf_);
    if (finish) FinishNow();
  }

  void OnCancel() override ABSL_LOCKS_EXCLUDED(mu_) {
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
      if (finish_status_.ok()) finish_status_ = absl::CancelledError("session cancelled");
      CancelAllLocked();
      // Reads and writes in flight complete with ok = false; OnReadDone then finishes. With
      // reading paused no read is in flight: reading is over now.
      if (read_paused_) reads_done_ = true;
      finish = ShouldFinishLocked();
    }
    if (finish) FinishNow();
  }

  void OnDone() override ABSL_LOCKS_EXCLUDED(mu_) {
    std::string lease;
    int64_t calls;
    {
      absl::MutexLock lock(&mu_);
      lease = lease_;
      calls = calls_;
    }
    if (!lease.empty()) {
      service_->LeaseClosing(caller_.owner, lease);  // its prepared calls go with it
      deps_.registry->CloseLease(lease);
      Log(LogLevel::kInfo, "session closed", {{"lease", lease}, {"calls", calls}});
    }
    service_->AddSession(-1);
    delete this;
  }

 private:
  // Handles one message; false on a protocol error (the stream then ends with finish_status_).
  bool Handle(std::shared_ptr<v1::SessionRequest> request) ABSL_LOCKS_EXCLUDED(mu_) {
    auto response = std::make_shared<v1::SessionResponse>();
    response->set_request_id(request->request_id());
    std::string lease;
    {
      absl::MutexLock lock(&mu_);
      lease = lease_;
    }
    if (lease.empty()) {
      if (request->call_case() != v1::SessionRequest::kOpen) {
        absl::MutexLock lock(&mu_);
        finish_status_ = absl::FailedPreconditionError(
            "the first Session message must be `open` (it opens the lease)");
        return false;
      }
      lease = deps_.registry->OpenLease(caller_.owner);
      {
        absl::MutexLock lock(&mu_);
        lease_ = lease;
      }
      response->mutable_opened()->set_lease_id(lease);
      Log(LogLevel::kInfo, "session opened",
          {{"lease", lease},
           {"client", request->open().client_name()},
           {"owner", caller_.owner},
           {"peer", ctx_->peer()}});
      Reply(std::move(response));
      return true;
    }
    switch (request->call_case()) {
      case v1::SessionRequest::kOpen:
        SetError(response.get(), absl::FailedPreconditionError("session is already open"));
        Reply(std::move(response));
        return true;
      case v1::SessionRequest::kCancel: {
        absl::MutexLock lock(&mu_);
        auto it = cancels_.find(request->cancel().target_request_id());
        if (it != cancels_.end()) it->second->store(true);
      }
        Reply(std::move(response));
        return true;
      case v1::SessionRequest::kRegisterHostRegion:
        SetError(response.get(), RegisterHostRegion(deps_.registry, caller_,
                                                    request->register_host_region(), lease));
        if (response->code() == 0) response->mutable_register_region();
        Reply(std::move(response));
        return true;
      case v1::SessionRequest::kRegisterDeviceRegion:
        SetError(response.get(), RegisterDeviceRegion(deps_.registry, caller_,
                                                      request->register_device_region(), lease));
        if (response->code() == 0) response->mutable_register_region();
        Reply(std::move(response));
        return true;
      case v1::SessionRequest::kUnregisterRegion: Unregister(request, response, lease); return true;
      case v1::SessionRequest::kIndexerLogits:
        return RunOp(ops::OpId::kIndexerLogits, request, response, request->indexer_logits(),
                     response->mutable_indexer_logits());
      case v1::SessionRequest::kIndexerLogitsPaged:
        return RunOp(ops::OpId::kIndexerLogitsPaged, request, response,
                     request->indexer_logits_paged(), response->mutable_indexer_logits_paged());
      case v1::SessionRequest::kTopK:
        return RunOp(ops::OpId::kTopK, request, response, request->top_k(),
                     response->mutable_top_k());
      case v1::SessionRequest::kSparseMla:
        return RunOp(ops::OpId::kSparseMla, request, response, request->sparse_mla(),
                     response->mutable_sparse_mla());
      case v1::SessionRequest::kMlaDecode:
        return RunOp(ops::OpId::kMlaDecode, request, response, request->mla_decode(),
                     response->mutable_mla_decode());
      case v1::SessionRequest::kMlaPrefill:
        return RunOp(ops::OpId::kMlaPrefill, request, response, request->mla_prefill(),
                     response->mutable_mla_prefill());
      case v1::SessionRequest::kDsaAttention:
        return RunOp(ops::OpId::kDsaAttention, request, response, request->dsa_attention(),
                     response->mutable_dsa_attention());
      case v1::SessionRequest::kPrepareCall: {
        absl::StatusOr<uint64_t> id = service_->Prepare(caller_, request->prepare_call(), lease,
                                                        service_->NewCallMemory(ctx_->peer()));
        if (id.ok()) {
          response->mutable_prepare_call()->set_call_id(*id);
          response->mutable_prepare_call()->set_op(
              ops::OpName(PreparedOp(request->prepare_call())->first));
        }
        SetError(response.get(), id.status());
        Reply(std::move(response));
        return true;
      }
      case v1::SessionRequest::kRunPrepared: RunPrepared(request, response); return true;
      case v1::SessionRequest::kReleaseCall:
        SetError(response.get(),
                 service_->prepared()->Release(caller_.owner, request->release_call().call_id()));
        if (response->code() == 0) response->mutable_release_call();
        Reply(std::move(response));
        return true;
      case v1::SessionRequest::kOpenRing: {
        ServiceRingTarget target;
        {
          absl::MutexLock lock(&mu_);
          if (!ordered_queue_) ordered_queue_ = service_->stream()->NewQueue("session " + lease_);
          target.queue = ordered_queue_;
        }
        target.grpc_peer = ctx_->peer();
        target.deadline = stream_deadline_;
        // Ring calls are cancelled with the stream (they are not the Session's requests, so a
        // `cancel` cannot name them).
        target.cancelled = [flag = ring_cancelled_] { return flag->load(); };
        target.label = absl::StrCat("session ", lease);
        absl::StatusOr<v1::OpenRingResponse> r =
            service_->OpenRingFor(caller_, request->open_ring(), lease, std::move(target));
        if (r.ok()) response->mutable_open_ring()->Swap(&*r);
        SetError(response.get(), r.status());
        Reply(std::move(response));
        return true;
      }
      case v1::SessionRequest::kCloseRing:
        SetError(response.get(),
                 service_->rings()->Close(caller_.owner, request->close_ring().ring_id()));
        if (response->code() == 0) response->mutable_close_ring();
        Reply(std::move(response));
        return true;
      case v1::SessionRequest::CALL_NOT_SET: break;
    }
    SetError(response.get(), absl::InvalidArgumentError("Session message carries no call"));
    Reply(std::move(response));
    return true;
  }

  static void SetError(v1::SessionResponse* response, const absl::Status& s) {
    if (s.ok()) return;
    response->clear_result();
    response->set_code(static_cast<int32_t>(s.code()));
    response->set_message(std::string(s.message()));
    response->set_status_details(StatusDetails(s));
  }

  void Unregister(std::shared_ptr<v1::SessionRequest> request,
                  std::shared_ptr<v1::SessionResponse> response, const std::string& lease)
      ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      ++inflight_;
    }
    const std::vector<std::string> going =
        service_->RegionsNamed(caller_.owner, request->unregister_region().name(), lease);
    absl::Status s =
        deps_.registry->UnregisterAsync(caller_.owner, request->unregister_region().name(), lease,
                                        [this, response](std::vector<std::string> removed) {
                                          service_->RegionsReleased(caller_.owner, removed);
                                          auto* out = response->mutable_unregister_region();
                                          for (std::string& name : removed)
                                            out->add_removed(std::move(name));
                                          Reply(response);
                                          CallDone();
                                        });
    if (s.ok()) service_->RegionsRemoved(caller_.owner, going);
    if (!s.ok()) {
      SetError(response.get(), s);
      Reply(std::move(response));
      CallDone();
    }
  }

  bool RunOp(ops::OpId id, std::shared_ptr<v1::SessionRequest> request,
             std::shared_ptr<v1::SessionResponse> response,
             const google::protobuf::Message& op_request, google::protobuf::Message* op_response)
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (ops::HasSignals(op_request)) {
      // The op request lives in `request`: the call keeps it through an aliasing pointer.
      StreamOrdered(id, request, response,
                    std::shared_ptr<const google::protobuf::Message>(request, &op_request),
                    ops::FindSignal(op_request, "ready"), ops::FindSignal(op_request, "done"),
                    /*prepared=*/nullptr, MutableStats(op_response));
      return true;
    }
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    const uint64_t client_id = request->request_id();
    {
      absl::MutexLock lock(&mu_);
      ++inflight_;
      ++calls_;
      cancels_[client_id] = cancelled;
      if (broken_) cancelled->store(true);
    }
    ops::CallContext cc;
    cc.deadline = stream_deadline_;
    if (request->timeout_seconds() > 0) {
      cc.deadline = std::min(cc.deadline, absl::Now() + absl::Seconds(request->timeout_seconds()));
    }
    cc.cancelled = [cancelled] { return cancelled->load(); };
    cc.origin = absl::StrCat("session ", lease_for_logs(), " id ", client_id);
    cc.owner = caller_.owner;
    cc.memory = service_->NewCallMemory(ctx_->peer());
    // The reply keeps the call's memory reserved until it has been written.
    std::shared_ptr<v1::SessionResponse> reply(
        response.get(), [response, memory = cc.memory](v1::SessionResponse*) {});
    deps_.runner->Start(id, op_request, op_response, std::move(cc),
                        [this, request, reply, cancelled, client_id](absl::Status s) {
                          SetError(reply.get(), s);
                          {
                            absl::MutexLock lock(&mu_);
                            auto it = cancels_.find(client_id);
                            if (it != cancels_.end() && it->second == cancelled) {
                              cancels_.erase(it);
                            }
                          }
                          Reply(reply);
                          CallDone();
                        });
    return true;
  }

  static v1::CallStats* MutableStats(google::protobuf::Message* op_response) {
    return ops::MutableStats(op_response);
  }

  ops::CallContext NewContext(const v1::SessionRequest& request) ABSL_LOCKS_EXCLUDED(mu_) {
    ops::CallContext cc;
    cc.deadline = stream_deadline_;
    if (request.timeout_seconds() > 0) {
      cc.deadline = std::min(cc.deadline, absl::Now() + absl::Seconds(request.timeout_seconds()));
    }
    cc.origin = absl::StrCat("session ", lease_for_logs(), " id ", request.request_id());
    cc.owner = caller_.owner;
    cc.memory = service_->NewCallMemory(ctx_->peer());
    return cc;
  }

  // A stream-ordered call of this Session: answered "enqueued" at once; it runs behind the
  // Session's earlier stream-ordered calls, and when it fails later a second message (its
  // request_id, code, call_failed) says so. The stream ends only after it is over.
  void StreamOrdered(ops::OpId id, std::shared_ptr<v1::SessionRequest> request,
                     std::shared_ptr<v1::SessionResponse> response,
                     std::shared_ptr<const google::protobuf::Message> op_request,
                     const v1::Signal* ready, const v1::Signal* done,
                     const ops::PreparedCallEntry* prepared, v1::CallStats* stats)
      ABSL_LOCKS_EXCLUDED(mu_) {
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    const uint64_t client_id = request->request_id();
    std::shared_ptr<ops::StreamOrderedRunner::Queue> queue;
    {
      absl::MutexLock lock(&mu_);
      if (!ordered_queue_) ordered_queue_ = service_->stream()->NewQueue("session " + lease_);
      queue = ordered_queue_;
      ++ordered_;
      ++calls_;
      cancels_[client_id] = cancelled;
      if (broken_) cancelled->store(true);
    }
    ops::CallContext cc = NewContext(*request);
    cc.request_id = 0;
    cc.cancelled = [cancelled] { return cancelled->load(); };
    // The server's id, known once assigned: the failure message names it.
    cc.request_id = deps_.runner->NewRequestId();
    const uint64_t server_id = cc.request_id;
    absl::Status s = service_->EnqueueStreamOrdered(
        queue, id, std::move(op_request), ready, done, prepared, std::move(cc),
        [this, id, client_id, server_id, cancelled](absl::Status status) {
          if (!status.ok()) {
            auto failed = std::make_shared<v1::SessionResponse>();
            failed->set_request_id(client_id);
            SetError(failed.get(), status);
            failed->mutable_call_failed()->set_server_request_id(server_id);
            failed->mutable_call_failed()->set_op(ops::OpName(id));
            Reply(std::move(failed));
          }
          OrderedDone(client_id, cancelled);
        },
        stats);
    SetError(response.get(), s);
    Reply(std::move(response));
    if (!s.ok()) OrderedDone(client_id, cancelled);
  }

  void OrderedDone(uint64_t client_id, const std::shared_ptr<std::atomic<bool>>& cancelled)
      ABSL_LOCKS_EXCLUDED(mu_) {
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      auto it = cancels_.find(client_id);
      if (it != cancels_.end() && it->second == cancelled) cancels_.erase(it);
      --ordered_;
      finish = ShouldFinishLocked();
    }
    if (finish) FinishNow();
  }

  void RunPrepared(std::shared_ptr<v1::SessionRequest> request,
                   std::shared_ptr<v1::SessionResponse> response) ABSL_LOCKS_EXCLUDED(mu_) {
    const v1::RunPreparedRequest& run = request->run_prepared();
    absl::StatusOr<std::shared_ptr<const ops::PreparedCallEntry>> entry =
        service_->prepared()->Find(caller_.owner, run.call_id());
    if (!entry.ok()) {
      SetError(response.get(), entry.status());
      Reply(std::move(response));
      return;
    }
    v1::CallStats* stats = response->mutable_run_prepared()->mutable_stats();
    if (run.has_ready() || run.has_done()) {
      StreamOrdered((*entry)->op, request, response, (*entry)->request,
                    run.has_ready() ? &run.ready() : nullptr,
                    run.has_done() ? &run.done() : nullptr, entry->get(), stats);
      return;
    }
    // Blocking, like the op's own call: the reply carries its stats.
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    const uint64_t client_id = request->request_id();
    {
      absl::MutexLock lock(&mu_);
      ++inflight_;
      ++calls_;
      cancels_[client_id] = cancelled;
      if (broken_) cancelled->store(true);
    }
    ops::CallContext cc = NewContext(*request);
    cc.cancelled = [cancelled] { return cancelled->load(); };
    std::shared_ptr<google::protobuf::Message> op_response(ops::NewOpResponse((*entry)->op));
    const std::shared_ptr<const ops::PreparedCallEntry> keep = *entry;
    std::shared_ptr<v1::SessionResponse> reply(
        response.get(), [response, memory = cc.memory](v1::SessionResponse*) {});
    deps_.runner->Start(
        keep->op, *keep->request, op_response.get(), std::move(cc),
        [this, keep, op_response, reply, stats, client_id, cancelled](absl::Status s) {
          if (v1::CallStats* st = ops::MutableStats(op_response.get())) {
            stats->Swap(st);
          }
          SetError(reply.get(), s);
          {
            absl::MutexLock lock(&mu_);
            auto it = cancels_.find(client_id);
            if (it != cancels_.end() && it->second == cancelled) {
              cancels_.erase(it);
            }
          }
          Reply(reply);
          CallDone();
        });
  }

  std::string lease_for_logs() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return lease_;
  }

  // Queues a reply; thread-safe.
  void Reply(std::shared_ptr<v1::SessionResponse> response) ABSL_LOCKS_EXCLUDED(mu_) {
    bool start = false;
    {
      absl::MutexLock lock(&mu_);
      if (broken_) return;
      writes_.push_back(std::move(response));
      if (!writing_) {
        writing_ = true;
        start = true;
      }
    }
    if (start) StartWrite(writes_front());
  }

  v1::SessionResponse* writes_front() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return writes_.front().get();
  }

  // One call (op or unregister) finished; `this` must not be touched after this returns.
  void CallDone() ABSL_LOCKS_EXCLUDED(mu_) {
    bool finish, resume;
    {
      absl::MutexLock lock(&mu_);
      --inflight_;
      resume = ResumeReadLocked();
      finish = ShouldFinishLocked();
    }
    if (resume) StartRead(&read_buf_);
    if (finish) FinishNow();
  }

  // Calls running plus replies not yet written: reading pauses at kMaxPending (flow control
  // for a client that sends faster than it reads) and resumes below half of it.
  size_t PendingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<size_t>(inflight_) + writes_.size();
  }
  bool ResumeReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!read_paused_ || reads_done_) return false;
    if (broken_) {
      reads_done_ = true;  // no read in flight and none will be started
      read_paused_ = false;
      return false;
    }
    if (PendingLocked() >= kMaxPending / 2) return false;
    read_paused_ = false;
    return true;
  }

  void CancelAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& [id, flag] : cancels_) flag->store(true);
    ring_cancelled_->store(true);
  }

  bool ShouldFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !reads_done_ || inflight_ > 0 || ordered_ > 0 || writing_) return false;
    finished_ = true;
    return true;
  }

  void FinishNow() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::Status s;
    {
      absl::MutexLock lock(&mu_);
      s = finish_status_;
    }
    Finish(ToGrpcStatus(s));
  }

  static constexpr size_t kMaxPending = 128;

  AttentionService* const service_;
  const ServiceDeps& deps_;
  grpc::CallbackServerContext* const ctx_;
  const Caller caller_;
  absl::Time stream_deadline_ = absl::InfiniteFuture();
  v1::SessionRequest read_buf_;  // one read in flight at a time owns it

  absl::Mutex mu_;
  std::string lease_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<v1::SessionResponse>> writes_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<std::atomic<bool>>> cancels_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int inflight_ ABSL_GUARDED_BY(mu_) = 0;
  // Stream-ordered calls not over yet: they hold the stream open, not its reading (they are
  // bounded by the queue's own cap).
  int64_t ordered_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<ops::StreamOrderedRunner::Queue> ordered_queue_ ABSL_GUARDED_BY(mu_);
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  // Set when the stream is cancelled or broken: the calls the Session's rings queued stop.
  const std::shared_ptr<std::atomic<bool>> ring_cancelled_ =
      std::make_shared<std::atomic<bool>>(false);
  absl::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* AttentionService::Session(
    grpc::CallbackServerContext* ctx) {
  return new SessionReactor(this, ctx);
}

}  // namespace attnd::server::grpc_front
