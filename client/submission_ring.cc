#include "client/submission_ring.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/channel.h"
#include "client/stream_ordered.h"

namespace attnd::client {
namespace {

namespace L = ring_layout;

uint64_t LoadAcquire(const char* p) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(p), __ATOMIC_ACQUIRE);
}
void StoreRelaxed(char* p, uint64_t v) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(p), v, __ATOMIC_RELAXED);
}
void StoreRelease(char* p, uint64_t v) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(p), v, __ATOMIC_RELEASE);
}

}  // namespace

namespace {

absl::StatusOr<v1::OpenRingRequest> OpenRequest(const HostRegion& region, uint64_t offset,
                                                uint32_t entries,
                                                const std::string& signal_region) {
  if (offset > region.size() || region.size() - offset < L::Bytes(entries)) {
    return absl::InvalidArgumentError(absl::StrCat("SubmissionRing: ", L::Bytes(entries),
                                                   " bytes at ", offset, " are past the end of '",
                                                   region.name(), "' (", region.size(), ")"));
  }
  v1::OpenRingRequest request;
  request.set_region(region.name());
  request.set_offset(offset);
  request.set_entries(entries);
  request.set_signal_region(signal_region);  // empty: the ring's own region
  return request;
}

}  // namespace

// The signal words: where this process reads them (null for a device region), their size and
// the region's name.
struct SubmissionRing::Signals {
  char* data = nullptr;
  uint64_t bytes = 0;
  std::string name;
  static Signals Of(const HostRegion& region, const HostRegion* signals) {
    const HostRegion& r = signals != nullptr ? *signals : region;
    return Signals{r.data(), r.size(), signals != nullptr ? signals->name() : ""};
  }
  static Signals Of(const DeviceRegion& signals) { return Signals{nullptr, 0, signals.name()}; }
};

absl::StatusOr<std::unique_ptr<SubmissionRing>> SubmissionRing::OpenOn(
    Client* client, Session* session, const HostRegion& region, uint64_t offset, uint32_t entries,
    const Signals& signals, const std::string& lease_id, absl::Duration timeout) {
  absl::StatusOr<v1::OpenRingRequest> request = OpenRequest(region, offset, entries, signals.name);
  if (!request.ok()) return request.status();
  uint64_t ring_id = 0;
  if (session != nullptr) {
    v1::SessionRequest message;
    *message.mutable_open_ring() = *std::move(request);
    absl::StatusOr<v1::SessionResponse> reply = session->Exchange(std::move(message), timeout);
    if (!reply.ok()) {
      return absl::Status(reply.status().code(),
                          absl::StrCat("OpenRing: ", reply.status().message()));
    }
    ring_id = reply->open_ring().ring_id();
  } else {
    request->set_lease_id(lease_id);
    v1::OpenRingResponse response;
    grpc::ClientContext ctx;
    SetTimeout(&ctx, timeout);
    grpc::Status s = client->stub()->OpenRing(&ctx, *request, &response);
    if (!s.ok()) return FromGrpcStatus(s, "OpenRing");
    ring_id = response.ring_id();
  }
  std::unique_ptr<SubmissionRing> ring(new SubmissionRing());
  ring->client_ = client;
  ring->session_ = session;
  ring->base_ = region.data() + offset;
  ring->signals_ = signals.data;
  ring->signals_bytes_ = signals.bytes;
  ring->signal_region_ = signals.name.empty() ? region.name() : signals.name;
  ring->ring_id_ = ring_id;
  ring->entries_ = entries;
  ring->open_ = true;
  ring->timeout_ = timeout;
  return ring;
}

absl::StatusOr<std::unique_ptr<SubmissionRing>> SubmissionRing::Open(
    Client* client, const HostRegion& region, uint64_t offset, uint32_t entries,
    const HostRegion* signals, const std::string& lease_id, absl::Duration timeout) {
  return OpenOn(client, nullptr, region, offset, entries, Signals::Of(region, signals), lease_id,
                timeout);
}

