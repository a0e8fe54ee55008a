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
// prepared calls"). `open_ring` / `close_ring` open and close submission rings in a
// SubmissionRingTable whose poller runs every 5 µs, and the input writes the rings' words itself
// as a client would (or would not): each Session message may carry ring writes in fields the
// proto does not use (kRing* below), applied after the message's call. At the end every ring is
// closed, nothing pinned, and every done word a ring call named holds its value or the value with
// the failure bit (docs/FUZZING.md "Ring writes"). Findings: sanitizer reports, statuses no request
// may produce, broken invariants.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "fuzz/env.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/unknown_field_set.h"
#include "prometheus/registry.h"
#include "server/engine/cpu_backend.h"
#include "server/engine/scheduler.h"
#include "server/metrics/metrics.h"
#include "server/ops/call_runner.h"
#include "server/ops/prepared_calls.h"
#include "server/ops/stream_ordered.h"
#include "server/ops/submission_rings.h"

namespace attnd::fuzz {
namespace {

using server::regions::RegionKind;
namespace L = server::ops::ring_layout;

// Ring writes: fields of a SessionRequest the proto does not define (parsed as unknown fields),
// applied in order after the message's call, to the ring the last `open_ring` named (its region,
// offset and entries; whether or not it opened). Words outside that region, or not 8-byte aligned
// in memory, are not written.
constexpr int kRingAt = 1000;      // varint: the cursor, a byte offset from the ring's start
constexpr int kRingWord = 1001;    // varint: a u64 stored at the cursor, which moves on 8 bytes
constexpr int kRingSlot = 1002;    // packed varints n, call_id, ready_offset, ready_value,
                                   // done_offset, done_value, flags[, seq]: entry n's slot, seq
                                   // (default n + 1) last
constexpr int kRingHead = 1003;    // varint: head (the client's count follows it)
constexpr int kRingSubmit = 1004;  // packed varints call_id, ready_offset, ready_value,
                                   // done_offset, done_value, flags: a careful client's entry
                                   // (waits while the ring is full, then slot, seq, head + 1)
constexpr int kRingWait = 1005;    // varint: wait up to this many µs (at most 2,000) for the
                                   // daemon's tail to reach head
// All waits of one input together.
constexpr absl::Duration kMaxRingWait = absl::Milliseconds(20);
constexpr uint64_t kFailureBit = server::ops::kSignalFailureBit;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: invariant broken: %s\n", what);
  std::abort();
}

// The engine shared by every input: one worker on the CPU backend, as a small daemon has.
struct Engine {
  server::engine::CpuBackend backend{nullptr};
  server::engine::Scheduler scheduler{{.queue_capacity = 8, .workers = 1}, &backend};
  // The ring tables count their refused entries here (attnd_ring_entries_total).
  prometheus::Registry prometheus;
  server::metrics::Metrics metrics{&prometheus, "fuzz", "cpu", {}};

  // Ring entries refused so far ("invalid" or "rejected": each wrote the failure bit, or nothing,
  // to a done word the fuzzer chose).
  double RingRefusals() {
    double n = 0;
    for (const prometheus::MetricFamily& f : prometheus.Collect()) {
      if (f.name != "attnd_ring_entries_total") continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        for (const prometheus::ClientMetric::Label& l : m.label) {
          if (l.name == "result" && (l.value == "invalid" || l.value == "rejected")) {
            n += m.counter.value;
          }
        }
      }
    }
    return n;
  }
};

// A word of one of the environment's shm objects (FuzzEnv::shm_data): object index and byte.
using ObjectWord = std::pair<int, uint64_t>;

