#include "server/ops/stream_ordered.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cpu_relax.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "server/common/log.h"

namespace attnd::server::ops {

namespace {

bool NamesHostRegionAt(const google::protobuf::Message& m, const regions::RegionRegistry* registry,
                       const std::string& owner, int depth) {
  if (m.GetDescriptor() == v1::Tensor::descriptor()) {
    const auto& t = static_cast<const v1::Tensor&>(m);
    if (!t.has_region()) return false;
    absl::StatusOr<regions::RegionPin> pin = registry->Acquire(owner, t.region().region());
    return pin.ok() && (*pin)->kind() == regions::RegionKind::kHost;
  }
  if (depth > 8) return false;  // op requests nest a level or two
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        if (NamesHostRegionAt(r->GetRepeatedMessage(m, f, i), registry, owner, depth + 1)) {
          return true;
        }
      }
    } else if (NamesHostRegionAt(r->GetMessage(m, f), registry, owner, depth + 1)) {
      return true;
    }
  }
  return false;
}

}  // namespace

bool NamesHostRegion(const google::protobuf::Message& request,
                     const regions::RegionRegistry* registry, const std::string& owner) {
  return NamesHostRegionAt(request, registry, owner, 0);
}

// ---- SignalWord ----

absl::StatusOr<SignalWord> SignalWord::Resolve(const regions::RegionRegistry* registry,
                                               absl::string_view owner, absl::string_view field,
                                               const v1::Signal& signal, bool allow_device) {
  if (!signal.has_slice() || signal.slice().region().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": names no region (a signal is a slice of a registered region)"));
  }
  if (signal.value() >= kSignalFailureBit) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": value ", signal.value(), " is >= 2^62; signal values must stay below 2^62, ",
        "the failure bit of done words (docs/SERVICE.md \"Failure bit\")"));
  }
  const std::string& name = signal.slice().region();
  const uint64_t offset = signal.slice().offset();
  absl::StatusOr<regions::RegionPin> pin = registry->Acquire(owner, name);
  if (!pin.ok()) {
    return absl::Status(pin.status().code(), absl::StrCat(field, ": ", pin.status().message()));
  }
  const regions::Region& region = *pin->get();
  if (allow_device && region.kind() == regions::RegionKind::kDevice) {
    if (offset > region.byte_size() || region.byte_size() - offset < sizeof(uint64_t)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": offset ", offset,
                                                     " + 8 bytes is past the end of region '", name,
                                                     "' (", region.byte_size(), " bytes)"));
    }
    char* d = region.device_data() + offset;
    if (reinterpret_cast<uintptr_t>(d) % alignof(uint64_t) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": offset ", offset, " in device region '", name,
                       "' is not 8-byte aligned (a signal word is a u64)"));
    }
    SignalWord w;
    w.device_ordinal_ = region.device_ordinal();
    w.pin_ = *std::move(pin);
    w.device_word_ = d;
    w.value_ = signal.value();
    w.region_ = name;
    return w;
  }
  if (region.kind() != regions::RegionKind::kHost) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": region '", name,
                     "' is a device region; on the CPU backend signal words live in host regions"));
  }
  if (region.truncated()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": region '", name, "' lost pages: its shm object was truncated while registered"));
  }
  if (offset > region.byte_size() || region.byte_size() - offset < sizeof(uint64_t)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": offset ", offset,
                                                   " + 8 bytes is past the end of region '", name,
                                                   "' (", region.byte_size(), " bytes)"));
  }
  char* p = region.data() + offset;
  if (reinterpret_cast<uintptr_t>(p) % alignof(uint64_t) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": offset ", offset, " in region '", name,
                     "' is not 8-byte aligned in the shm object (a signal word is a u64)"));
  }
  SignalWord w;
  w.pin_ = *std::move(pin);
  w.word_ = reinterpret_cast<uint64_t*>(p);
  w.value_ = signal.value();
  w.region_ = name;
  return w;
}

engine::DeviceSignal SignalWord::ForDevice() const {
  engine::DeviceSignal d;
  d.present = true;
  d.device_address = device_word_;  // null for a host word: the backend maps it
  d.host_address = device_word_ == nullptr ? word_ : nullptr;
  d.value = value_;
  return d;
}

