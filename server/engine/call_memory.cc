#include "server/engine/call_memory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace attnd::server::engine {

uint64_t CallMemoryBudget::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

uint64_t CallMemoryBudget::used_by(absl::string_view client) const {
  absl::MutexLock lock(&mu_);
  auto it = by_client_.find(client);
  return it == by_client_.end() ? 0 : it->second;
}

absl::Status CallMemoryBudget::Reserve(const std::string& client, uint64_t bytes,
                                       absl::string_view what) {
  absl::MutexLock lock(&mu_);
  auto it = by_client_.find(client);
  const uint64_t mine = it == by_client_.end() ? 0 : it->second;
  if (bytes > limits_.per_client_bytes || mine > limits_.per_client_bytes - bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " of ", bytes, " bytes does not fit the call memory budget: client ",
                     client, " has ", mine, " of its ", limits_.per_client_bytes,
                     " bytes in use (--call-memory-bytes-per-client); retry when its calls ended "
                     "or place the tensor in a region"));
  }
  if (bytes > limits_.total_bytes || used_ > limits_.total_bytes - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " of ", bytes, " bytes does not fit the call memory budget: the daemon has ", used_,
        " of ", limits_.total_bytes,
        " bytes in use (--call-memory-bytes); retry later or place the tensor in a region"));
  }
  used_ += bytes;
  if (it == by_client_.end()) {
    by_client_.emplace(client, bytes);
  } else {
    it->second += bytes;
  }
  return absl::OkStatus();
}

void CallMemoryBudget::Release(const std::string& client, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_ -= std::min(used_, bytes);
  auto it = by_client_.find(client);
  if (it == by_client_.end()) return;
  if (it->second <= bytes) {
    by_client_.erase(it);
  } else {
    it->second -= bytes;
  }
}

}  // namespace attnd::server::engine