// A host registration of this input, in object terms (object -1: not one of the environment's).
struct Registration {
  std::string name;
  int object = -1;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// One call a ring entry queued: where its done word is and what the call ended with.
struct RingCall {
  int object = -1;  // -1: the word is not in one of the environment's objects
  uint64_t word = 0;
  uint64_t value = 0;
  std::atomic<int> finished{0};
  std::atomic<bool> ok{false};
  std::atomic<bool> refused{false};  // Enqueue failed: `finished` must never come
};

class Session {
 public:
  Session()
      : registry_((FuzzEnv::Get().ResetShm(), FuzzEnv::Get().NewRegistry())),
        runner_(&FuzzEnv::Get().ops(), &engine().scheduler, registry_.get(), nullptr,
                {.max_inline_bytes = kMaxInlineBytes}) {}

  // Handles one message; false ends the stream (a protocol error).
  bool Handle(const v1::SessionRequest& m) {
    if (lease_.empty()) {
      if (m.call_case() != v1::SessionRequest::kOpen) return false;
      lease_ = registry_->OpenLease();
      return true;
    }
    TaintRegionsOf(m);
    HandleCall(m);
    WriteRing(m);
    return true;
  }

  void HandleCall(const v1::SessionRequest& m) {
    const FuzzEnv& env = FuzzEnv::Get();
    switch (m.call_case()) {
      case v1::SessionRequest::kOpen: return;  // FAILED_PRECONDITION, the stream goes on
      case v1::SessionRequest::kCancel: {
        auto it = cancels_.find(m.cancel().target_request_id());
        if (it != cancels_.end()) it->second->store(true);
        return;
      }
      case v1::SessionRequest::kRegisterHostRegion: {
        const v1::RegisterHostRegionRequest& r = m.register_host_region();
        const std::string key = env.MapKey(r.key());
        // Held so that a ring entry's done word is looked up under the name the runner resolves.
        absl::MutexLock lock(&names_mu_);
        const absl::Status s = registry_->RegisterHost(HostSpecOf(r, key, lease_));
        CheckRequestStatus(s, "register host");
        if (s.ok()) {
          Registration reg;
          reg.name = r.name();
          ObjectOf(r.name(), 0, &reg.object, &reg.offset, &reg.bytes);
          registrations_.push_back(std::move(reg));
        }
        return;
      }
      case v1::SessionRequest::kRegisterDeviceRegion: {
        const v1::RegisterDeviceRegionRequest& r = m.register_device_region();
        CheckRequestStatus(registry_->RegisterDevice(DeviceSpecOf(r, lease_)), "register device");
        return;
      }
      case v1::SessionRequest::kUnregisterRegion: {
        // As the service does: the prepared calls and rings that use a region go with it.
        const std::vector<std::string> going = RegionsNamed(m.unregister_region().name());
        Started();
        const absl::Status s = registry_->UnregisterAsync(m.unregister_region().name(), lease_,
                                                          [this](std::vector<std::string> removed) {
                                                            RegionsReleased(removed);
                                                            Done();
                                                          });
        CheckRequestStatus(s, "unregister");
        if (s.ok()) RegionsRemoved(going);
        if (!s.ok()) Done();
        return;
      }
      case v1::SessionRequest::kPrepareCall: Prepare(m.prepare_call()); return;
      case v1::SessionRequest::kRunPrepared: RunPrepared(m.request_id(), m.run_prepared()); return;
      case v1::SessionRequest::kReleaseCall:
        CheckRequestStatus(prepared_.Release("", m.release_call().call_id()), "release call");
        return;
      case v1::SessionRequest::kOpenRing: OpenRing(m.open_ring()); return;
      case v1::SessionRequest::kCloseRing:
        CheckRequestStatus(rings_.Close("", m.close_ring().ring_id()), "close ring");
        return;
      case v1::SessionRequest::CALL_NOT_SET: return;  // INVALID_ARGUMENT
      default: RunOp(m); return;
    }
  }