uint64_t SignalWord::Load() const { return __atomic_load_n(word_, __ATOMIC_ACQUIRE); }

void SignalWord::Store(uint64_t v) const { __atomic_store_n(word_, v, __ATOMIC_RELEASE); }

absl::Status SignalWord::CheckRegion() const {
  if (pin_ && pin_->truncated()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "signal region '", region_, "' lost pages: its shm object was truncated while registered"));
  }
  return absl::OkStatus();
}

// ---- helpers ----

const v1::Signal* FindSignal(const google::protobuf::Message& request, absl::string_view name) {
  const google::protobuf::FieldDescriptor* f =
      request.GetDescriptor()->FindFieldByName(std::string(name));
  if (f == nullptr || f->is_repeated() ||
      f->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE ||
      f->message_type() != v1::Signal::descriptor()) {
    return nullptr;
  }
  const google::protobuf::Reflection* r = request.GetReflection();
  if (!r->HasField(request, f)) return nullptr;
  return static_cast<const v1::Signal*>(&r->GetMessage(request, f));
}

bool HasSignals(const google::protobuf::Message& request) {
  return FindSignal(request, "ready") != nullptr || FindSignal(request, "done") != nullptr;
}

std::unique_ptr<google::protobuf::Message> NewOpResponse(OpId id) {
  const google::protobuf::Descriptor* d =
      google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(
          absl::StrCat("attnd.v1.", OpRpc(id), "Response"));
  if (d == nullptr) return nullptr;
  const google::protobuf::Message* proto =
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(d);
  return proto == nullptr ? nullptr : std::unique_ptr<google::protobuf::Message>(proto->New());
}

absl::Status CheckCall(const OpTable& ops, OpId id, const google::protobuf::Message& request,
                       const PrepareOptions& options, Placement placement,
                       std::vector<std::string>* regions) {
  const OpHandler* handler = ops.Find(id);
  if (handler == nullptr) {
    return absl::UnimplementedError(absl::StrCat(OpName(id), " is not built into this attnd"));
  }
  std::unique_ptr<google::protobuf::Message> response = NewOpResponse(id);
  if (response == nullptr) {
    return absl::InternalError(absl::StrCat(OpName(id), ": no response type"));
  }
  absl::StatusOr<std::unique_ptr<PreparedCall>> call =
      handler->Prepare(request, response.get(), options);
  if (!call.ok()) return call.status();
  for (const engine::TensorUse& use : (*call)->call_tensors().uses()) {
    // By the request (an index tensor of a host region is resolved into a private snapshot).
    const v1::Tensor* t = FindTensor(request, use.name);
    if (t != nullptr && t->has_region()) continue;
    if (placement == Placement::kAllInRegions) {
      return absl::InvalidArgumentError(
          absl::StrCat(use.name,
                       ": is inline (or returned inline); every tensor of a prepared call "
                       "must lie in a region"));
    }
    if (placement == Placement::kOutputsInRegions && use.role == kernels::Role::kOutput) {
      return absl::InvalidArgumentError(
          absl::StrCat(use.name,
                       ": would be returned inline; a stream-ordered call (ready/done) writes its "
                       "outputs into regions only (the reply leaves before the op runs)"));
    }
  }
  if (regions != nullptr) {
    regions->clear();
    const google::protobuf::Descriptor* d = request.GetDescriptor();
    const google::protobuf::Reflection* r = request.GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const google::protobuf::FieldDescriptor* f = d->field(i);
      if (f->is_repeated() || f->message_type() != v1::Tensor::descriptor() ||
          !r->HasField(request, f)) {
        continue;
      }
      const auto& t = static_cast<const v1::Tensor&>(r->GetMessage(request, f));
      if (t.has_region() &&
          std::find(regions->begin(), regions->end(), t.region().region()) == regions->end()) {
        regions->push_back(t.region().region());
      }
    }
  }
  return absl::OkStatus();
}

// ---- StreamOrderedRunner ----

namespace {
constexpr absl::Duration kDevicePoll = absl::Microseconds(100);
}  // namespace

