// Submission rings (docs/SERVICE.md "Submission rings"): a ring of fixed-size slots in a host
// region of the caller's through which it runs prepared calls stream-ordered without an RPC per
// call. One poller thread serves every ring: it reads a ring's `head` word, copies each new slot
// out once (the client may rewrite it at any time: only the copy is validated and used), hands
// the entry to the ring's Submitter (the RunPrepared path) and advances `tail`. No gRPC here.
//   SubmissionRingTable rings(&registry, &metrics, {});
//   ATTND_ASSIGN_OR_RETURN(uint64_t id, rings.Open(std::move(spec)));  // polled from now on
//   rings.Close(owner, id);  // polling stopped and the ring's pins released on return
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attnd/v1/attention.pb.h"
#include "server/metrics/metrics.h"
#include "server/regions/registry.h"

namespace attnd::server::ops {

// The ring's bytes, little-endian, from the ring's offset in its region (docs/SERVICE.md
// "Submission rings" has the same table).
namespace ring_layout {
inline constexpr uint64_t kHead = 0;     // u64, client: entries submitted so far
inline constexpr uint64_t kTail = 64;    // u64, daemon: entries taken so far
inline constexpr uint64_t kState = 128;  // u64, daemon: kOpen, kClosed or kErrored
// u64, daemon: advanced by the poller at least every kBeatPeriod while it polls the ring (0 until
// its first look): a waiting client that sees it stand still for seconds knows the daemon is gone.
inline constexpr uint64_t kBeat = 136;
inline constexpr uint64_t kHeaderBytes = 192;
inline constexpr uint64_t kEntryBytes = 64;
// Within an entry:
inline constexpr uint64_t kSeq = 0;  // u64: the entry's number + 1, written last by the client
inline constexpr uint64_t kCallId = 8;
inline constexpr uint64_t kReadyOffset = 16;  // in the signal region
inline constexpr uint64_t kReadyValue = 24;
inline constexpr uint64_t kDoneOffset = 32;  // in the signal region
inline constexpr uint64_t kDoneValue = 40;
inline constexpr uint64_t kFlags = 48;  // kFlagReady; other bits must be 0
inline constexpr uint64_t kFlagReady = 1;
inline constexpr uint64_t kOpen = 0;
inline constexpr uint64_t kClosed = 1;
inline constexpr uint64_t kErrored = 2;
inline constexpr uint32_t kMaxEntries = 4096;
inline constexpr absl::Duration kBeatPeriod = absl::Milliseconds(1);
inline constexpr uint64_t Bytes(uint32_t entries) {
  return kHeaderBytes + kEntryBytes * static_cast<uint64_t>(entries);
}
}  // namespace ring_layout

class SubmissionRingTable {
 public:
  struct Options {
    size_t max_per_owner = 64;  // RESOURCE_EXHAUSTED beyond it
    // The poller's interval after progress, doubling to 500 µs while no ring has new entries.
    absl::Duration poll = absl::Microseconds(50);
    // After a sweep that took an entry the poller sweeps again without sleeping for this long
    // (docs/LATENCY.md "Blocking calls through a ring"): a caller that submits its next call
    // within it is served without the poll interval's wait. Zero: never.
    absl::Duration spin = absl::ZeroDuration();
    // The least time between two log lines about one ring's bad entries.
    absl::Duration log_interval = absl::Seconds(10);
    // CUDA backend: the signal region may be a device region, its words then served by the
    // device path (docs/SERVICE.md "Stream-ordered calls on a CUDA device").
    bool device_signals = false;
  };
  // Queues one entry's prepared call `call_id` stream-ordered with its signals (ready may be
  // null), exactly as RunPrepared would; an error means nothing was queued. Runs on the poller
  // thread; must not call back into the table.
  using Submitter = std::function<absl::Status(uint64_t call_id, const v1::Signal* ready,
                                               const v1::Signal& done)>;

  struct Spec {
    std::string owner;
    std::string lease;          // empty: closed only by Close or an unregistration
    std::string region;         // a host region of `owner`'s
    uint64_t offset = 0;        // a multiple of 64, and 64-byte aligned in memory
    uint32_t entries = 0;       // a power of two, 1..kMaxEntries
    std::string signal_region;  // empty: `region`
    Submitter submit;
    std::string label;  // for logs ("unary uid:1000 ipv4:…", "session lease-3")
  };