  // The stream's end: waits for every call, closes the lease, checks that nothing is left.
  void Close() {
    AwaitCalls();
    // The lease ends as the service ends it: its prepared calls and rings go, then its regions.
    // Calls the rings queued before they closed still run.
    if (!lease_.empty()) rings_.DropLease(lease_);
    Check(rings_.open() == 0, "every ring closed with the lease");
    AwaitCalls();
    // The worker may still be returning from a call's last callback, and drops the call (its
    // memory reservation) after it: wait until it is idle.
    const absl::Time limit = absl::Now() + absl::Seconds(10);
    while ((engine().scheduler.running() > 0 || engine().scheduler.queued() > 0 ||
            budget_.used() > 0) &&
           absl::Now() < limit) {
      absl::SleepFor(absl::Microseconds(20));
    }
    Check(stream_.pending() == 0, "every stream-ordered call ended");
    CheckDoneWords();
    if (!lease_.empty()) {
      prepared_.DropLease(lease_);
      RegionsRemoved(RegionsNamed(""));
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

  void AwaitCalls() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* pending) { return *pending == 0; }, &pending_));
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

  // The names an unregistration of `name` removes (all of the lease's for an empty one), and what
  // goes with them, as the service has it (AttentionService::RegionsNamed, RegionsRemoved).
  std::vector<std::string> RegionsNamed(const std::string& name) const {
    if (!name.empty()) return {name};
    std::vector<std::string> names;
    for (const server::regions::RegionDescription& d : registry_->List()) {
      if (d.lease == lease_) names.push_back(d.name);
    }
    return names;
  }
  void RegionsRemoved(const std::vector<std::string>& names) {
    prepared_.DropRegions("", names);
    rings_.DropRegions("", names);
  }
  // The unregistration completed: as the service does, only names not registered again since.
  void RegionsReleased(const std::vector<std::string>& removed) {
    std::vector<std::string> gone;
    const std::vector<server::regions::RegionDescription> live = registry_->List();
    for (const std::string& name : removed) {
      if (std::none_of(live.begin(), live.end(),
                       [&](const server::regions::RegionDescription& d) { return d.name == name; }))
        gone.push_back(name);
    }
    RegionsRemoved(gone);
  }

  // Where byte `offset` of host region `name` is in the environment's shm objects (*object -1
  // when it is in none of them); `bytes` (optional) gets the region's size. False for no such
  // host region.
  bool ObjectOf(const std::string& name, uint64_t offset, int* object, uint64_t* at,
                uint64_t* bytes = nullptr) const {
    absl::StatusOr<server::regions::RegionPin> pin = registry_->Acquire(name);
    if (!pin.ok() || (*pin)->kind() != RegionKind::kHost) return false;
    const server::regions::RegionDescription& d = (*pin)->description();
    *object = FuzzEnv::Get().ShmIndex(d.key);
    *at = d.offset + offset;
    if (bytes != nullptr) *bytes = d.byte_size;
    return true;
  }

  // Every region name a message's tensors and signals use: the calls may write anywhere in
  // those regions (outputs, done words), so CheckDoneWords leaves their memory alone.
  void TaintRegionsOf(const google::protobuf::Message& m) {
    if (m.GetDescriptor() == v1::RegionSlice::descriptor()) {
      tainted_names_.insert(static_cast<const v1::RegionSlice&>(m).region());
      return;
    }
    const google::protobuf::Reflection* r = m.GetReflection();
    std::vector<const google::protobuf::FieldDescriptor*> fields;
    r->ListFields(m, &fields);
    for (const google::protobuf::FieldDescriptor* f : fields) {
      if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
      if (!f->is_repeated()) {
        TaintRegionsOf(r->GetMessage(m, f));
        continue;
      }
      for (int i = 0; i < r->FieldSize(m, f); ++i) TaintRegionsOf(r->GetRepeatedMessage(m, f, i));
    }
  }