struct StreamOrderedRunner::Entry {
  OpId id = OpId::kSparseMla;
  std::shared_ptr<const google::protobuf::Message> request;
  std::unique_ptr<google::protobuf::Message> response;
  std::optional<SignalWord> ready;
  std::optional<SignalWord> done;
  CallContext ctx;
  absl::Time accepted;
  absl::Time wait_deadline = absl::InfiniteFuture();
  std::function<void(absl::Status)> finished;
  // Taken when the call is accepted and handed to CallRunner::Start: a drain waits for the call
  // and takes it until the drain's deadline.
  engine::Scheduler::Admission admission;
  bool running = false;
  // The device path (docs/SERVICE.md "Stream-ordered calls on a CUDA device"): the resolved call
  // (its region pins) and its enqueued device work; null on the host-polled path.
  std::unique_ptr<PreparedCall> device_call;
  std::unique_ptr<engine::DeviceOrderedCall> device;
  std::optional<absl::Status> watchdog;  // why the watchdog cancelled it
  bool released = false;                 // the watchdog raised its ready word
};

class StreamOrderedRunner::Queue {
 public:
  explicit Queue(std::string label) : label_(std::move(label)) {}
  const std::string& label() const { return label_; }

 private:
  friend class StreamOrderedRunner;
  const std::string label_;
  // Guarded by the runner's mu_. Device entries (Entry::device) always form a prefix: a call
  // takes the device path only when every pending call of the queue did.
  std::deque<std::unique_ptr<Entry>> entries_;
  std::unique_ptr<engine::DeviceOrderedQueue> device_queue_;  // created on first use
  bool device_checked_ = false;                               // NewOrderedQueue was asked
};

StreamOrderedRunner::StreamOrderedRunner(CallRunner* runner, const OpTable* ops,
                                         const regions::RegionRegistry* registry,
                                         metrics::Metrics* metrics, Options options)
    : runner_(runner), ops_(ops), registry_(registry), metrics_(metrics), options_(options) {
  waiter_ = std::thread([this] { WaiterLoop(); });
}

StreamOrderedRunner::~StreamOrderedRunner() {
  std::vector<std::unique_ptr<Entry>> failed;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (const std::shared_ptr<Queue>& q : std::set<std::shared_ptr<Queue>>(active_)) {
      std::vector<Entry*> waiting;
      for (auto& e : q->entries_) {
        if (!e->running && e->device == nullptr) waiting.push_back(e.get());
      }
      for (Entry* e : waiting) {
        failed.emplace_back();
        RemoveLocked(q, e, &failed.back());
      }
    }
    wake_.SignalAll();
  }
  for (auto& e : failed) {
    Complete(std::move(e), absl::UnavailableError("attnd is shutting down: call not run"), false);
  }
  waiter_.join();
  // Device entries: cancelled and released like the watchdog does, then polled to their end
  // (their memory must not be freed under the device's feet).
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  for (;;) {
    std::vector<std::pair<std::unique_ptr<Entry>, absl::Status>> finished;
    bool left = false;
    {
      absl::MutexLock lock(&mu_);
      for (const std::shared_ptr<Queue>& q : active_) {
        for (auto& e : q->entries_) {
          if (e->device != nullptr && !e->watchdog.has_value()) {
            e->watchdog = absl::UnavailableError("attnd is shutting down: call not run");
            e->device->SetCancel();
          }
        }
      }
      PollDeviceLocked(absl::Now(), true, &finished);
      left = device_pending_ > 0;
    }
    for (auto& [e, st] : finished) CompleteDevice(std::move(e), std::move(st));
    if (!left) break;
    if (absl::Now() > give_up) {
      Log(LogLevel::kError, "device-ordered calls still pending at shutdown; leaking them", {});
      absl::MutexLock lock(&mu_);
      for (const std::shared_ptr<Queue>& q : active_) {
        for (auto& e : q->entries_) {
          if (e->device != nullptr) {
            (void)e->device.release();
            (void)e->device_call.release();
          }
        }
      }
      break;
    }
    absl::SleepFor(absl::Microseconds(100));
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* running) { return *running == 0; }, &running_));
}

std::shared_ptr<StreamOrderedRunner::Queue> StreamOrderedRunner::NewQueue(std::string label) {
  return std::make_shared<Queue>(std::move(label));
}

