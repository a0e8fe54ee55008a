#include "client/ordered_caller.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/op_codec.h"
#include "client/op_traits.h"
#include "client/stream_ordered.h"
#include "common/cpu_relax.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace attnd::client {

namespace {

constexpr uint64_t kWordBytes = 64;  // one signal word per cache line

}  // namespace

absl::StatusOr<std::unique_ptr<OrderedCaller>> OrderedCaller::Open(Client* client,
                                                                   OrderedCallerOptions options) {
  const uint32_t n = options.entries;
  if (n == 0 || n > ring_layout::kMaxEntries || (n & (n - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("OrderedCaller: entries ", n,
                                                   " is not a power of two from 1 to ",
                                                   ring_layout::kMaxEntries));
  }
  if (options.depth == 0 || options.depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("OrderedCaller: depth ", options.depth, " is not from 1 to 4096"));
  }
  if (options.max_prepared == 0 || options.max_prepared > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("OrderedCaller: max_prepared ",
                                                   options.max_prepared, " is not from 1 to 4096"));
  }
  if (options.spin < absl::ZeroDuration() || options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("OrderedCaller: spin must be >= 0 and timeout > 0");
  }
  std::unique_ptr<OrderedCaller> caller(new OrderedCaller());
  caller->client_ = client;
  caller->options_ = options;
  caller->ready_offset_ = ring_layout::Bytes(n);
  if (absl::Status s = internal::OpenOwnRing(
          client, options.session,
          caller->ready_offset_ + kWordBytes * (1 + static_cast<uint64_t>(options.depth)), n,
          options.timeout, &caller->region_, &caller->ring_);
      !s.ok()) {
    return s;
  }
  return caller;
}

OrderedCaller::~OrderedCaller() { Close().IgnoreError(); }

template <class Params>
absl::StatusOr<uint64_t> OrderedCaller::Call(const Params& p, const StreamHooks* stream) {
  using Request = typename OpTraits<Params>::Request;
  if (ring_ == nullptr) return absl::FailedPreconditionError("OrderedCaller: closed");
  v1::PrepareCallRequest request;
  if (options_.session != nullptr) request.set_lease_id(options_.session->lease_id());
  Request* op = internal::PreparedField<Request>(&request);
  if (op == nullptr) return absl::InternalError("OrderedCaller: no PrepareCall field for this op");
  if (absl::Status s = BuildRequest(p, &client_->regions(), /*inline_only=*/false, op); !s.ok()) {
    return s;
  }
  // The key: the op's request, serialised deterministically (the same request, the same bytes).
  std::string key;
  {
    google::protobuf::io::StringOutputStream out(&key);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    if (!op->SerializeToCodedStream(&coded)) {
      return absl::InternalError("OrderedCaller: the request did not serialise");
    }
  }
  return Submit(
      Request::descriptor()->name(), std::move(key),
      [&]() { return internal::PrepareCallRpc(client_, request, options_.timeout); }, stream);
}

