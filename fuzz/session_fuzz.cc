// Fuzz target: a Session stream without the transport. An input is a run of Session messages
// (env.h ReadRequests) handled as SessionReactor handles them: the first must be `open` (it opens
// the lease, else the stream ends), regions are registered and unregistered under the lease, op
// calls go through the CallRunner onto a scheduler worker and the CPU backend (pipelined: replies
// may come out of order), `cancel` cancels a call by request id, and when the input ends every
// call is awaited and the lease closed. Then nothing may be left registered or mapped, no call
// memory reserved, and every call and unregistration must have completed exactly once. Calls too
// large to run here (env.h kMaxRunFlops) are skipped. Findings: sanitizer reports, statuses no
// request may produce, broken invariants.
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
    if (!lease_.empty()) registry_->CloseLease(lease_);
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

  void RunOp(const v1::SessionRequest& m) {
    server::ops::OpId id;
    const google::protobuf::Message* request;
    std::unique_ptr<google::protobuf::Message> response;
    if (!OpOf(m, &id, &request, &response)) return;
    if (!SmallEnough(id, *request, *response)) return;
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    cancels_[m.request_id()] = cancelled;
    server::ops::CallContext cc;
    if (m.timeout_seconds() > 0) cc.deadline = absl::Now() + absl::Seconds(m.timeout_seconds());
    cc.cancelled = [cancelled] { return cancelled->load(); };
    cc.origin = "fuzz session";
    cc.memory = std::make_shared<server::engine::CallMemory>(&budget_, "fuzz");
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