std::shared_ptr<StreamOrderedRunner::Queue> StreamOrderedRunner::KeyedQueue(
    const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = keyed_.find(key);
  if (it != keyed_.end()) {
    if (std::shared_ptr<Queue> q = it->second.lock()) return q;
  }
  if (keyed_.size() >= 256) {  // sweep queues nobody holds any more
    for (auto i = keyed_.begin(); i != keyed_.end();) {
      i = i->second.expired() ? keyed_.erase(i) : std::next(i);
    }
  }
  auto q = std::make_shared<Queue>(key);
  keyed_[key] = q;
  return q;
}

int64_t StreamOrderedRunner::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_;
}

absl::Status StreamOrderedRunner::Enqueue(const std::shared_ptr<Queue>& queue, Submission s) {
  auto entry = std::make_unique<Entry>();
  entry->admission = runner_->scheduler()->Admit();
  if (!entry->admission) return absl::UnavailableError("attnd is shutting down");
  entry->id = s.id;
  entry->request = std::move(s.request);
  entry->ctx = std::move(s.ctx);
  entry->finished = std::move(s.finished);
  entry->accepted = absl::Now();
  if (entry->ctx.received == absl::InfinitePast()) entry->ctx.received = entry->accepted;
  const bool device_capable = options_.backend != nullptr;
  if (s.ready != nullptr) {
    absl::StatusOr<SignalWord> w =
        SignalWord::Resolve(registry_, entry->ctx.owner, "ready", *s.ready, device_capable);
    if (!w.ok()) return w.status();
    entry->ready = *std::move(w);
  }
  if (s.done != nullptr) {
    absl::StatusOr<SignalWord> w =
        SignalWord::Resolve(registry_, entry->ctx.owner, "done", *s.done, device_capable);
    if (!w.ok()) return w.status();
    entry->done = *std::move(w);
  }
  const bool device_words =
      (entry->ready && entry->ready->on_device()) || (entry->done && entry->done->on_device());
  PrepareOptions prep;
  prep.registry = registry_;
  prep.max_inline_bytes = 0;  // no inline outputs
  prep.memory = entry->ctx.memory.get();
  prep.owner = entry->ctx.owner;
  // A host-region tensor rules the device path out: no resolution here to find that out (the
  // host path resolves the call when it starts).
  const auto names_host_region = [&] {
    return s.names_host_region.has_value()
               ? *s.names_host_region
               : NamesHostRegion(*entry->request, registry_, entry->ctx.owner);
  };
  if (device_capable && !names_host_region()) {
    // Resolved and validated now: the device path keeps this call (its pins) until it is over.
    const OpHandler* handler = ops_->Find(s.id);
    entry->response = NewOpResponse(s.id);
    if (handler != nullptr && entry->response != nullptr) {
      absl::StatusOr<std::unique_ptr<PreparedCall>> call =
          handler->Prepare(*entry->request, entry->response.get(), prep);
      if (!call.ok()) return call.status();
      if (engine::DevicePathEligible((*call)->tensors())) {
        entry->device_call = *std::move(call);
        s.validated = true;
      }
    }
  }
  if (device_words && entry->device_call == nullptr) {
    return absl::InvalidArgumentError(
        "a signal word in a device region needs the device path: every tensor of the call in a "
        "device region, on the CUDA backend (docs/SERVICE.md \"Stream-ordered calls on a CUDA "
        "device\")");
  }
  if (!s.validated) {
    if (absl::Status c =
            CheckCall(*ops_, s.id, *entry->request, prep, Placement::kOutputsInRegions);
        !c.ok()) {
      return c;
    }
  }
  // The request is kept until the call runs: its bytes (inline inputs can make it large) count
  // against the caller's call memory budget until then, like any host buffer a call holds.
  if (entry->ctx.memory != nullptr) {
    if (absl::Status m = entry->ctx.memory->Reserve(
            entry->request->ByteSizeLong(), "the request, kept until its ready word is reached");
        !m.ok()) {
      return m;
    }
  }
  if (entry->response == nullptr) entry->response = NewOpResponse(s.id);
  if (entry->response == nullptr) return absl::InternalError("no response type");
  entry->wait_deadline = std::min(entry->ctx.deadline, entry->accepted + options_.signal_timeout);
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError("attnd is shutting down");
    if (queue->entries_.size() >= options_.max_pending_per_queue) {
      return absl::ResourceExhaustedError(
          absl::StrCat("too many stream-ordered calls pending on this ",
                       absl::StartsWith(queue->label(), "session") ? "Session" : "connection", " (",
                       options_.max_pending_per_queue, ")"));
    }
    bool on_device = false;
    if (entry->device_call != nullptr) {
      absl::StatusOr<bool> d = TryDevice(queue, *entry, prep);
      if (!d.ok()) return d.status();
      on_device = *d;
      if (!on_device && device_words) {
        return absl::FailedPreconditionError(
            "a signal word in a device region needs the device path, which this call cannot "
            "take now (the queue has host-path calls pending, or the op cannot be captured)");
      }
    }
    if (!on_device) entry->device_call.reset();  // the host path resolves it again when ready
    queue->entries_.push_back(std::move(entry));
    active_.insert(queue);
    ++pending_;
    if (on_device) ++device_pending_;
    queued_ = true;
    wake_.Signal();
    if (metrics_ != nullptr && on_device) metrics_->RecordStreamOrdered("device");
  }
  if (metrics_ != nullptr) metrics_->RecordStreamOrdered("enqueued");
  Pump(queue);
  return absl::OkStatus();
}