absl::StatusOr<uint64_t> OrderedCaller::Submit(
    const std::string& op, std::string key,
    const std::function<absl::StatusOr<uint64_t>()>& prepare, const StreamHooks* stream) {
  Poll();
  if (absl::Status s = TakeFailures(); !s.ok()) return s;
  const uint64_t n = calls_ + 1;
  if (n > options_.depth) {  // done word n % depth is free once call n - depth is over
    if (absl::Status s = WaitRetired(n - options_.depth, options_.timeout); !s.ok()) return s;
    if (absl::Status s = TakeFailures(); !s.ok()) return s;
  }
  uint64_t call_id = 0;
  if (auto it = prepared_.find(key); it != prepared_.end()) {
    call_id = it->second.call_id;
    it->second.last = n;
    lru_.splice(lru_.end(), lru_, it->second.lru);
  } else {
    while (prepared_.size() >= options_.max_prepared) {
      auto oldest = prepared_.find(lru_.front());
      // Its last call, or the latest submitted one: `last` may name a call whose hook or ring
      // refused it, whose number the next call takes.
      const uint64_t last = std::min(oldest->second.last, calls_);
      if (last > retired_) {
        if (absl::Status s = WaitRetired(last, options_.timeout); !s.ok()) return s;
      }
      Release(oldest->second.call_id);
      prepared_.erase(oldest);
      lru_.pop_front();
    }
    absl::StatusOr<uint64_t> id = prepare();
    if (!id.ok()) return id.status();
    ++prepares_;
    call_id = *id;
    lru_.push_back(key);
    prepared_.emplace(std::move(key), Prepared{call_id, n, std::prev(lru_.end())});
  }
  if (stream != nullptr) {
    if (absl::Status s = stream->write(Word(ready_offset_), n); !s.ok()) return s;
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  const uint64_t ready = stream != nullptr ? ready_offset_ : SubmissionRing::kNoReady;
  for (;;) {
    const absl::StatusCode c = ring_->Submit(call_id, ready, n, DoneOffset(n), n);
    if (c == absl::StatusCode::kOk) break;
    if (c != absl::StatusCode::kResourceExhausted) {
      return absl::Status(
          c, absl::StrCat("OrderedCaller: ring ", ring_->ring_id(), " is closed or errored"));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("OrderedCaller: ring ", ring_->ring_id(),
                                                      " stayed full for ",
                                                      absl::FormatDuration(options_.timeout)));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  calls_ = n;
  pending_.push_back(Pending{n, call_id, &op});
  if (!dropped_.empty()) ReleaseDropped(/*everything=*/false);
  if (stream != nullptr) {
    if (absl::Status s = stream->wait(Word(DoneOffset(n)), n); !s.ok()) return s;
  }
  return n;
}

absl::Status OrderedCaller::Wait(uint64_t n, absl::Duration timeout) {
  if (ring_ == nullptr) return absl::FailedPreconditionError("OrderedCaller: closed");
  const uint64_t target = n == kLatest ? calls_ : std::min(n, calls_);
  if (absl::Status s = WaitRetired(target, timeout); !s.ok()) return s;
  return TakeFailures();
}

absl::Status OrderedCaller::Check() {
  Poll();
  return TakeFailures();
}

absl::Status OrderedCaller::Close() {
  if (ring_ == nullptr) return absl::OkStatus();
  absl::Status s = WaitRetired(calls_, options_.timeout);
  if (!s.ok()) AbortPending(0, /*reported=*/true);
  ring_->Close().IgnoreError();  // a Session's lease may have taken it already
  ring_.reset();
  for (const auto& [key, prepared] : prepared_) Release(prepared.call_id);
  prepared_.clear();
  lru_.clear();
  ReleaseDropped(/*everything=*/true);
  pending_.clear();
  region_->Close().IgnoreError();
  if (s.ok()) s = TakeFailures();
  return s;
}

void OrderedCaller::Poll() {
  while (!pending_.empty()) {
    const Pending& p = pending_.front();
    const uint64_t got = LoadSignal(Word(DoneOffset(p.n)));
    if ((got & ~kSignalFailureBit) != p.n) return;
    retired_ = p.n;
    if ((got & kSignalFailureBit) != 0) {
      failures_.emplace_back(p.n, p.op);
      // Its request is prepared anew on its next use (a region it names may have been
      // registered again under that name); the old call is released once its calls are over.
      for (auto it = prepared_.begin(); it != prepared_.end(); ++it) {
        if (it->second.call_id != p.call_id) continue;
        dropped_.emplace_back(it->second.call_id, it->second.last);
        lru_.erase(it->second.lru);
        prepared_.erase(it);
        break;
      }
    }
    pending_.pop_front();
  }
}

absl::Status OrderedCaller::TakeFailures() {
  if (failures_.empty()) return absl::OkStatus();
  const auto [n, op] = failures_.front();
  const size_t more = failures_.size() - 1;
  failures_.clear();
  return absl::AbortedError(absl::StrCat(
      "OrderedCaller: call ", n, " (", *op, ") failed",
      more > 0 ? absl::StrCat(" (and ", more, " later calls)") : "",
      "; its outputs are undefined (the daemon's log and attnd_requests_total say why)"));
}

absl::Status OrderedCaller::WaitRetired(uint64_t n, absl::Duration timeout) {
  const absl::Time start = absl::Now();
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : start + timeout;
  const absl::Time spin_until = start + options_.spin;
  for (uint64_t i = 0;; ++i) {
    Poll();
    if (retired_ >= n) return absl::OkStatus();
    if (i % 64 != 0) {
      attnd::CpuRelax();
      continue;
    }
    const absl::Time now = absl::Now();
    if (now < spin_until) continue;
    if (ring_ != nullptr) {
      if (absl::Status s = CheckRing(now); !s.ok()) return s;
    }
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("OrderedCaller: call ", n, " not over after ",
                                                      absl::FormatDuration(timeout), " (", retired_,
                                                      " of ", calls_, " calls over)"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

absl::Status OrderedCaller::CheckRing(absl::Time now) {
  const uint64_t state = ring_->state();
  const uint64_t taken = ring_->taken();
  if (state != ring_layout::kOpen && taken < ring_->submitted()) {
    AbortPending(taken, /*reported=*/true);
    return absl::FailedPreconditionError(
        absl::StrCat("OrderedCaller: ring ", ring_->ring_id(), " was ",
                     state == ring_layout::kErrored ? "errored" : "closed", " with ",
                     ring_->submitted() - taken, " entries not taken"));
  }
  if (const std::optional<absl::Duration> silent = ring_->Silence(now)) {
    const size_t failed = pending_.size();
    AbortPending(0, /*reported=*/true);
    return absl::UnavailableError(
        absl::StrCat("OrderedCaller: the daemon has not polled ring ", ring_->ring_id(), " for ",
                     absl::FormatDuration(*silent), " (it exited or hangs); ", failed,
                     " pending calls failed here"));
  }
  return absl::OkStatus();
}

void OrderedCaller::AbortPending(uint64_t after, bool reported) {
  // Call n is the ring's entry n - 1 (the ring is this caller's own).
  std::vector<uint64_t> aborted;
  for (const Pending& p : pending_) {
    if (p.n <= after) continue;
    uint64_t* word = Word(DoneOffset(p.n));
    if ((LoadSignal(word) & ~kSignalFailureBit) != p.n) {
      StoreSignal(word, p.n | kSignalFailureBit);
      aborted.push_back(p.n);
    }
  }
  Poll();
  if (!reported || aborted.empty()) return;
  // Failed here, and reported by the caller's status: not once more by TakeFailures. Failures
  // the daemon stored itself stay.
  failures_.erase(std::remove_if(failures_.begin(), failures_.end(),
                                 [&](const auto& f) {
                                   return std::find(aborted.begin(), aborted.end(), f.first) !=
                                          aborted.end();
                                 }),
                  failures_.end());
}

void OrderedCaller::Release(uint64_t call_id) {
  ReleaseCall(client_, call_id, options_.timeout).IgnoreError();  // gone with a region or lease
}

void OrderedCaller::ReleaseDropped(bool everything) {
  std::vector<std::pair<uint64_t, uint64_t>> kept;
  for (const auto& [call_id, last] : dropped_) {
    if (everything || last <= retired_) {
      Release(call_id);
    } else {
      kept.emplace_back(call_id, last);
    }
  }
  dropped_ = std::move(kept);
}

uint64_t OrderedCaller::DoneOffset(uint64_t n) const {
  return ready_offset_ + kWordBytes * (1 + n % options_.depth);
}

uint64_t* OrderedCaller::Word(uint64_t offset) const {
  return reinterpret_cast<uint64_t*>(region_->data() + offset);
}

#define ATTND_CLIENT_ORDERED_CALLER(ParamsT) \
  template absl::StatusOr<uint64_t> OrderedCaller::Call(const ParamsT&, const StreamHooks*);
ATTND_CLIENT_FOR_EACH_PARAMS(ATTND_CLIENT_ORDERED_CALLER)
#undef ATTND_CLIENT_ORDERED_CALLER

}  // namespace attnd::client
