#include "server/ops/stream_ordered.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "server/common/log.h"

namespace attnd::server::ops {

// ---- SignalWord ----

absl::StatusOr<SignalWord> SignalWord::Resolve(const regions::RegionRegistry* registry,
                                               absl::string_view owner, absl::string_view field,
                                               const v1::Signal& signal) {
  if (!signal.has_slice() || signal.slice().region().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": names no region (a signal is a slice of a registered region)"));
  }
  const std::string& name = signal.slice().region();
  const uint64_t offset = signal.slice().offset();
  absl::StatusOr<regions::RegionPin> pin = registry->Acquire(owner, name);
  if (!pin.ok()) {
    return absl::Status(pin.status().code(), absl::StrCat(field, ": ", pin.status().message()));
  }
  const regions::Region& region = *pin->get();
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
};

class StreamOrderedRunner::Queue {
 public:
  explicit Queue(std::string label) : label_(std::move(label)) {}
  const std::string& label() const { return label_; }

 private:
  friend class StreamOrderedRunner;
  const std::string label_;
  // Guarded by the runner's mu_.
  std::deque<std::unique_ptr<Entry>> entries_;
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
        if (!e->running) waiting.push_back(e.get());
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
  if (s.ready != nullptr) {
    absl::StatusOr<SignalWord> w =
        SignalWord::Resolve(registry_, entry->ctx.owner, "ready", *s.ready);
    if (!w.ok()) return w.status();
    entry->ready = *std::move(w);
  }
  if (s.done != nullptr) {
    absl::StatusOr<SignalWord> w =
        SignalWord::Resolve(registry_, entry->ctx.owner, "done", *s.done);
    if (!w.ok()) return w.status();
    entry->done = *std::move(w);
  }
  if (!s.validated) {
    PrepareOptions prep;
    prep.registry = registry_;
    prep.max_inline_bytes = 0;  // no inline outputs
    prep.memory = entry->ctx.memory.get();
    prep.owner = entry->ctx.owner;
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
  entry->response = NewOpResponse(s.id);
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
    queue->entries_.push_back(std::move(entry));
    active_.insert(queue);
    ++pending_;
    wake_.Signal();
  }
  if (metrics_ != nullptr) metrics_->RecordStreamOrdered("enqueued");
  Pump(queue);
  return absl::OkStatus();
}

bool StreamOrderedRunner::HeadStartableLocked(Queue& q) {
  if (q.entries_.empty()) return false;
  Entry& head = *q.entries_.front();
  if (head.running) return false;
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
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (pending_ - running_ <= 0) {
      wake_.Wait(&mu_);
      interval = options_.poll;
      continue;
    }
    const absl::Time now = absl::Now();
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
        if (e->running) continue;
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
    const bool progress = !failures.empty() || !starts.empty();
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
    wake_.WaitWithTimeout(&mu_, interval);
  }
}

}  // namespace attnd::server::ops
