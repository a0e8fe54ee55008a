// Stream-ordered calls with the bookkeeping done (docs/SERVICE.md "Ordered callers"): Call(params)
// names the call by the request it encodes to (each tensor's region, offset, shape, strides and
// dtype; the scalars), keeps one prepared call per such request (PrepareCall on a miss, a bounded
// LRU), and submits it through a ring of its own: with StreamHooks the caller's GPU stream writes
// the ready word after what it has queued and waits for the call's done word before what it
// queues next, so the thread neither waits nor makes an RPC once the request is prepared.
//   ATTND_ASSIGN_OR_RETURN(auto caller, OrderedCaller::Open(client.get()));
//   StreamHooks hooks{write_value64_on_my_stream, wait_value64_on_my_stream};  // by host address
//   ATTND_ASSIGN_OR_RETURN(uint64_t n, caller->Call(params, &hooks));  // every tensor in a region
//   ...
//   ATTND_RETURN_IF_ERROR(caller->Wait());  // optional: the host waits for every call so far
// One thread at a time. The caller's buffers must outlive the calls that use them (Wait, or a
// consumer on the stream behind the done wait).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/host_region.h"
#include "client/session.h"
#include "client/submission_ring.h"

namespace attnd::client {

struct OrderedCallerOptions {
  uint32_t entries = 256;  // ring slots: a power of two, 1..4096
  // Calls that may be pending at once (a done word each, 1..4096): Call waits on the host for
  // the oldest before it reuses its word.
  uint32_t depth = 512;
  uint32_t max_prepared = 1024;  // prepared calls kept (1..4096, the daemon's bound per owner)
  // How long host waits poll without sleeping before they sleep ~20 µs between looks.
  absl::Duration spin = absl::Microseconds(200);
  // Set: the ring runs on this Session's ordered queue, and the region, the ring and the
  // prepared calls go with its lease (the Session must outlive the caller).
  Session* session = nullptr;
  // Set-up, PrepareCall and close RPCs; host waits (a full ring, a reused done word, Close).
  absl::Duration timeout = kDefaultAdminTimeout;
};

// The caller's stream operations on a signal word, given by its address in this process (the
// caller's region, region(), registered with its GPU runtime: e.g. cuStreamWriteValue64 /
// cuStreamWaitValue64 with CU_STREAM_WAIT_VALUE_GEQ at the word's device address).
struct StreamHooks {
  // Enqueue *word = value after the work queued so far.
  std::function<absl::Status(uint64_t* word, uint64_t value)> write;
  // Enqueue a wait until *word >= value (cyclically) before the work queued next.
  std::function<absl::Status(uint64_t* word, uint64_t value)> wait;
};

class OrderedCaller {
 public:
  static constexpr uint64_t kLatest = 0;  // Wait: the latest call

  // Creates the region (the ring, a ready word, `depth` done words) and opens the ring in it.
  static absl::StatusOr<std::unique_ptr<OrderedCaller>> Open(Client* client,
                                                             OrderedCallerOptions options = {});
  ~OrderedCaller();  // Close(), errors ignored
  OrderedCaller(const OrderedCaller&) = delete;
  OrderedCaller& operator=(const OrderedCaller&) = delete;

  // Runs op call `p` stream-ordered; returns its number n (Wait(n) waits for it). With `stream`
  // its write hook stores the ready word (value n) and the entry waits for it; its wait hook
  // then waits for the call's done word. Without, the call runs once the daemon takes it (its
  // inputs must be in place). ABORTED when an earlier call failed (reported once; this call is
  // then not made), the request's encoding errors, PrepareCall's errors for a new request
  // (INVALID_ARGUMENT for a tensor outside every region), FAILED_PRECONDITION when closed or
  // the ring was closed, DEADLINE_EXCEEDED when the ring or the done words stayed full for
  // `timeout`, a hook's error (a wait hook's error leaves the call submitted).
  template <class Params>
  absl::StatusOr<uint64_t> Call(const Params& p, const StreamHooks* stream = nullptr);

