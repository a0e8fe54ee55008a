#include "client/session.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/error_details.h"
#include "common/cpu_relax.h"

namespace attnd::client {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct Session::Pending::Slot {
  uint64_t id = 0;
  Clock::time_point sent;
  absl::Mutex mu;  // Wait awaits `done`
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);  // of the stream, when it ended before the reply
  v1::SessionResponse response ABSL_GUARDED_BY(mu);
  Clock::time_point received ABSL_GUARDED_BY(mu);
  // `done`, readable without the lock: Pending::Wait polls it before it sleeps (wait_spin).
  std::atomic<bool> arrived{false};

  void Complete(v1::SessionResponse r, absl::Status s) ABSL_LOCKS_EXCLUDED(mu) {
    const Clock::time_point now = Clock::now();
    absl::MutexLock lock(&mu);
    if (done) return;
    response = std::move(r);
    status = std::move(s);
    received = now;
    done = true;
    arrived.store(true, std::memory_order_release);
  }
};

Session::Session(Client* client, SessionOptions options)
    : client_(client), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Session>> Session::Open(Client* client,
                                                       const SessionOptions& options) {
  if (client == nullptr) return absl::InvalidArgumentError("Session: no client");
  std::unique_ptr<Session> s(new Session(client, options));
  s->stream_ = client->stub()->Session(&s->ctx_);
  if (s->stream_ == nullptr) return absl::UnavailableError("Session: cannot start the stream");
  s->reader_ = std::thread([session = s.get()] { session->ReadLoop(); });

  Pending open;
  open.session_ = s.get();
  open.slot_ = s->AddSlot(0);
  open.wait_limit_ = options.open_timeout;
  v1::SessionRequest request;
  request.set_request_id(0);
  request.mutable_open()->set_client_name(options.client_name);
  absl::Status status = s->Write(request);
  if (status.ok()) {
    open.apply_ = [&s](const v1::SessionResponse& r, CallResult*) {
      if (!r.has_opened() || r.opened().lease_id().empty()) {
        return absl::DataLossError("Session: the reply to `open` carries no lease");
      }
      s->lease_id_ = r.opened().lease_id();
      return absl::OkStatus();
    };
    status = open.Wait().status();
  }
  if (!status.ok()) {
    s->ctx_.TryCancel();
    s->Close().IgnoreError();
    return status;
  }
  return s;
}

Session::~Session() { Close().IgnoreError(); }

std::shared_ptr<Session::Pending::Slot> Session::AddSlot(uint64_t id) {
  auto slot = std::make_shared<Pending::Slot>();
  slot->id = id;
  absl::MutexLock lock(&mu_);
  if (ended_) {
    // Not shared yet: locked for the annotations only (nothing else can hold it).
    absl::MutexLock slot_lock(&slot->mu);
    slot->done = true;
    slot->status =
        end_status_.ok() ? absl::UnavailableError("Session: the stream has ended") : end_status_;
    slot->arrived.store(true, std::memory_order_release);
    return slot;
  }
  slots_[id] = slot;
  return slot;
}

void Session::DropSlot(uint64_t id) {
  absl::MutexLock lock(&mu_);
  slots_.erase(id);
}

absl::Status Session::Write(const v1::SessionRequest& request) {
  absl::MutexLock lock(&write_mu_);
  if (writes_done_) return absl::FailedPreconditionError("Session: closed");
  if (!stream_->Write(request)) {
    return absl::UnavailableError("Session: the stream is broken (the daemon went away?)");
  }
  return absl::OkStatus();
}

void Session::ReadLoop() {
  v1::SessionResponse response;
  while (stream_->Read(&response)) {
    std::shared_ptr<Pending::Slot> slot;
    {
      absl::MutexLock lock(&mu_);
      auto it = slots_.find(response.request_id());
      if (it == slots_.end()) continue;  // a cancel acknowledgement, or a call given up on
      slot = std::move(it->second);
      slots_.erase(it);
    }
    slot->Complete(std::move(response), absl::OkStatus());
    response = v1::SessionResponse();
  }
  absl::Status end = FromGrpcStatus(stream_->Finish(), "Session");
  std::map<uint64_t, std::shared_ptr<Pending::Slot>> orphans;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    end_status_ = end;
    orphans.swap(slots_);
  }
  const absl::Status orphan_status =
      end.ok() ? absl::UnavailableError("Session: the stream ended before the reply") : end;
  for (auto& [id, slot] : orphans) slot->Complete(v1::SessionResponse(), orphan_status);
}

absl::Status Session::Cancel(uint64_t request_id) {
  v1::SessionRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_request_id(next_id_++);
  }
  request.mutable_cancel()->set_target_request_id(request_id);
  return Write(request);
}

absl::Status Session::Close() {
  if (closed_) {
    absl::MutexLock lock(&mu_);
    return end_status_;
  }
  closed_ = true;
  if (stream_ != nullptr) {
    absl::MutexLock lock(&write_mu_);
    if (!writes_done_) {
      writes_done_ = true;
      stream_->WritesDone();
    }
  }
  if (reader_.joinable()) {
    bool ended;
    {
      absl::MutexLock lock(&mu_);
      ended = mu_.AwaitWithTimeout(absl::Condition(&ended_), options_.close_timeout);
    }
    if (!ended) ctx_.TryCancel();  // the daemon does not finish: end the stream from here
    reader_.join();
  }
  absl::MutexLock lock(&mu_);
  return end_status_;
}

