// Fuzz target: a Session stream without the transport. An input is a run of Session messages
// (env.h ReadRequests) handled as SessionReactor handles them: the first must be `open` (it opens
// the lease, else the stream ends), regions are registered and unregistered under the lease, op
// calls go through the CallRunner onto a scheduler worker and the CPU backend (pipelined: replies
// may come out of order), `cancel` cancels a call by request id, and when the input ends every
// call is awaited and the lease closed. Then nothing may be left registered or mapped, no call
// memory reserved, and every call and unregistration must have completed exactly once. Calls too
// large to run here (env.h kMaxRunFlops) are skipped. Op calls with ready/done signals go through
// the StreamOrderedRunner on the Session's queue (a short signal timeout, so an input whose words
// are never reached ends quickly), and prepare_call / run_prepared / release_call through a
// PreparedCallTable as the service handles them (docs/SERVICE.md "Stream-ordered calls and
// prepared calls"). Findings: sanitizer reports, statuses no request may produce, broken
// invariants.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "fuzz/env.h"
#include "server/engine/cpu_backend.h"
#include "server/engine/scheduler.h"
#include "server/ops/call_runner.h"
#include "server/ops/prepared_calls.h"
#include "server/ops/stream_ordered.h"

namespace attnd::fuzz {
namespace {

using server::regions::RegionKind;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: invariant broken: %s\n", what);
  std::abort();
}

// The engine shared by every input: one worker on the CPU backend, as a small daemon has.
struct Engine {
  server::engine::CpuBackend backend{nullptr};
  server::engine::Scheduler scheduler{{.queue_capacity = 8, .workers = 1}, &backend};
};

class Session {
 public:
  Session()
      : registry_(FuzzEnv::Get().NewRegistry()),
        runner_(&FuzzEnv::Get().ops(), &engine().scheduler, registry_.get(), nullptr,
                {.max_inline_bytes = kMaxInlineBytes}) {}

  // Handles one message; false ends the stream (a protocol error).
  bool Handle(const v1::SessionRequest& m) {
    if (lease_.empty()) {
      if (m.call_case() != v1::SessionRequest::kOpen) return false;
      lease_ = registry_->OpenLease();
      return true;
    }
    const FuzzEnv& env = FuzzEnv::Get();
    switch (m.call_case()) {
      case v1::SessionRequest::kOpen: return true;  // FAILED_PRECONDITION, the stream goes on
      case v1::SessionRequest::kCancel: {
        auto it = cancels_.find(m.cancel().target_request_id());
        if (it != cancels_.end()) it->second->store(true);
        return true;
      }
      case v1::SessionRequest::kRegisterHostRegion: {
        const v1::RegisterHostRegionRequest& r = m.register_host_region();
        CheckRequestStatus(registry_->RegisterHost(HostSpecOf(r, env.MapKey(r.key()), lease_)),
                           "register host");
        return true;
      }
      case v1::SessionRequest::kRegisterDeviceRegion: {
        const v1::RegisterDeviceRegionRequest& r = m.register_device_region();
        CheckRequestStatus(registry_->RegisterDevice(DeviceSpecOf(r, lease_)), "register device");
        return true;
      }
      case v1::SessionRequest::kUnregisterRegion: {
        Started();
        const absl::Status s = registry_->UnregisterAsync(
            m.unregister_region().name(), lease_, [this](std::vector<std::string>) { Done(); });
        CheckRequestStatus(s, "unregister");
        if (!s.ok()) Done();
        return true;
      }
      case v1::SessionRequest::kPrepareCall: Prepare(m.prepare_call()); return true;
      case v1::SessionRequest::kRunPrepared:
        RunPrepared(m.request_id(), m.run_prepared());
        return true;
      case v1::SessionRequest::kReleaseCall:
        CheckRequestStatus(prepared_.Release("", m.release_call().call_id()), "release call");
        return true;
      case v1::SessionRequest::CALL_NOT_SET: return true;  // INVALID_ARGUMENT
      default: RunOp(m); return true;
    }
  }

