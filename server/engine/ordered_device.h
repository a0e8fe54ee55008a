// Device-ordered stream-ordered calls (docs/SERVICE.md "Stream-ordered calls on a CUDA device"):
// the engine's view of a call whose wait for `ready`, run and store of `done` are all enqueued on
// a device stream of its ordered queue, with no host synchronisation between accept and
// completion. A backend that can do this (CUDA) hands out a DeviceOrderedQueue per ordered queue;
// the stream-ordered runner polls each enqueued call (Poll) and is its watchdog (Cancel). The
// decisions that need no GPU (what the watchdog does, what a finished call answers, the per-call
// word slots) are plain functions here so that they are tested without a device.
//   std::unique_ptr<DeviceOrderedQueue> q = backend->NewOrderedQueue();   // null: host path
//   ATTND_ASSIGN_OR_RETURN(auto pending, q->Enqueue(call, ready, done));
//   while (pending->Poll() == DeviceCallState::kPending) { ... watchdog ... }
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/engine/op_call.h"

namespace attnd::server::engine {

struct StepResult;

// A signal word as the device reaches it.
struct DeviceSignal {
  bool present = false;
  // The address the device reads or writes: a device region's pointer in this process, or the
  // device pointer of a host region's pinned, mapped pages.
  void* device_address = nullptr;
  // Host regions: the word in this process's mapping (the watchdog raises it with a CAS loop);
  // null for a device-region word (the host never touches it).
  uint64_t* host_address = nullptr;
  uint64_t value = 0;
};

// Where an enqueued call stands. kPending until its completion event has passed; then what the
// gate wrote: kRan (the op ran, done = value) or kSkipped (the op never ran, done has the failure
// bit). kFailed: the device reported an error (done may not have been stored).
enum class DeviceCallState { kPending, kRan, kSkipped, kFailed };

class DeviceOrderedCall {
 public:
  virtual ~DeviceOrderedCall() = default;
  // Non-blocking (an event query and a load of the state word).
  virtual DeviceCallState Poll() = 0;
  // Whether the gate has decided (the call's state word is no longer "not gated").
  virtual bool Gated() const = 0;
  // The watchdog, step 1: sets cancel in the call's control word. The gate, when the stream
  // reaches it, then skips the op (done gets the failure bit). The gate decides: a call whose
  // ready came at the same moment may still run.
  virtual void SetCancel() = 0;
  // The watchdog, step 2 (after SetCancel, once no earlier call of the queue is still waiting):
  // releases the stream's wait by raising the caller's ready word to the call's value when it
  // is lower (host word: a CAS loop; device word: atomicMax on a daemon stream).
  virtual absl::Status Release() = 0;
  // After Poll() left kPending: the error of kFailed, and the call's figures (device, impl,
  // graph outcome, compute time, count readback copied into the call's readback buffers).
  virtual absl::Status error() const = 0;
  virtual void Result(StepResult* result) const = 0;
};

class DeviceOrderedQueue {
 public:
  // Destroying the queue while calls are pending is fine: each pending call keeps the queue's
  // stream until its own completion.
  virtual ~DeviceOrderedQueue() = default;
  // Enqueues `call` (DevicePathEligible) on the queue's own stream: its inline inputs' copies
  // (staged through pinned memory now), wait(ready >= value), gate, the op as the body of a
  // conditional node, done, the work count's readbacks, an event. Never
  // synchronises the host. `call` must outlive the returned object. INVALID_ARGUMENT /
  // UNIMPLEMENTED / RESOURCE_EXHAUSTED (workspace) as a blocking call; nothing is enqueued then.
  virtual absl::StatusOr<std::unique_ptr<DeviceOrderedCall>> Enqueue(OpCall& call,
                                                                     const DeviceSignal& ready,
                                                                     const DeviceSignal& done) = 0;
};

// Whether a call's tensors allow the device path: every tensor in a device region or an inline
// input (staged at accept), at least one in a device region (it names the device). Host-region
// tensors take the host-polled path: their index data must be snapshotted once ready.
bool DevicePathEligible(const std::vector<TensorUse>& tensors);

// ---- decisions without a device (tested in tests/server/ordered_device_test.cc) ----

// What the watchdog does with a pending device call now.
struct WatchdogInput {
  absl::Time now;
  absl::Time wait_deadline;  // the call's deadline capped by --signal-timeout
  bool cancelled = false;    // its Session ended / cancel / the client went away
  bool drain_expired = false;
  bool gated = false;  // the state word is no longer "not gated"
  bool already_cancelled = false;
};
// The status the call will fail with when the watchdog cancels it now; nullopt: leave it.
// A call already gated is never cancelled (its op runs or ran).
std::optional<absl::Status> WatchdogDecision(const WatchdogInput& in);

// A finished call's answer: kRan → OK; kSkipped → the watchdog's status (INTERNAL when the gate
// skipped a call the watchdog never cancelled); kFailed → `error`.
absl::Status CompletionStatus(DeviceCallState state, const std::optional<absl::Status>& watchdog,
                              const absl::Status& error);

// A fixed table of per-call word slots (indices 0..capacity-1), handed out and given back.
// Thread-safe.
class SlotTable {
 public:
  explicit SlotTable(size_t capacity);
  // A free index, or RESOURCE_EXHAUSTED when all are in use.
  absl::StatusOr<size_t> Take() ABSL_LOCKS_EXCLUDED(mu_);
  void Give(size_t index) ABSL_LOCKS_EXCLUDED(mu_);
  size_t in_use() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::vector<size_t> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnd::server::engine