  // `registry` must outlive the table; `metrics` may be null. Starts the poller thread.
  SubmissionRingTable(const regions::RegionRegistry* registry, metrics::Metrics* metrics,
                      Options options);
  // Closes every ring (their state word says closed) and stops the poller.
  ~SubmissionRingTable();
  SubmissionRingTable(const SubmissionRingTable&) = delete;
  SubmissionRingTable& operator=(const SubmissionRingTable&) = delete;

  // Validates `spec` (regions of the owner's, host, not truncated; the ring inside its region and
  // aligned; entries a power of two up to kMaxEntries), pins both regions, resets the ring's
  // header (head, tail and state 0) and starts polling it. INVALID_ARGUMENT / NOT_FOUND /
  // FAILED_PRECONDITION / RESOURCE_EXHAUSTED (max_per_owner).
  absl::StatusOr<uint64_t> Open(Spec spec) ABSL_LOCKS_EXCLUDED(mu_);
  // Closes `owner`'s ring `id` (NOT_FOUND for an unknown or foreign id). On return the poller no
  // longer reads it and its pins are released (on the poller thread itself: at the end of its
  // sweep). Entries already queued still run.
  absl::Status Close(const std::string& owner, uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Closes every ring of `lease` / every ring of `owner` whose ring or signal region is one of
  // `regions` (unregistered). DropLease returns (outside the poller thread) once every ring
  // closed so far is shut down, those the poller closed itself included (an errored ring, or one
  // closed inside a sweep), so the lease's regions hold no ring's pin when it closes.
  void DropLease(const std::string& lease) ABSL_LOCKS_EXCLUDED(mu_);
  void DropRegions(const std::string& owner, const std::vector<std::string>& regions)
      ABSL_LOCKS_EXCLUDED(mu_);
  int64_t open() const ABSL_LOCKS_EXCLUDED(mu_);
  // Why `owner`'s ring `id` stopped (for tests and logs): empty while it is open or unknown.
  std::string closed_reason(const std::string& owner, uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Ring;
  void PollerLoop();
  // Takes the ring's new entries (and advances its beat word, `now` the sweep's time); false
  // when the ring errored (then closed by the caller).
  bool Poll(Ring& ring, absl::Time now);
  void Reject(Ring& ring, uint64_t seq, const char* result, const uint64_t* entry,
              const absl::Status& why);
  // Removes the rings matching `match` from the table and shuts them down.
  void CloseMatching(const std::function<bool(const Ring&)>& match, const std::string& why,
                     uint64_t state) ABSL_LOCKS_EXCLUDED(mu_);
  void Shutdown(const std::vector<std::shared_ptr<Ring>>& rings) ABSL_LOCKS_EXCLUDED(sweep_mu_);
  void ReportLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string ClosedReasonLocked(const std::string& owner, uint64_t id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const regions::RegionRegistry* const registry_;
  metrics::Metrics* const metrics_;
  const Options options_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  std::map<uint64_t, std::shared_ptr<Ring>> rings_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> per_owner_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::pair<std::string, std::string>> closed_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Held by the poller for a whole sweep: a ring is shut down (pins released) only outside one.
  // Never acquired while holding mu_ (the poller may take mu_ while holding it).
  absl::Mutex sweep_mu_;
  // Rings closed from the poller thread itself, shut down at the end of its sweep.
  std::vector<std::shared_ptr<Ring>> deferred_ ABSL_GUARDED_BY(mu_);
  // Rings out of rings_ (closed, or the table ending) whose shutdown has not finished: every
  // ring is counted once as it leaves rings_ and uncounted by the Shutdown that shuts it
  // (DropLease waits for none).
  int64_t unshut_ ABSL_GUARDED_BY(mu_) = 0;
  // Open and CloseMatching calls waiting for the locks: a spinning poller sleeps (one poll
  // interval) instead of taking the locks straight back.
  std::atomic<int> lockers_{0};
  std::thread poller_;
};

}  // namespace attnd::server::ops