  // The stream's end: waits for every call, closes the lease, checks that nothing is left.
  void Close() {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](int* pending) { return *pending == 0; }, &pending_));
    }
    // The worker may still be returning from a call's last callback, and drops the call (its
    // memory reservation) after it: wait until it is idle.
    const absl::Time limit = absl::Now() + absl::Seconds(10);
    while ((engine().scheduler.running() > 0 || engine().scheduler.queued() > 0 ||
            budget_.used() > 0) &&
           absl::Now() < limit) {
      absl::SleepFor(absl::Microseconds(20));
    }
    Check(stream_.pending() == 0, "every stream-ordered call ended");
    if (!lease_.empty()) {
      prepared_.DropLease(lease_);
      registry_->CloseLease(lease_);
    }
    Check(prepared_.live() == 0, "the lease took every prepared call with it");
    Check(registry_->List().empty(), "the lease took every region with it");
    for (RegionKind kind : {RegionKind::kHost, RegionKind::kDevice}) {
      int64_t count = -1, bytes = -1;
      registry_->Totals(kind, &count, &bytes);
      Check(count == 0 && bytes == 0, "nothing mapped once the session closed");
    }
    Check(budget_.used() == 0, "no call memory reserved once every call is done");
  }

 private:
  static Engine& engine() {
    static Engine* e = new Engine();
    return *e;
  }

  void Started() {
    absl::MutexLock lock(&mu_);
    ++pending_;
  }
  void Done() {
    absl::MutexLock lock(&mu_);
    Check(pending_ > 0, "a call completed twice");
    --pending_;
  }

  server::ops::CallContext NewContext(uint64_t request_id, double timeout_seconds) {
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    cancels_[request_id] = cancelled;
    server::ops::CallContext cc;
    cc.request_id = runner_.NewRequestId();
    if (timeout_seconds > 0 && timeout_seconds < 1e6) {
      cc.deadline = absl::Now() + absl::Seconds(timeout_seconds);
    }
    cc.cancelled = [cancelled] { return cancelled->load(); };
    cc.origin = "fuzz session";
    cc.memory = std::make_shared<server::engine::CallMemory>(&budget_, "fuzz");
    return cc;
  }

  // A stream-ordered call: queued behind the Session's earlier ones (its status is the reply's).
  void Enqueue(server::ops::OpId id, std::shared_ptr<const google::protobuf::Message> request,
               const v1::Signal* ready, const v1::Signal* done, bool validated,
               server::ops::CallContext cc) {
    server::ops::StreamOrderedRunner::Submission sub;
    sub.id = id;
    sub.request = std::move(request);
    sub.ready = ready;
    sub.done = done;
    sub.ctx = std::move(cc);
    sub.validated = validated;
    sub.finished = [this](absl::Status s) {
      CheckRequestStatus(s, "stream-ordered call");
      Done();
    };
    Started();
    const absl::Status s = stream_.Enqueue(queue_, std::move(sub));
    CheckRequestStatus(s, "enqueue");
    if (!s.ok()) Done();
  }

  void Prepare(const v1::PrepareCallRequest& r) {
    server::ops::OpId id;
    const google::protobuf::Message* request;
    std::unique_ptr<google::protobuf::Message> response;
    if (!PreparedOpOf(r, &id, &request, &response)) return;
    if (server::ops::HasSignals(*request)) return;  // INVALID_ARGUMENT
    if (!SmallEnough(id, *request, *response)) return;
    std::shared_ptr<google::protobuf::Message> copy(request->New());
    copy->CopyFrom(*request);
    server::ops::PrepareOptions options;
    options.registry = registry_.get();
    server::ops::PreparedCallEntry entry;
    const absl::Status c =
        server::ops::CheckCall(FuzzEnv::Get().ops(), id, *copy, options,
                               server::ops::Placement::kAllInRegions, &entry.regions);
    CheckRequestStatus(c, "prepare call");
    if (!c.ok()) return;
    entry.lease = lease_;
    entry.op = id;
    entry.request = std::move(copy);
    CheckRequestStatus(prepared_.Add(std::move(entry)).status(), "prepare call");
  }

  void RunPrepared(uint64_t request_id, const v1::RunPreparedRequest& r) {
    auto entry = prepared_.Find("", r.call_id());
    CheckRequestStatus(entry.status(), "run prepared");
    if (!entry.ok()) return;
    const std::shared_ptr<const server::ops::PreparedCallEntry> keep = *entry;
    server::ops::CallContext cc = NewContext(request_id, 0);
    if (r.has_ready() || r.has_done()) {
      Enqueue(keep->op, keep->request, r.has_ready() ? &r.ready() : nullptr,
              r.has_done() ? &r.done() : nullptr, /*validated=*/true, std::move(cc));
      return;
    }
    std::shared_ptr<google::protobuf::Message> response(server::ops::NewOpResponse(keep->op));
    Started();
    runner_.Start(keep->op, *keep->request, response.get(), std::move(cc),
                  [this, keep, response](absl::Status s) {
                    CheckRequestStatus(s, "run prepared");
                    Done();
                  });
  }

  void RunOp(const v1::SessionRequest& m) {
    server::ops::OpId id;
    const google::protobuf::Message* request;
    std::unique_ptr<google::protobuf::Message> response;
    if (!OpOf(m, &id, &request, &response)) return;
    if (!SmallEnough(id, *request, *response)) return;
    server::ops::CallContext cc = NewContext(m.request_id(), m.timeout_seconds());
    if (server::ops::HasSignals(*request)) {
      std::shared_ptr<google::protobuf::Message> copy(request->New());
      copy->CopyFrom(*request);
      const v1::Signal* ready = server::ops::FindSignal(*copy, "ready");
      const v1::Signal* done = server::ops::FindSignal(*copy, "done");
      Enqueue(id, std::move(copy), ready, done, /*validated=*/false, std::move(cc));
      return;
    }
    google::protobuf::Message* out = response.get();
    responses_.push_back(std::move(response));
    Started();
    runner_.Start(id, *request, out, std::move(cc), [this](absl::Status s) {
      CheckRequestStatus(s, "call");
      Done();
    });
  }

  // Whether a call that Prepare accepts is small enough to run here (a refused one is sent on: the
  // runner refuses it the same way). `response` is a message of the op's response type.
  bool SmallEnough(server::ops::OpId id, const google::protobuf::Message& request,
                   const google::protobuf::Message& response) {
    std::unique_ptr<google::protobuf::Message> scratch(response.New());
    server::ops::PrepareOptions options;
    options.registry = registry_.get();
    options.max_inline_bytes = kMaxInlineBytes;
    auto call = FuzzEnv::Get().ops().Find(id)->Prepare(request, scratch.get(), options);
    return !call.ok() || SmallEnoughToRun(**call);
  }

  const std::unique_ptr<server::regions::RegionRegistry> registry_;
  server::engine::CallMemoryBudget budget_{{.total_bytes = 8 << 20, .per_client_bytes = 4 << 20}};
  server::ops::CallRunner runner_;
  // Declared after the runner it uses: destroyed first (it fails what is still pending).
  server::ops::StreamOrderedRunner stream_{
      &runner_,
      &FuzzEnv::Get().ops(),
      registry_.get(),
      nullptr,
      {.signal_timeout = absl::Microseconds(500), .poll = absl::Microseconds(50)}};
  std::shared_ptr<server::ops::StreamOrderedRunner::Queue> queue_ = stream_.NewQueue("fuzz");
  server::ops::PreparedCallTable prepared_{nullptr, {.max_per_owner = 64}};
  std::string lease_;
  std::map<uint64_t, std::shared_ptr<std::atomic<bool>>> cancels_;
  std::vector<std::unique_ptr<google::protobuf::Message>> responses_;
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace
}  // namespace attnd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<attnd::v1::SessionRequest> messages = attnd::fuzz::ReadRequests(data, size);
  if (messages.empty()) return 0;
  attnd::fuzz::Session session;
  for (const attnd::v1::SessionRequest& m : messages) {
    if (!session.Handle(m)) break;
  }
  session.Close();
  return 0;
}