uint64_t Session::Pending::request_id() const { return slot_ ? slot_->id : 0; }

absl::StatusOr<CallResult> Session::Pending::Wait() {
  if (!slot_) return absl::FailedPreconditionError("Session: Wait on an empty Pending");
  std::shared_ptr<Slot> slot = std::move(slot_);
  if (spin_ > absl::ZeroDuration()) {
    // Poll first (SessionOptions::wait_spin); the lock below then finds the reply in place.
    const Clock::time_point until =
        Clock::now() + absl::ToChronoNanoseconds(std::min(spin_, wait_limit_));
    while (!slot->arrived.load(std::memory_order_acquire) && Clock::now() < until) {
      attnd::CpuRelax();
    }
  }
  absl::ReleasableMutexLock lock(&slot->mu);
  if (wait_limit_ == absl::InfiniteDuration()) {
    slot->mu.Await(absl::Condition(&slot->done));
  } else if (!slot->mu.AwaitWithTimeout(absl::Condition(&slot->done), wait_limit_)) {
    lock.Release();
    session_->DropSlot(slot->id);
    session_->Cancel(slot->id).IgnoreError();
    return absl::DeadlineExceededError(absl::StrCat("Session: no reply to request ", slot->id,
                                                    " within ", absl::FormatDuration(wait_limit_)));
  }
  if (!slot->status.ok()) return slot->status;
  // slot->response is read in place, not through a reference: clang's analysis loses the lock
  // of a guarded member behind a local reference.
  if (slot->response.code() != 0) {
    absl::Status error(static_cast<absl::StatusCode>(slot->response.code()),
                       slot->response.message());
    // The causes, for ErrorDetailsOf (error_details.h), as a unary call's trailer gives them.
    if (!slot->response.status_details().empty()) {
      error.SetPayload(kStatusDetailsPayload, absl::Cord(slot->response.status_details()));
    }
    return error;
  }
  CallResult result;
  result.round_trip_seconds = std::chrono::duration<double>(slot->received - slot->sent).count();
  if (apply_) {
    if (absl::Status s = apply_(slot->response, &result); !s.ok()) return s;
  }
  return result;
}

template <class Params>
absl::StatusOr<Session::Pending> Session::Start(const Params& p, const CallOptions& options) {
  using Traits = OpTraits<Params>;
  v1::SessionRequest request;
  if (absl::Status s =
          BuildRequest(p, &client_->regions(), options.inline_only, Traits::InSession(&request));
      !s.ok()) {
    return s;
  }
  SetSignals(options, Traits::InSession(&request));
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_id_++;
  }
  request.set_request_id(id);
  Pending pending;
  pending.session_ = this;
  if (options.timeout != absl::InfiniteDuration() && options.timeout > absl::ZeroDuration()) {
    request.set_timeout_seconds(absl::ToDoubleSeconds(options.timeout));
    pending.wait_limit_ = options.timeout + options_.wait_slack;
  }
  pending.apply_ = [p](const v1::SessionResponse& r, CallResult* result) {
    const typename Traits::Response* response = Traits::FromSession(r);
    if (response == nullptr) {
      return absl::DataLossError(
          absl::StrCat(Traits::kRpc, ": the Session reply carries no ", Traits::kName, " result"));
    }
    absl::Status s = ApplyReply(p, *response, result);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(Traits::kRpc, ": ", s.message()));
    return s;
  };
  pending.spin_ = options_.wait_spin;
  pending.slot_ = AddSlot(id);
  pending.slot_->sent = Clock::now();
  if (absl::Status s = Write(request); !s.ok()) {
    DropSlot(id);
    return s;
  }
  return pending;
}

absl::StatusOr<v1::SessionResponse> Session::Exchange(v1::SessionRequest request,
                                                      absl::Duration timeout) {
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_id_++;
  }
  request.set_request_id(id);
  v1::SessionResponse out;
  Pending pending;
  pending.session_ = this;
  pending.wait_limit_ = timeout;
  pending.apply_ = [&out](const v1::SessionResponse& r, CallResult*) {
    out = r;
    return absl::OkStatus();
  };
  pending.slot_ = AddSlot(id);
  pending.slot_->sent = Clock::now();
  if (absl::Status s = Write(request); !s.ok()) {
    DropSlot(id);
    return s;
  }
  absl::StatusOr<CallResult> r = pending.Wait();
  if (!r.ok()) return r.status();
  return out;
}

template <class Params>
absl::StatusOr<CallResult> Session::Call(const Params& p, const CallOptions& options) {
  absl::StatusOr<Pending> pending = Start(p, options);
  if (!pending.ok()) return pending.status();
  return pending->Wait();
}

#define ATTND_SESSION_INSTANTIATE(P)                                                      \
  template absl::StatusOr<Session::Pending> Session::Start(const P&, const CallOptions&); \
  template absl::StatusOr<CallResult> Session::Call(const P&, const CallOptions&);
ATTND_CLIENT_FOR_EACH_PARAMS(ATTND_SESSION_INSTANTIATE)
#undef ATTND_SESSION_INSTANTIATE

}  // namespace attnd::client
