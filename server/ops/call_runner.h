// Runs one operator call end to end, whatever the transport: resolve and validate the request's
// tensors, queue the call on the scheduler, then fill the response (inline outputs, CallStats),
// record metrics and log. Used by the unary RPCs and by the Session stream. No gRPC here.
//   runner.Start(OpId::kSparseMla, request, &response, CallContext{...},
//                [](absl::Status s) { /* Finish the RPC */ });
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "server/engine/call_memory.h"
#include "server/engine/scheduler.h"
#include "server/metrics/metrics.h"
#include "server/ops/op_handler.h"
#include "server/regions/registry.h"

namespace attnd::server::ops {

struct CallContext {
  uint64_t request_id = 0;                     // 0: the runner assigns one
  absl::Time received = absl::InfinitePast();  // InfinitePast: now
  // Enforced while queued and while running (docs/SERVICE.md "Deadlines, cancellation and
  // drain"): the call answers DEADLINE_EXCEEDED.
  absl::Time deadline = absl::InfiniteFuture();
  // Polled while the call is queued or running (the client cancelled or went away): the call
  // stops and answers CANCELLED. Thread-safe, quick, may be empty.
  std::function<bool()> cancelled;
  std::string origin;  // for logs: "unary", "session lease-..."
  // The caller's identity (grpc_front::Caller::owner): the call resolves region names in this
  // owner's namespace only.
  std::string owner;
  // The call's share of the host memory budget (a reservation for its client), null: no budget.
  // The runner holds it while the call runs; the transport keeps a reference until the reply that
  // carries the call's inline outputs has been sent.
  std::shared_ptr<engine::CallMemory> memory;
};

class CallRunner {
 public:
  struct Options {
    uint64_t max_inline_bytes = 1ull << 30;  // cap of one inline output
  };
  // Everything is borrowed and must outlive the runner; `metrics` may be null.
  CallRunner(const OpTable* ops, engine::Scheduler* scheduler,
             const regions::RegionRegistry* registry, metrics::Metrics* metrics, Options options);

  // Starts op `id` with `request` (that op's request message) writing into `response` (its
  // response message); both must stay valid until `done` runs. `done` is called exactly once
  // with the call's status, after the response's outputs and stats are filled and the call's
  // region pins are released: on this thread when the call fails before queueing, else on a
  // scheduler worker. Thread-safe; never blocks. `admission` (optional) was taken earlier by the
  // caller (a stream-ordered call, when it was accepted): a drain that began since then still
  // takes the call, until the drain's deadline.
  void Start(OpId id, const google::protobuf::Message& request, google::protobuf::Message* response,
             CallContext ctx, std::function<void(absl::Status)> done,
             engine::Scheduler::Admission admission = {});

  uint64_t NewRequestId() { return next_id_.fetch_add(1, std::memory_order_relaxed); }
  engine::Scheduler* scheduler() const { return scheduler_; }
  metrics::Metrics* metrics() const { return metrics_; }  // may be null

 private:
  struct State;
  void Finish(std::shared_ptr<State> state, absl::Status status, const engine::JobOutcome* outcome);

  const OpTable* const ops_;
  engine::Scheduler* const scheduler_;
  const regions::RegionRegistry* const registry_;
  metrics::Metrics* const metrics_;
  const Options options_;
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace attnd::server::ops