  // OpenRing in a Session (AttentionService::OpenRingFor): the ring belongs to the Session's
  // lease, its entries run the owner's prepared calls on the Session's ordered queue.
  void OpenRing(const v1::OpenRingRequest& r) {
    // The input's ring writes go here from now on, whether or not the ring opens.
    ring_region_ = r.region();
    ring_offset_ = r.offset();
    ring_entries_ = r.entries();
    ring_head_ = 0;
    cursor_ = 0;
    server::ops::SubmissionRingTable::Spec spec;
    spec.lease = lease_;
    spec.region = r.region();
    spec.offset = r.offset();
    spec.entries = r.entries();
    spec.signal_region = r.signal_region();
    spec.label = "fuzz session";
    spec.submit = [this](uint64_t call_id, const v1::Signal* ready, const v1::Signal& done) {
      return SubmitRingEntry(call_id, ready, done);
    };
    if (!ring_opened_) refusals_before_ = engine().RingRefusals();  // before any ring can refuse
    const absl::StatusOr<uint64_t> id = rings_.Open(std::move(spec));
    CheckRequestStatus(id.status(), "open ring");
    if (!id.ok()) return;
    ring_opened_ = true;
    // The daemon writes the header (and a bad entry may name a slot word as its done word).
    Registration ring;
    if (ObjectOf(r.region(), r.offset(), &ring.object, &ring.offset)) {
      ring.bytes = L::Bytes(r.entries());
      ring_ranges_.push_back(std::move(ring));
    }
  }

  // The ring's Submitter (on the poller thread): RunPrepared with the entry's signals, as the
  // service queues it, and a record of where its done word is and how the call ended.
  absl::Status SubmitRingEntry(uint64_t call_id, const v1::Signal* ready, const v1::Signal& done) {
    absl::StatusOr<std::shared_ptr<const server::ops::PreparedCallEntry>> entry =
        prepared_.Find("", call_id);
    if (!entry.ok()) return entry.status();
    auto call = std::make_shared<RingCall>();
    call->value = done.value();
    server::ops::StreamOrderedRunner::Submission sub;
    sub.id = (*entry)->op;
    sub.request = (*entry)->request;
    sub.ready = ready;
    sub.done = &done;
    sub.ctx.request_id = runner_.NewRequestId();
    sub.ctx.origin = "fuzz session ring call";
    sub.ctx.memory = std::make_shared<server::engine::CallMemory>(&budget_, "fuzz");
    sub.validated = true;
    sub.finished = [this, call](absl::Status s) {
      CheckRequestStatus(s, "ring call");
      Check(!call->refused.load(), "a ring call that Enqueue refused finished");
      call->ok.store(s.ok());
      Check(call->finished.fetch_add(1) == 0, "a ring call finished twice");
      Done();
    };
    Started();
    absl::Status s;
    {
      // No region registered between the lookup and Enqueue's: both see the same done word.
      absl::MutexLock lock(&names_mu_);
      ObjectOf(done.slice().region(), done.slice().offset(), &call->object, &call->word);
      s = stream_.Enqueue(queue_, std::move(sub));
    }
    CheckRequestStatus(s, "ring entry");
    if (!s.ok()) {
      call->refused.store(true);
      Done();
      return s;
    }
    absl::MutexLock lock(&ring_mu_);
    ring_calls_.push_back(std::move(call));
    return s;
  }

  // ---- the client's side of the ring (kRing* fields) ----

