// Prepared calls (docs/SERVICE.md "Stream-ordered calls and prepared calls"): op requests whose
// tensors all lie in regions, validated once by PrepareCall and kept under a call id that belongs
// to the caller's identity (like its regions: another owner cannot run or release it, and gets
// NOT_FOUND). A call goes with ReleaseCall, with the lease it was prepared under, or when a region
// it names is unregistered; a later RunPrepared of it answers NOT_FOUND saying why. No gRPC here.
//   PreparedCallTable table(&metrics, {});
//   ATTND_ASSIGN_OR_RETURN(uint64_t id, table.Add(std::move(entry)));
//   ATTND_ASSIGN_OR_RETURN(auto call, table.Find(owner, id));  // call->request, call->op
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/message.h"
#include "server/metrics/metrics.h"
#include "server/ops/op_handler.h"

namespace attnd::server::ops {

struct PreparedCallEntry {
  uint64_t id = 0;  // set by Add
  std::string owner;
  std::string lease;  // empty: not tied to a lease
  OpId op = OpId::kSparseMla;
  std::shared_ptr<const google::protobuf::Message> request;  // the op request, all in regions
  std::vector<std::string> regions;                          // the region names it uses
  // A tensor lies in a host region (so the CUDA device path is out): fixed for the call's life,
  // which ends when one of its regions goes.
  bool names_host_region = false;
};

class PreparedCallTable {
 public:
  struct Options {
    size_t max_per_owner = 4096;  // RESOURCE_EXHAUSTED beyond it
  };
  // `metrics` (may be null) gets the live count (attnd_prepared_calls).
  PreparedCallTable(metrics::Metrics* metrics, Options options);

  // Keeps `entry` under a fresh id (never 0, never reused).
  absl::StatusOr<uint64_t> Add(PreparedCallEntry entry) ABSL_LOCKS_EXCLUDED(mu_);
  // `owner`'s call `id`; NOT_FOUND (saying why when it was released) for an id that is not a
  // live call of `owner`'s.
  absl::StatusOr<std::shared_ptr<const PreparedCallEntry>> Find(const std::string& owner,
                                                                uint64_t id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Release(const std::string& owner, uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Releases every call of `lease` (the Session ended).
  void DropLease(const std::string& lease) ABSL_LOCKS_EXCLUDED(mu_);
  // Releases every call of `owner` that uses one of `regions` (they were unregistered).
  void DropRegions(const std::string& owner, const std::vector<std::string>& regions)
      ABSL_LOCKS_EXCLUDED(mu_);
  int64_t live() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void ReleaseLocked(std::map<uint64_t, std::shared_ptr<const PreparedCallEntry>>::iterator it,
                     std::string why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReportLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  metrics::Metrics* const metrics_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<const PreparedCallEntry>> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> per_owner_ ABSL_GUARDED_BY(mu_);
  // Why recently released calls went (owner, reason), for NOT_FOUND messages; bounded.
  std::map<uint64_t, std::pair<std::string, std::string>> released_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> released_order_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace attnd::server::ops
