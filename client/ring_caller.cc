#include "client/ring_caller.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace attnd::client {

absl::StatusOr<std::unique_ptr<RingCaller>> RingCaller::Open(Client* client,
                                                             RingCallerOptions options) {
  const uint32_t n = options.entries;
  if (n == 0 || n > ring_layout::kMaxEntries || (n & (n - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RingCaller: entries ", n, " is not a power of two from 1 to ", ring_layout::kMaxEntries));
  }
  if (options.spin < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("RingCaller: spin must be >= 0");
  }
  std::unique_ptr<RingCaller> caller(new RingCaller());
  caller->spin_ = options.spin;
  caller->done_offset_ = ring_layout::Bytes(n);
  // The ring, then done and ready on lines of their own.
  if (absl::Status s = internal::OpenOwnRing(client, options.session, ring_layout::Bytes(n) + 128,
                                             n, options.timeout, &caller->region_, &caller->ring_);
      !s.ok()) {
    return s;
  }
  return caller;
}

RingCaller::~RingCaller() { Close().IgnoreError(); }

absl::Status RingCaller::Run(uint64_t call_id, absl::Duration timeout) {
  if (ring_ == nullptr) return absl::FailedPreconditionError("RingCaller: closed");
  // The done word only grows: each Run waits for a value of its own, so a call that timed out
  // earlier and finishes later cannot end a later Run's wait.
  ++value_;
  return ring_->Call(call_id, SubmissionRing::kNoReady, 0, done_offset_, value_, timeout, spin_)
      .status();
}

absl::Status RingCaller::RunAfter(
    uint64_t call_id,
    const std::function<absl::Status(uint64_t* word, uint64_t value)>& enqueue_ready,
    absl::Duration timeout) {
  if (ring_ == nullptr) return absl::FailedPreconditionError("RingCaller: closed");
  const uint64_t ready_offset = done_offset_ + 64;
  const uint64_t value = value_ + 1;  // ready and done count this caller's calls alike
  uint64_t* word = reinterpret_cast<uint64_t*>(region_->data() + ready_offset);
  if (absl::Status s = enqueue_ready(word, value); !s.ok()) return s;
  value_ = value;
  return ring_->Call(call_id, ready_offset, value, done_offset_, value, timeout, spin_).status();
}

absl::Status RingCaller::Close() {
  absl::Status s;
  if (ring_ != nullptr) {
    s.Update(ring_->Close());
    ring_.reset();
  }
  if (region_ != nullptr) {
    s.Update(region_->Close());
    region_.reset();
  }
  return s;
}

}  // namespace attnd::client