  // The u64 at byte `at` of the current ring, null when outside its region or misaligned.
  uint64_t* RingWord(uint64_t at) {
    if (!ring_pin_) return nullptr;
    const uint64_t size = ring_pin_->byte_size();
    uint64_t offset;
    if (__builtin_add_overflow(ring_offset_, at, &offset) || offset > size || size - offset < 8) {
      return nullptr;
    }
    char* p = ring_pin_->data() + offset;
    if (reinterpret_cast<uintptr_t>(p) % alignof(uint64_t) != 0) return nullptr;
    return reinterpret_cast<uint64_t*>(p);
  }
  void Store(uint64_t at, uint64_t v) {
    uint64_t* p = RingWord(at);
    if (p == nullptr) return;
    const server::regions::RegionDescription& d = ring_pin_->description();
    harness_words_.insert({FuzzEnv::Get().ShmIndex(d.key), d.offset + ring_offset_ + at});
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
  }
  uint64_t Load(uint64_t at) {
    const uint64_t* p = RingWord(at);
    return p != nullptr ? __atomic_load_n(p, __ATOMIC_ACQUIRE) : 0;
  }
  // Entry n's slot: its fields (call_id, ready offset and value, done offset and value, flags),
  // then seq.
  void PutSlot(uint64_t n, const uint64_t* fields, uint64_t seq) {
    const uint64_t entries = std::clamp<uint64_t>(ring_entries_, 1, L::kMaxEntries);
    const uint64_t slot = L::kHeaderBytes + (n % entries) * L::kEntryBytes;
    const uint64_t at[] = {L::kCallId,     L::kReadyOffset, L::kReadyValue,
                           L::kDoneOffset, L::kDoneValue,   L::kFlags};
    for (int i = 0; i < 6; ++i) Store(slot + at[i], fields[i]);
    Store(slot + L::kSeq, seq);
  }
  // Waits (within the input's wait budget) while `busy` holds and the ring is open.
  template <typename F>
  void WaitWhile(absl::Duration most, F busy) {
    const absl::Time end = absl::Now() + std::min(most, wait_left_);
    const absl::Time start = absl::Now();
    while (busy() && Load(L::kState) == L::kOpen && absl::Now() < end) {
      absl::SleepFor(absl::Microseconds(5));
    }
    wait_left_ -= absl::Now() - start;
  }
  static std::vector<uint64_t> Varints(const std::string& bytes) {
    std::vector<uint64_t> out;
    google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                              static_cast<int>(bytes.size()));
    uint64_t v;
    while (out.size() < 8 && in.ReadVarint64(&v)) out.push_back(v);
    return out;
  }

  void WriteRing(const v1::SessionRequest& m) {
    const google::protobuf::UnknownFieldSet& fields = m.GetReflection()->GetUnknownFields(m);
    if (fields.empty() || ring_region_.empty()) return;
    absl::StatusOr<server::regions::RegionPin> pin = registry_->Acquire(ring_region_);
    if (!pin.ok() || (*pin)->kind() != RegionKind::kHost) return;
    ring_pin_ = *std::move(pin);  // held while this message writes, so the memory stays
    for (int i = 0; i < fields.field_count(); ++i) {
      const google::protobuf::UnknownField& f = fields.field(i);
      if (f.type() == google::protobuf::UnknownField::TYPE_VARINT) {
        const uint64_t v = f.varint();
        switch (f.number()) {
          case kRingAt: cursor_ = v; break;
          case kRingWord:
            Store(cursor_, v);
            cursor_ += 8;
            break;
          case kRingHead:
            ring_head_ = v;
            Store(L::kHead, v);
            break;
          case kRingWait:
            WaitWhile(absl::Microseconds(std::min<uint64_t>(v, 2000)),
                      [this] { return Load(L::kTail) != Load(L::kHead); });
            break;
          default: break;
        }
      } else if (f.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
        std::vector<uint64_t> v = Varints(f.length_delimited());
        const size_t given = v.size();
        v.resize(8, 0);
        if (f.number() == kRingSlot) {
          PutSlot(v[0], &v[1], given == 8 ? v[7] : v[0] + 1);
        } else if (f.number() == kRingSubmit) {
          const uint64_t entries = std::clamp<uint64_t>(ring_entries_, 1, L::kMaxEntries);
          WaitWhile(absl::Milliseconds(2),
                    [this, entries] { return ring_head_ - Load(L::kTail) >= entries; });
          PutSlot(ring_head_, v.data(), ring_head_ + 1);
          Store(L::kHead, ++ring_head_);
        }
      }
    }
    ring_pin_ = server::regions::RegionPin();
  }

  // After every ring closed and every call ended: each call a ring queued finished once, and
  // each word of the shm objects that no call, ring, client write or refused entry may have
  // written is as it was, and a done word only ring calls named holds one of their values (or
  // that with the failure bit, as the call ended); exactly its call's when one call named it and
  // no entry was refused.
  void CheckDoneWords() {
    std::vector<std::shared_ptr<RingCall>> calls;
    {
      absl::MutexLock lock(&ring_mu_);
      calls = ring_calls_;
    }
    for (const std::shared_ptr<RingCall>& c : calls) {
      Check(c->finished.load() == 1, "every call a ring queued finished once");
    }
    if (!ring_opened_) return;
    const FuzzEnv& env = FuzzEnv::Get();
    const bool refused = engine().RingRefusals() > refusals_before_;
    std::map<ObjectWord, std::vector<const RingCall*>> named;
    for (const std::shared_ptr<RingCall>& c : calls) {
      if (c->object >= 0) named[{c->object, c->word}].push_back(c.get());
    }
    for (int i = 0; i < FuzzEnv::kShmObjects; ++i) {
      const uint64_t size = env.shm_size(i);
      std::vector<bool> skip(size / 8 + 1, false);
      auto mark = [&](int object, uint64_t offset, uint64_t bytes) {
        if (object != i || offset >= size) return;
        const uint64_t end = bytes > size - offset ? size : offset + bytes;
        for (uint64_t w = offset / 8; w * 8 < end; ++w) skip[w] = true;
      };
      for (const Registration& r : registrations_) {
        if (tainted_names_.count(r.name) != 0) mark(r.object, r.offset, r.bytes);
      }
      for (const Registration& r : ring_ranges_) mark(r.object, r.offset, r.bytes);
      for (const ObjectWord& w : harness_words_) mark(w.first, w.second, 8);
      for (uint64_t w = 0; w + 8 <= size; w += 8) {
        if (skip[w / 8]) continue;
        const uint64_t now = __atomic_load_n(reinterpret_cast<const uint64_t*>(env.shm_data(i) + w),
                                             __ATOMIC_ACQUIRE);
        const bool failure = refused && (now & kFailureBit) != 0;
        auto it = named.find({i, w});
        if (it == named.end()) {
          Check(
              now == env.PristineWord(i, w) || failure,
              "a word no ring call named was written (only a refused entry's failure bit may be)");
          continue;
        }
        auto holds = [now](const RingCall* c) {
          return now == (c->ok.load() ? c->value : c->value | kFailureBit);
        };
        if (!refused && it->second.size() == 1) {
          Check(
              holds(it->second[0]),
              "a ring call's done word holds its value, with the failure bit iff the call failed");
          continue;
        }
        Check(failure || std::any_of(it->second.begin(), it->second.end(), holds),
              "a done word holds the value of a ring call that named it");
      }
    }
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

  // Rings. Held around a host registration and around a ring entry's lookup and Enqueue.
  absl::Mutex names_mu_;
  absl::Mutex ring_mu_;
  std::vector<std::shared_ptr<RingCall>> ring_calls_ ABSL_GUARDED_BY(ring_mu_);
  // What CheckDoneWords leaves alone: regions named by tensors and signals (every registration
  // of those names), the rings' own bytes, and the words the input wrote.
  std::vector<Registration> registrations_;
  std::set<std::string> tainted_names_;
  std::vector<Registration> ring_ranges_;
  std::set<ObjectWord> harness_words_;
  bool ring_opened_ = false;
  double refusals_before_ = 0;
  // The ring the input writes (the last open_ring's), and the client's own counts.
  std::string ring_region_;
  uint64_t ring_offset_ = 0;
  uint32_t ring_entries_ = 0;
  uint64_t ring_head_ = 0;
  uint64_t cursor_ = 0;
  server::regions::RegionPin ring_pin_;
  absl::Duration wait_left_ = kMaxRingWait;
  // Last: destroyed first, its poller calls into the members above.
  server::ops::SubmissionRingTable rings_{
      registry_.get(), &engine().metrics, {.poll = absl::Microseconds(5)}};
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
