// Stream-ordered calls on the CPU backend (docs/SERVICE.md "Stream-ordered calls and prepared
// calls"): an op call that names a `ready` and/or a `done` signal word (a u64 in a host region of
// the caller's) is validated and queued at once; per ordered queue (one per Session, one per unary
// connection) the calls then run one after the other, each once its `ready` word is >= its value,
// and each stores `done` = value after its outputs are written (value | kSignalFailureBit when it
// failed or never ran). A waiter thread polls the ready words and is the watchdog: a call whose
// word is not reached by its wait deadline, that is cancelled, or that is still pending when the
// daemon's drain reaches its deadline is failed without running. Each accepted call holds a
// scheduler admission, so a drain waits for it (up to --drain-timeout). On the CUDA backend a
// call whose tensors all lie in device regions takes the device path instead (docs/SERVICE.md
// "Stream-ordered calls on a CUDA device"): it is enqueued on its queue's device stream when
// accepted (Options::backend's NewOrderedQueue), and the waiter polls its completion event and is
// its watchdog (cancel word, then raise the ready word). No gRPC here.
//   StreamOrderedRunner stream(&runner, &ops, &registry, &metrics, {});
//   auto queue = stream.NewQueue("session lease-1");
//   ATTND_RETURN_IF_ERROR(stream.Enqueue(queue, std::move(submission)));  // reply "enqueued"
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attnd/v1/attention.pb.h"
#include "google/protobuf/message.h"
#include "server/engine/backend.h"
#include "server/metrics/metrics.h"
#include "server/ops/call_runner.h"
#include "server/ops/op_handler.h"
#include "server/regions/registry.h"

namespace attnd::server::ops {

// Set in `done` when a stream-ordered call failed or was never run: done = value | this bit.
// Bit 62, not 63: a GPU stream waiting for done >= value compares cyclically, and
// (value | 2^62) - value is 2^62, which it counts as reached (docs/SERVICE.md "Failure bit").
// So every signal value must be below this bit: Resolve refuses one that is not.
inline constexpr uint64_t kSignalFailureBit = 1ull << 62;

// A resolved signal word: pinned for as long as the object lives.
class SignalWord {
 public:
  // Resolves `signal` (the request field `field`, for messages) in `owner`'s namespace: its
  // value below kSignalFailureBit; the region must be a host region (or, with `allow_device`, a
  // device region); the word 8 bytes, inside it, 8-byte aligned in memory; INVALID_ARGUMENT /
  // NOT_FOUND / FAILED_PRECONDITION (truncated region) otherwise.
  static absl::StatusOr<SignalWord> Resolve(const regions::RegionRegistry* registry,
                                            absl::string_view owner, absl::string_view field,
                                            const v1::Signal& signal, bool allow_device = false);
  SignalWord() = default;
  SignalWord(SignalWord&&) noexcept = default;
  SignalWord& operator=(SignalWord&&) noexcept = default;

  uint64_t value() const { return value_; }
  // The word now (an atomic acquire load: the client may change it at any time).
  uint64_t Load() const;
  // Stores `v` with release ordering (after the call's outputs are written).
  void Store(uint64_t v) const;
  // FAILED_PRECONDITION when the region's shm object was truncated (the word read zero pages).
  absl::Status CheckRegion() const;
  const std::string& region() const { return region_; }
  // A word in a device region: the host never reads or writes it (Load/Store must not be used);
  // device_word() is its address in this process's mapping of the region.
  bool on_device() const { return device_word_ != nullptr; }
  void* device_word() const { return device_word_; }
  int device_ordinal() const { return device_ordinal_; }
  // The word's address in this process (host mapping or device region mapping): equal for the
  // same word.
  const void* address() const {
    return device_word_ != nullptr ? device_word_ : static_cast<const void*>(word_);
  }
  // The word as a device-ordered call sees it (engine::DeviceSignal).
  engine::DeviceSignal ForDevice() const;

 private:
  regions::RegionPin pin_;
  uint64_t* word_ = nullptr;
  void* device_word_ = nullptr;
  int device_ordinal_ = -1;
  uint64_t value_ = 0;
  std::string region_;
};

// The request's `ready` / `done` fields (null when absent or the message has none).
const v1::Signal* FindSignal(const google::protobuf::Message& request, absl::string_view name);
bool HasSignals(const google::protobuf::Message& request);

// A fresh response message of op `id` (its RPC's response type).
std::unique_ptr<google::protobuf::Message> NewOpResponse(OpId id);

// What a call must look like to be queued or prepared.
enum class Placement {
  kAny,               // any tensor inline or in a region
  kOutputsInRegions,  // stream-ordered: no inline outputs (the reply leaves before the op runs)
  kAllInRegions,      // prepared: every tensor in a region
};

// Resolves and validates `request` (op `id`) as a dry run (nothing is kept) and checks its
// placement; INVALID_ARGUMENT names the first tensor placed wrongly. `regions` (optional) gets
// the names of the regions its tensors use.
absl::Status CheckCall(const OpTable& ops, OpId id, const google::protobuf::Message& request,
                       const PrepareOptions& options, Placement placement,
                       std::vector<std::string>* regions = nullptr);

// True when a tensor of `request` (nested messages included) lies in a host region of
// `owner`'s. Such a call cannot take the CUDA device path (engine::DevicePathEligible), so Enqueue
// does not resolve it a first time to find that out. Unknown regions count as not host (the
// resolution that follows reports them).
bool NamesHostRegion(const google::protobuf::Message& request,
                     const regions::RegionRegistry* registry, const std::string& owner);

class StreamOrderedRunner {
 public:
  struct Options {
    // The longest a call waits for its `ready` word (its own deadline may be shorter): the
    // watchdog fails it DEADLINE_EXCEEDED then (--signal-timeout).
    absl::Duration signal_timeout = absl::Seconds(60);
    // How often the waiter polls ready words, deadlines and cancellation while calls wait.
    absl::Duration poll = absl::Microseconds(50);
    // After a call is queued or one starts, the waiter polls again without sleeping for this
    // long while host-path calls wait (docs/LATENCY.md "Blocking calls through a ring"): a ready
    // word stored meanwhile starts its call at once. Zero: never.
    absl::Duration spin = absl::ZeroDuration();
    size_t max_pending_per_queue = 4096;  // RESOURCE_EXHAUSTED beyond it
    // The backend whose NewOrderedQueue() serves calls whose tensors all lie in device regions
    // wholly on the device (docs/SERVICE.md "Stream-ordered calls on a CUDA device"); null, or
    // a backend without it: every call takes the host-polled path.
    const engine::Backend* backend = nullptr;
  };

