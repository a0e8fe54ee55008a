#include "server/engine/backend.h"

#include "absl/strings/str_cat.h"

namespace attnd::server::engine {

absl::Status CheckHostOnlyCall(const OpCall& call, absl::string_view own_uuid) {
  for (const TensorUse& t : call.tensors()) {
    if (t.residence == Residence::kDeviceRegion) {
      return absl::FailedPreconditionError(
          absl::StrCat(t.name, ": a device region reached a backend without devices"));
    }
  }
  if (!call.ready_event().empty()) {
    return absl::UnimplementedError(
        "ready_event: IPC events need a GPU backend (--backend=cuda|hip); this daemon runs the "
        "CPU backend");
  }
  if (!call.device_uuid().empty() && call.device_uuid() != own_uuid) {
    return absl::InvalidArgumentError(absl::StrCat("device_uuid: '", call.device_uuid(),
                                                   "' is not a device this daemon serves (",
                                                   own_uuid, ")"));
  }
  return absl::OkStatus();
}

absl::Status StopToken::status(absl::string_view what) const {
  switch (reason()) {
    case Reason::kDeadline:
      return absl::DeadlineExceededError(absl::StrCat("deadline passed ", what));
    case Reason::kCancelled: return absl::CancelledError(absl::StrCat("cancelled ", what));
    case Reason::kShutdown:
      return absl::UnavailableError(
          absl::StrCat("attnd is shutting down: --drain-timeout passed ", what));
    case Reason::kNone: break;
  }
  return absl::OkStatus();
}

absl::Status Backend::RunCall(OpCall& call, StepResult* result, const StopToken* stop) {
  if (absl::Status s = CheckHostOnlyCall(call, ""); !s.ok()) return s;
  const std::vector<void*> data = call.HostData();
  return Run(
      call.op(),
      [&call, &data](const kernels::ExecContext& ctx, std::string* impl) {
        return call.Run(ctx, data, impl);
      },
      result, stop);
}

void Backend::SetDeviceLostCallback(DeviceLostFn on_lost) {
  absl::MutexLock lock(&lost_mu_);
  on_lost_ = std::move(on_lost);
  if (!on_lost_) return;
  for (const auto& [device, why] : lost_) on_lost_(device, why);
}

std::vector<std::string> Backend::LostDevices() const {
  absl::MutexLock lock(&lost_mu_);
  std::vector<std::string> out;
  for (const auto& lost : lost_) out.push_back(lost.first);
  return out;
}

void Backend::ReportDeviceLost(const std::string& device, absl::string_view why) {
  absl::MutexLock lock(&lost_mu_);
  for (const auto& lost : lost_) {
    if (lost.first == device) return;
  }
  lost_.emplace_back(device, std::string(why));
  if (on_lost_) on_lost_(device, lost_.back().second);
}

}  // namespace attnd::server::engine