absl::StatusOr<std::unique_ptr<SubmissionRing>> SubmissionRing::Open(
    Session* session, const HostRegion& region, uint64_t offset, uint32_t entries,
    const HostRegion* signals, absl::Duration timeout) {
  return OpenOn(nullptr, session, region, offset, entries, Signals::Of(region, signals), "",
                timeout);
}

absl::StatusOr<std::unique_ptr<SubmissionRing>> SubmissionRing::Open(
    Client* client, const HostRegion& region, uint64_t offset, uint32_t entries,
    const DeviceRegion& signals, const std::string& lease_id, absl::Duration timeout) {
  return OpenOn(client, nullptr, region, offset, entries, Signals::Of(signals), lease_id, timeout);
}

absl::StatusOr<std::unique_ptr<SubmissionRing>> SubmissionRing::Open(
    Session* session, const HostRegion& region, uint64_t offset, uint32_t entries,
    const DeviceRegion& signals, absl::Duration timeout) {
  return OpenOn(nullptr, session, region, offset, entries, Signals::Of(signals), "", timeout);
}

SubmissionRing::~SubmissionRing() { Close().IgnoreError(); }

absl::StatusCode SubmissionRing::Submit(uint64_t call_id, uint64_t ready_offset,
                                        uint64_t ready_value, uint64_t done_offset,
                                        uint64_t done_value) {
  if (LoadAcquire(base_ + L::kState) != 0) return absl::StatusCode::kFailedPrecondition;
  if (head_ - LoadAcquire(base_ + L::kTail) >= entries_) {
    return absl::StatusCode::kResourceExhausted;
  }
  char* slot = base_ + L::kHeaderBytes + (head_ & (entries_ - 1)) * L::kEntryBytes;
  const bool ready = ready_offset != kNoReady;
  StoreRelaxed(slot + 8, call_id);
  StoreRelaxed(slot + 16, ready ? ready_offset : 0);
  StoreRelaxed(slot + 24, ready ? ready_value : 0);
  StoreRelaxed(slot + 32, done_offset);
  StoreRelaxed(slot + 40, done_value);
  StoreRelaxed(slot + 48, ready ? L::kFlagReady : 0);
  StoreRelease(slot, head_ + 1);  // seq last: the slot is complete
  ++head_;
  StoreRelease(base_ + L::kHead, head_);
  return absl::StatusCode::kOk;
}

absl::StatusOr<uint64_t> SubmissionRing::Call(uint64_t call_id, uint64_t ready_offset,
                                              uint64_t ready_value, uint64_t done_offset,
                                              uint64_t done_value, absl::Duration timeout,
                                              absl::Duration spin) {
  if (signals_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("SubmissionRing::Call: ring ", ring_id_,
                     "'s signal words are in device region '", signal_region_,
                     "', which this process cannot poll: Submit, and wait for the done word "
                     "on a stream (stream_ordered.h)"));
  }
  if (done_offset > signals_bytes_ || signals_bytes_ - done_offset < sizeof(uint64_t) ||
      (reinterpret_cast<uintptr_t>(signals_) + done_offset) % alignof(uint64_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SubmissionRing::Call: done_offset ", done_offset,
        " is not an 8-byte aligned word inside the signal region (", signals_bytes_, " bytes)"));
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusCode code;
  while ((code = Submit(call_id, ready_offset, ready_value, done_offset, done_value)) ==
         absl::StatusCode::kResourceExhausted) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("SubmissionRing::Call: the ring stayed full for ",
                       absl::FormatDuration(timeout), " (the daemon took no entry)"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (code != absl::StatusCode::kOk) {
    return absl::FailedPreconditionError(
        absl::StrCat("SubmissionRing::Call: ring ", ring_id_, " was ",
                     state() == L::kErrored ? "errored" : "closed", " by the daemon"));
  }
  const uint64_t seq = head_;  // this entry is taken once the daemon's tail reaches it
  const uint64_t* word = reinterpret_cast<const uint64_t*>(signals_ + done_offset);
  auto check = [&]() -> absl::Status {
    const uint64_t st = state();
    if (st != L::kOpen && taken() < seq) {
      return absl::FailedPreconditionError(absl::StrCat("SubmissionRing::Call: ring ", ring_id_,
                                                        " was closed or errored by the daemon "
                                                        "before it took the entry"));
    }
    if (const std::optional<absl::Duration> silent = Silence(absl::Now())) {
      return absl::UnavailableError(
          absl::StrCat("SubmissionRing::Call: the daemon has not polled ring ", ring_id_, " for ",
                       absl::FormatDuration(*silent), " (it exited or hangs); done word ",
                       LoadSignal(reinterpret_cast<const uint64_t*>(signals_ + done_offset))));
    }
    return absl::OkStatus();
  };
  return internal::WaitSignalUnless(
      word, done_value, std::max(deadline - absl::Now(), absl::ZeroDuration()), spin, check);
}

