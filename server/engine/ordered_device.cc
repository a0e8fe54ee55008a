#include "server/engine/ordered_device.h"

#include "absl/strings/str_cat.h"

namespace attnd::server::engine {

bool DevicePathEligible(const std::vector<TensorUse>& tensors) {
  bool device = false;
  for (const TensorUse& t : tensors) {
    if (t.residence == Residence::kDeviceRegion) {
      device = true;
      continue;
    }
    // Inline inputs are staged at accept; host-region tensors (index data snapshotted when
    // ready) and anything coming back inline take the host-polled path.
    if (t.residence != Residence::kInline || t.role != kernels::Role::kInput) return false;
  }
  return device;
}

std::optional<absl::Status> WatchdogDecision(const WatchdogInput& in) {
  if (in.gated || in.already_cancelled) return std::nullopt;
  if (in.drain_expired) {
    return absl::UnavailableError(
        "attnd's drain reached --drain-timeout: the stream-ordered call was not run (its done "
        "word has the failure bit)");
  }
  if (in.cancelled) return absl::CancelledError("stream-ordered call cancelled before it ran");
  if (in.now >= in.wait_deadline) {
    return absl::DeadlineExceededError(
        "stream-ordered call not run: its ready word (or an earlier call of its queue) was not "
        "reached by its wait deadline; the watchdog cancelled it on the device");
  }
  return std::nullopt;
}

absl::Status CompletionStatus(DeviceCallState state, const std::optional<absl::Status>& watchdog,
                              const absl::Status& error) {
  switch (state) {
    case DeviceCallState::kRan: return absl::OkStatus();
    case DeviceCallState::kSkipped:
      if (watchdog.has_value()) return *watchdog;
      return absl::InternalError("stream-ordered call skipped on the device without a cancel");
    case DeviceCallState::kFailed:
      return error.ok() ? absl::InternalError("device-ordered call failed") : error;
    case DeviceCallState::kPending: break;
  }
  return absl::InternalError("device-ordered call still pending");
}

SlotTable::SlotTable(size_t capacity) : capacity_(capacity) {
  free_.reserve(capacity);
  for (size_t i = capacity; i > 0; --i) free_.push_back(i - 1);
}

absl::StatusOr<size_t> SlotTable::Take() {
  absl::MutexLock lock(&mu_);
  if (free_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many device-ordered calls pending (", capacity_, ")"));
  }
  const size_t i = free_.back();
  free_.pop_back();
  return i;
}

void SlotTable::Give(size_t index) {
  absl::MutexLock lock(&mu_);
  free_.push_back(index);
}

size_t SlotTable::in_use() const {
  absl::MutexLock lock(&mu_);
  return capacity_ - free_.size();
}

}  // namespace attnd::server::engine