  // Waits on the host until call `n` (kLatest: the latest) and every call before it are over,
  // then reports the first failure seen (ABORTED). DEADLINE_EXCEEDED after `timeout`;
  // UNAVAILABLE when the daemon stopped polling the ring, FAILED_PRECONDITION when the ring was
  // closed with entries not taken: the calls that cannot end then get the failure bit from
  // here, which releases a stream waiting on them.
  absl::Status Wait(uint64_t n = kLatest, absl::Duration timeout = absl::InfiniteDuration());
  // The first failure among the calls seen over so far (no waiting).
  absl::Status Check();
  // Gives up on the pending calls: stores the failure bit into their done words (a stream
  // waiting on one goes on; their outputs are undefined), so they are reported as failed. For
  // a daemon that will not end them (it hangs); Wait does it itself when the daemon is gone.
  void Abort() { AbortPending(0); }
  // Waits for the pending calls (as Wait, for the options' timeout), closes the ring, releases
  // the prepared calls, unregisters the region; a failure not reported yet is returned.
  // Idempotent. A caller whose hooks used a GPU stream must have that stream past its last wait
  // before the region goes (synchronise it first).
  absl::Status Close();

  const HostRegion& region() const { return *region_; }
  uint64_t calls() const { return calls_; }
  uint64_t retired() const { return retired_; }  // every call <= this is over
  uint64_t prepares() const { return prepares_; }
  size_t prepared() const { return prepared_.size(); }
  size_t pending() {
    Poll();
    return pending_.size();
  }
  // The ids of the prepared calls kept (diagnostics, tests).
  std::vector<uint64_t> prepared_ids() const {
    std::vector<uint64_t> ids;
    for (const auto& [key, prepared] : prepared_) ids.push_back(prepared.call_id);
    return ids;
  }

 private:
  struct Prepared {
    uint64_t call_id = 0;
    uint64_t last = 0;  // the latest call that ran it
    std::list<std::string>::iterator lru;
  };
  struct Pending {
    uint64_t n = 0;
    uint64_t call_id = 0;
    const std::string* op = nullptr;  // the request message's name (descriptor-owned)
  };

  OrderedCaller() = default;
  absl::StatusOr<uint64_t> Submit(const std::string& op, std::string key,
                                  const std::function<absl::StatusOr<uint64_t>()>& prepare,
                                  const StreamHooks* stream);
  void Poll();
  absl::Status TakeFailures();
  absl::Status WaitRetired(uint64_t n, absl::Duration timeout);
  absl::Status CheckRing(absl::Time now);
  // Stores the failure bit into the done words of the pending calls past the first `after`
  // ring entries. `reported`: the status the caller returns next reports them (the ring closed
  // under them, the daemon silent, a failed close), so they are not reported again as ABORTED.
  void AbortPending(uint64_t after, bool reported = false);
  void Release(uint64_t call_id);
  void ReleaseDropped(bool everything);
  uint64_t DoneOffset(uint64_t n) const;
  uint64_t* Word(uint64_t offset) const;

  Client* client_ = nullptr;
  OrderedCallerOptions options_;
  std::unique_ptr<HostRegion> region_;
  std::unique_ptr<SubmissionRing> ring_;
  uint64_t ready_offset_ = 0;  // then the done words, one per 64-byte line
  uint64_t calls_ = 0;
  uint64_t retired_ = 0;
  uint64_t prepares_ = 0;
  std::deque<Pending> pending_;
  absl::flat_hash_map<std::string, Prepared> prepared_;
  std::list<std::string> lru_;  // least recently used first
  std::vector<std::pair<uint64_t, const std::string*>> failures_;
  std::vector<std::pair<uint64_t, uint64_t>> dropped_;  // (call id, its last call) to release
};

}  // namespace attnd::client