absl::Status SubmissionRing::Close() {
  if (!open_) return absl::OkStatus();
  open_ = false;
  absl::Status s;
  if (session_ != nullptr) {
    v1::SessionRequest message;
    message.mutable_close_ring()->set_ring_id(ring_id_);
    s = session_->Exchange(std::move(message), timeout_).status();
  } else {
    v1::CloseRingRequest request;
    request.set_ring_id(ring_id_);
    v1::CloseRingResponse response;
    grpc::ClientContext ctx;
    SetTimeout(&ctx, timeout_);
    const grpc::Status g = client_->stub()->CloseRing(&ctx, request, &response);
    if (!g.ok()) s = FromGrpcStatus(g, "CloseRing");
  }
  // NOT_FOUND for an id OpenRing gave: the daemon closed the ring already (a region of it
  // unregistered, its lease over, a protocol error; docs/SERVICE.md "Submission rings").
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

uint64_t SubmissionRing::taken() const { return LoadAcquire(base_ + L::kTail); }
uint64_t SubmissionRing::state() const { return LoadAcquire(base_ + L::kState); }
uint64_t SubmissionRing::beat() const { return LoadAcquire(base_ + L::kBeat); }

std::optional<absl::Duration> SubmissionRing::Silence(absl::Time now) {
  const uint64_t b = beat();
  if (b != beat_seen_ || beat_moved_ == absl::InfinitePast()) {
    beat_seen_ = b;
    beat_moved_ = now;
    return std::nullopt;
  }
  if (state() == L::kOpen && b != 0 && now - beat_moved_ > L::kDaemonSilence) {
    return now - beat_moved_;
  }
  return std::nullopt;
}

namespace internal {

absl::Status OpenOwnRing(Client* client, Session* session, uint64_t bytes, uint32_t entries,
                         absl::Duration timeout, std::unique_ptr<HostRegion>* region,
                         std::unique_ptr<SubmissionRing>* ring) {
  HostRegionOptions ro;
  ro.bytes = bytes;
  ro.timeout = timeout;
  if (session != nullptr) ro.lease_id = session->lease_id();
  absl::StatusOr<std::unique_ptr<HostRegion>> r = HostRegion::Create(client, ro);
  if (!r.ok()) return r.status();
  *region = *std::move(r);
  absl::StatusOr<std::unique_ptr<SubmissionRing>> opened =
      session != nullptr ? SubmissionRing::Open(session, **region, 0, entries, nullptr, timeout)
                         : SubmissionRing::Open(client, **region, 0, entries, nullptr, "", timeout);
  if (!opened.ok()) return opened.status();  // the region goes with its owner
  *ring = *std::move(opened);
  return absl::OkStatus();
}

}  // namespace internal

}  // namespace attnd::client