absl::StatusOr<bool> StreamOrderedRunner::TryDevice(const std::shared_ptr<Queue>& queue,
                                                    Entry& entry, const PrepareOptions& /*prep*/) {
  for (const auto& e : queue->entries_) {
    if (e->device == nullptr) return false;  // a host-path call is pending: keep the order
  }
  if (!queue->device_checked_) {
    queue->device_checked_ = true;
    queue->device_queue_ = options_.backend->NewOrderedQueue();
  }
  if (queue->device_queue_ == nullptr) return false;
  const std::vector<engine::TensorUse>& uses = entry.device_call->tensors();
  const int ordinal = uses.empty() ? -1 : uses.front().device_ordinal;
  for (const std::optional<SignalWord>* w : {&entry.ready, &entry.done}) {
    if (*w && (*w)->on_device() && ordinal >= 0 && (*w)->device_ordinal() != ordinal) {
      return absl::InvalidArgumentError(
          absl::StrCat(w == &entry.ready ? "ready" : "done", ": region '", (*w)->region(),
                       "' is on another device than the call's tensors"));
    }
  }
  const engine::DeviceSignal none;
  absl::StatusOr<std::unique_ptr<engine::DeviceOrderedCall>> d = queue->device_queue_->Enqueue(
      *entry.device_call, entry.ready ? entry.ready->ForDevice() : none,
      entry.done ? entry.done->ForDevice() : none);
  if (!d.ok()) {
    // Not capturable into a conditional body: the host path serves it.
    if (d.status().code() == absl::StatusCode::kFailedPrecondition) return false;
    return d.status();
  }
  entry.device = *std::move(d);
  return true;
}