  class Queue;  // one ordered queue (a Session's, a unary connection's)

  // Everything borrowed must outlive the runner (the runner's scheduler too); `metrics` may be
  // null. Each accepted call holds an admission of the runner's scheduler: its drain waits for
  // pending calls (their ready words may still come) and fails them UNAVAILABLE once its
  // deadline has passed (Scheduler::drain_expired); new calls are refused once it has begun.
  StreamOrderedRunner(CallRunner* runner, const OpTable* ops,
                      const regions::RegionRegistry* registry, metrics::Metrics* metrics,
                      Options options);
  // Fails every pending call (UNAVAILABLE), waits for running ones, stops the waiter.
  ~StreamOrderedRunner();
  StreamOrderedRunner(const StreamOrderedRunner&) = delete;
  StreamOrderedRunner& operator=(const StreamOrderedRunner&) = delete;

  std::shared_ptr<Queue> NewQueue(std::string label);
  // The queue of unary calls keyed by `key` (owner and connection), created on first use and
  // forgotten once empty.
  std::shared_ptr<Queue> KeyedQueue(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

  struct Submission {
    OpId id = OpId::kSparseMla;
    // The op request; its ready/done fields are ignored (given below). Kept until the call ends.
    std::shared_ptr<const google::protobuf::Message> request;
    const v1::Signal* ready = nullptr;  // may be null; read during Enqueue only
    const v1::Signal* done = nullptr;   // may be null
    CallContext ctx;                    // request_id must be set (CallRunner::NewRequestId)
    // Skip the dry run (a prepared call, validated when it was prepared).
    bool validated = false;
    // Whether a tensor lies in a host region, when known (a prepared call's); unset: Enqueue looks
    // (NamesHostRegion) on a backend with the device path.
    std::optional<bool> names_host_region;
    // Called exactly once when the call is over (done stored): OK, or why it failed. On any
    // thread (the waiter, a scheduler worker). Not called when Enqueue fails.
    std::function<void(absl::Status)> finished;
  };
  // Validates `s` (CheckCall with outputs in regions, unless validated), resolves its signals
  // and queues it behind the queue's earlier calls. On an error nothing is queued.
  absl::Status Enqueue(const std::shared_ptr<Queue>& queue, Submission s) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t pending() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry;
  void WaiterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // The device path: tries to enqueue `entry` on the queue's device stream. false (entry
  // untouched) when the call is not eligible; an error refuses the call.
  absl::StatusOr<bool> TryDevice(const std::shared_ptr<Queue>& queue, Entry& entry,
                                 const PrepareOptions& prep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls the device entries of every queue (completing finished ones in order) and applies
  // the watchdog to those still waiting. Returns the finished entries with their status.
  void PollDeviceLocked(absl::Time now, bool drain_expired,
                        std::vector<std::pair<std::unique_ptr<Entry>, absl::Status>>* finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteDevice(std::unique_ptr<Entry> entry, absl::Status status);
  // Starts the queue's head when it is not running and its ready word is reached.
  void Pump(const std::shared_ptr<Queue>& queue) ABSL_LOCKS_EXCLUDED(mu_);
  bool HeadStartableLocked(Queue& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Start(std::shared_ptr<Queue> queue, Entry* entry) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends `entry` (stores done, metrics, finished) after taking it off its queue.
  void Complete(std::unique_ptr<Entry> entry, absl::Status status, bool ran);
  void RemoveLocked(const std::shared_ptr<Queue>& queue, Entry* entry, std::unique_ptr<Entry>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CallRunner* const runner_;
  const OpTable* const ops_;
  const regions::RegionRegistry* const registry_;
  metrics::Metrics* const metrics_;
  const Options options_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  std::set<std::shared_ptr<Queue>> active_ ABSL_GUARDED_BY(mu_);  // queues with entries
  std::map<std::string, std::weak_ptr<Queue>> keyed_ ABSL_GUARDED_BY(mu_);
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t device_pending_ ABSL_GUARDED_BY(mu_) = 0;  // entries on a device stream
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool queued_ ABSL_GUARDED_BY(mu_) = false;  // a call was queued since the waiter last looked
  std::thread waiter_;
};

}  // namespace attnd::server::ops
