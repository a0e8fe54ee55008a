// The host memory budget of operator calls (docs/SERVICE.md "Trust model"): what a call allocates
// on the host because of its request, before it runs — inline outputs in its reply, aligned copies
// of misaligned inline inputs and outputs, private snapshots of index tensors — is reserved against
// a limit per client and a limit in total before anything is allocated. A request that does not
// fit is RESOURCE_EXHAUSTED; its client retries later. Constructed by main (or a test), passed in.
//   CallMemoryBudget budget({.total_bytes = 4ull << 30, .per_client_bytes = 1ull << 30});
//   CallMemory memory(&budget, "uid:1000");
//   ATTND_RETURN_IF_ERROR(memory.Reserve(bytes, "out: inline output"));  // then allocate
//   // ~CallMemory returns the bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace attnd::server::engine {

class CallMemoryBudget {
 public:
  struct Limits {
    uint64_t total_bytes = 4ull << 30;       // --call-memory-bytes
    uint64_t per_client_bytes = 1ull << 30;  // --call-memory-bytes-per-client
  };
  explicit CallMemoryBudget(Limits limits) : limits_(limits) {}
  CallMemoryBudget(const CallMemoryBudget&) = delete;
  CallMemoryBudget& operator=(const CallMemoryBudget&) = delete;

  const Limits& limits() const { return limits_; }
  // Bytes reserved now, in total and by one client. Thread-safe.
  uint64_t used() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t used_by(absl::string_view client) const ABSL_LOCKS_EXCLUDED(mu_);

  // Reserves `bytes` for `client`, or RESOURCE_EXHAUSTED naming `what`, the limit that does not
  // hold and its flag (nothing reserved then). Thread-safe, never blocks on other calls.
  absl::Status Reserve(const std::string& client, uint64_t bytes, absl::string_view what)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Returns bytes reserved for `client`. Thread-safe.
  void Release(const std::string& client, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const Limits limits_;
  mutable absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint64_t, std::less<>> by_client_ ABSL_GUARDED_BY(mu_);  // no zero entries
};

// What one call holds of a budget: released when destroyed (a transport keeps it until the reply
// that carries the memory is sent). A null budget reserves nothing and always fits. Not
// thread-safe: one call resolves its tensors on one thread.
class CallMemory {
 public:
  CallMemory(CallMemoryBudget* budget, std::string client)
      : budget_(budget), client_(std::move(client)) {}
  ~CallMemory() {
    if (budget_ != nullptr && bytes_ > 0) budget_->Release(client_, bytes_);
  }
  CallMemory(const CallMemory&) = delete;
  CallMemory& operator=(const CallMemory&) = delete;

  absl::Status Reserve(uint64_t bytes, absl::string_view what) {
    if (budget_ == nullptr || bytes == 0) return absl::OkStatus();
    absl::Status s = budget_->Reserve(client_, bytes, what);
    if (s.ok()) bytes_ += bytes;
    return s;
  }
  uint64_t bytes() const { return bytes_; }
  const std::string& client() const { return client_; }

 private:
  CallMemoryBudget* const budget_;
  const std::string client_;
  uint64_t bytes_ = 0;
};

}  // namespace attnd::server::engine