void StreamOrderedRunner::PollDeviceLocked(
    absl::Time now, bool drain_expired,
    std::vector<std::pair<std::unique_ptr<Entry>, absl::Status>>* finished) {
  for (const std::shared_ptr<Queue>& q : std::set<std::shared_ptr<Queue>>(active_)) {
    bool in_order = true;  // every earlier device entry is finished
    bool front = true;     // every earlier device entry is gated (its wait is not the blocker)
    std::vector<Entry*> done;
    for (size_t i = 0; i < q->entries_.size() && q->entries_[i]->device != nullptr; ++i) {
      Entry* e = q->entries_[i].get();
      const engine::DeviceCallState st = e->device->Poll();
      if (st != engine::DeviceCallState::kPending) {
        if (in_order) done.push_back(e);
        continue;
      }
      in_order = false;
      const bool gated = e->device->Gated();
      if (!e->watchdog.has_value()) {
        engine::WatchdogInput in;
        in.now = now;
        in.wait_deadline = e->wait_deadline;
        in.cancelled = e->ctx.cancelled && e->ctx.cancelled();
        in.drain_expired = drain_expired;
        in.gated = gated;
        if (std::optional<absl::Status> w = engine::WatchdogDecision(in)) {
          e->watchdog = std::move(w);
          e->device->SetCancel();
        }
      }
      if (e->watchdog.has_value() && !e->released && !gated && front) {
        e->released = true;
        // Later calls waiting on the same word for a value the raise reaches are released too:
        // they are cancelled as well, never run on inputs that may not be ready. Cancelled
        // before the raise, so no gate of theirs can see the raised word without the cancel.
        if (e->ready) {
          for (size_t j = i + 1; j < q->entries_.size() && q->entries_[j]->device != nullptr; ++j) {
            Entry* l = q->entries_[j].get();
            if (l->watchdog.has_value() || !l->ready || l->ready->value() > e->ready->value() ||
                l->ready->address() != e->ready->address()) {
              continue;
            }
            l->watchdog = absl::DeadlineExceededError(
                "stream-ordered call not run: the watchdog raised its ready word to release an "
                "earlier call of its queue that timed out");
            l->device->SetCancel();
          }
        }
        if (absl::Status r = e->device->Release(); !r.ok()) {
          Log(LogLevel::kError, "watchdog could not release a device-ordered call's wait",
              {{"req", e->ctx.request_id}, {"error", r.message()}});
        }
      }
      front = front && gated;
    }
    for (Entry* e : done) {
      const engine::DeviceCallState st = e->device->Poll();
      absl::Status status = engine::CompletionStatus(st, e->watchdog, e->device->error());
      finished->emplace_back(nullptr, std::move(status));
      RemoveLocked(q, e, &finished->back().first);
      --device_pending_;
    }
  }
}

void StreamOrderedRunner::CompleteDevice(std::unique_ptr<Entry> entry, absl::Status status) {
  if (entry == nullptr) return;
  const engine::DeviceCallState st = entry->device->Poll();
  const bool ran = st == engine::DeviceCallState::kRan;
  // The done kernel stored done; after a device error it may not have: the host stores the
  // failure bit into a host word (a device word cannot be reached then).
  if (st == engine::DeviceCallState::kFailed && entry->done && !entry->done->on_device()) {
    entry->done->Store(entry->done->value() | kSignalFailureBit);
  }
  engine::StepResult result;
  entry->device->Result(&result);
  if (metrics_ != nullptr) {
    metrics_->RecordStreamOrdered(status.ok() ? "done" : "failed");
    if (st == engine::DeviceCallState::kSkipped &&
        status.code() == absl::StatusCode::kDeadlineExceeded) {
      metrics_->RecordSignalTimeout();
    }
    metrics::CallRecord rec;
    rec.op = OpName(entry->id);
    rec.code = status.code();
    rec.total_seconds = absl::ToDoubleSeconds(absl::Now() - entry->ctx.received);
    if (ran) {
      rec.ran = true;
      rec.impl = result.impl;
      rec.compute_seconds = absl::ToDoubleSeconds(result.compute);
      rec.count_readback = result.count_readback;
      const kernels::WorkCount work = entry->device_call->Count();
      rec.flops = work.flops;
      rec.logical_bytes = work.bytes;
      rec.work_count = entry->device_call->count_basis();
    }
    metrics_->RecordCall(rec);
    // The captured graph's outcome (hit, capture, update), as the blocking path records it.
    if (!result.graph.empty()) metrics_->RecordGraph(result.graph);
  }
  if (!status.ok()) {
    Log(LogLevel::kWarning,
        ran ? "stream-ordered call failed" : "stream-ordered call failed before running",
        {{"req", entry->ctx.request_id},
         {"op", OpName(entry->id)},
         {"origin", entry->ctx.origin},
         {"path", "device"},
         {"code", metrics::CodeLabel(status.code())},
         {"error", status.message()},
         {"waited_us",
          static_cast<int64_t>(absl::ToDoubleMicroseconds(absl::Now() - entry->accepted))}});
  }
  auto finished = std::move(entry->finished);
  entry.reset();  // the device call (slot, workspace, events), pins and call memory go now
  if (finished) finished(std::move(status));
}

bool StreamOrderedRunner::HeadStartableLocked(Queue& q) {
  if (q.entries_.empty()) return false;
  Entry& head = *q.entries_.front();
  if (head.running || head.device != nullptr) return false;
  if (!head.ready) return true;
  if (!head.ready->CheckRegion().ok()) return false;  // the waiter fails it
  return head.ready->Load() >= head.ready->value();
}

void StreamOrderedRunner::Pump(const std::shared_ptr<Queue>& queue) {
  // A call that fails inside Start (the drain refused it) completes on this thread and pumps
  // again: past one level the waiter starts the next call instead, so a long queue failing in a
  // row cannot grow the stack.
  thread_local int depth = 0;
  Entry* start = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (stop_ || !HeadStartableLocked(*queue)) return;
    if (depth > 0) {
      wake_.Signal();
      return;
    }
    start = queue->entries_.front().get();
    start->running = true;
    ++running_;
  }
  ++depth;
  Start(queue, start);
  --depth;
}

void StreamOrderedRunner::Start(std::shared_ptr<Queue> queue, Entry* entry) {
  // The op's inputs are complete now: CallRunner resolves the request again (fresh index
  // snapshots, docs/SERVICE.md "Trust model") and queues it on the scheduler.
  runner_->Start(
      entry->id, *entry->request, entry->response.get(), entry->ctx,
      [this, queue, entry](absl::Status status) {
        std::unique_ptr<Entry> owned;
        {
          absl::MutexLock lock(&mu_);
          RemoveLocked(queue, entry, &owned);
          --running_;
        }
        Complete(std::move(owned), std::move(status), true);
        Pump(queue);
      },
      std::move(entry->admission));
}

void StreamOrderedRunner::RemoveLocked(const std::shared_ptr<Queue>& queue, Entry* entry,
                                       std::unique_ptr<Entry>* out) {
  auto& entries = queue->entries_;
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    if (it->get() == entry) {
      *out = std::move(*it);
      entries.erase(it);
      --pending_;
      break;
    }
  }
  if (entries.empty()) active_.erase(queue);
}

void StreamOrderedRunner::Complete(std::unique_ptr<Entry> entry, absl::Status status, bool ran) {
  if (entry == nullptr) return;
  if (entry->done) {
    const uint64_t v = entry->done->value();
    entry->done->Store(status.ok() ? v : (v | kSignalFailureBit));
  }
  if (metrics_ != nullptr) {
    metrics_->RecordStreamOrdered(status.ok() ? "done" : "failed");
    if (!ran) {
      metrics::CallRecord rec;
      rec.op = OpName(entry->id);
      rec.code = status.code();
      rec.total_seconds = absl::ToDoubleSeconds(absl::Now() - entry->ctx.received);
      metrics_->RecordCall(rec);
    }
  }
  if (!ran) {
    Log(LogLevel::kWarning, "stream-ordered call failed before running",
        {{"req", entry->ctx.request_id},
         {"op", OpName(entry->id)},
         {"origin", entry->ctx.origin},
         {"code", metrics::CodeLabel(status.code())},
         {"error", status.message()},
         {"waited_us",
          static_cast<int64_t>(absl::ToDoubleMicroseconds(absl::Now() - entry->accepted))}});
  }
  auto finished = std::move(entry->finished);
  entry.reset();  // signal pins, the request and its call memory go now
  if (finished) finished(std::move(status));
}

void StreamOrderedRunner::WaiterLoop() {
  absl::Duration interval = options_.poll;
  const absl::Duration max_interval = std::max(options_.poll, absl::Microseconds(500));
  const bool spins = options_.spin > absl::ZeroDuration();
  absl::Time spin_until = absl::InfinitePast();
  absl::Time spin_started = absl::InfinitePast();  // the current stretch of spinning
  auto spin_ended = [&]() {
    if (spin_started == absl::InfinitePast()) return;
    if (metrics_ != nullptr) {
      metrics_->AddPollSpin("waiter", absl::ToDoubleSeconds(absl::Now() - spin_started));
    }
    spin_started = absl::InfinitePast();
  };
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (pending_ - running_ <= 0 && device_pending_ == 0) {
      spin_ended();
      wake_.Wait(&mu_);
      interval = options_.poll;
      continue;
    }
    const absl::Time now = absl::Now();
    if (queued_) {
      queued_ = false;
      if (spins) spin_until = now + options_.spin;
    }
    const bool expired = runner_->scheduler()->drain_expired();
    struct Failure {
      std::unique_ptr<Entry> entry;
      absl::Status status;
    };
    std::vector<Failure> failures;
    std::vector<std::pair<std::shared_ptr<Queue>, Entry*>> starts;
    for (const std::shared_ptr<Queue>& q : std::set<std::shared_ptr<Queue>>(active_)) {
      std::vector<std::pair<Entry*, absl::Status>> failing;
      for (auto& e : q->entries_) {
        if (e->running || e->device != nullptr) continue;
        if (expired) {
          failing.emplace_back(
              e.get(), absl::UnavailableError("attnd's drain reached --drain-timeout: the "
                                              "stream-ordered call was not run (its done word has "
                                              "the failure bit)"));
        } else if (e->ctx.cancelled && e->ctx.cancelled()) {
          failing.emplace_back(e.get(),
                               absl::CancelledError("stream-ordered call cancelled before it ran"));
        } else if (now >= e->wait_deadline) {
          const std::string waited = absl::FormatDuration(e->wait_deadline - e->accepted);
          const char* bound = e->wait_deadline < e->accepted + options_.signal_timeout
                                  ? "the call's deadline"
                                  : "--signal-timeout";
          failing.emplace_back(
              e.get(),
              absl::DeadlineExceededError(
                  e->ready && e.get() == q->entries_.front().get()
                      ? absl::StrCat("stream-ordered call not run: its ready word (region '",
                                     e->ready->region(), "') did not reach ", e->ready->value(),
                                     " within ", waited, " (", bound, ")")
                      : absl::StrCat("stream-ordered call not run: still queued behind "
                                     "earlier calls of its queue after ",
                                     waited, " (", bound, ")")));
        } else if (e->ready && !e->ready->CheckRegion().ok()) {
          failing.emplace_back(e.get(), e->ready->CheckRegion());
        }
      }
      for (auto& [e, s] : failing) {
        failures.push_back({nullptr, std::move(s)});
        RemoveLocked(q, e, &failures.back().entry);
      }
      if (HeadStartableLocked(*q)) {
        Entry* head = q->entries_.front().get();
        head->running = true;
        ++running_;
        starts.emplace_back(q, head);
      }
    }
    std::vector<std::pair<std::unique_ptr<Entry>, absl::Status>> device_done;
    if (device_pending_ > 0) PollDeviceLocked(now, expired, &device_done);
    const bool progress = !failures.empty() || !starts.empty() || !device_done.empty();
    if (!device_done.empty()) {
      std::set<std::shared_ptr<Queue>> pump(active_);
      mu_.Unlock();
      for (auto& [e, st] : device_done) CompleteDevice(std::move(e), std::move(st));
      device_done.clear();
      // Host-path calls that waited behind the device calls may start now.
      for (const std::shared_ptr<Queue>& q : pump) Pump(q);
      mu_.Lock();
    }
    if (!failures.empty() || !starts.empty()) {
      mu_.Unlock();
      for (Failure& f : failures) {
        const bool timeout = f.status.code() == absl::StatusCode::kDeadlineExceeded;
        if (timeout && metrics_ != nullptr) metrics_->RecordSignalTimeout();
        Complete(std::move(f.entry), std::move(f.status), false);
      }
      failures.clear();
      for (auto& [q, e] : starts) Start(q, e);
      starts.clear();
      mu_.Lock();
    }
    interval = progress ? options_.poll : std::min(interval * 2, max_interval);
    // Device calls pending: their events are queried every poll..100 µs.
    if (device_pending_ > 0) interval = std::min(interval, std::max(options_.poll, kDevicePoll));
    if (spins) {
      if (progress) spin_until = now + options_.spin;
      // Host-path calls waiting for their ready word: look again at once, the lock left free
      // for a moment in between (device-path calls are polled at their own interval).
      if (!stop_ && pending_ - running_ - device_pending_ > 0 && absl::Now() < spin_until) {
        if (spin_started == absl::InfinitePast()) spin_started = absl::Now();
        mu_.Unlock();
        for (int i = 0; i < 32; ++i) attnd::CpuRelax();
        mu_.Lock();
        continue;
      }
    }
    spin_ended();
    wake_.WaitWithTimeout(&mu_, interval);
  }
  spin_ended();
}

}  // namespace attnd::server::ops
