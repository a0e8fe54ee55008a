// Blocking calls through a submission ring of the caller's own (docs/SERVICE.md "Blocking calls
// through a ring"): Open sets up one host region holding a ring, a done and a ready word (two
// RPCs); Run
// then runs a prepared call and returns once it is over (its outputs in place), with no RPC per
// call. One thread at a time (the ring has one producer).
//   ATTND_ASSIGN_OR_RETURN(std::unique_ptr<RingCaller> caller, RingCaller::Open(client.get()));
//   ATTND_ASSIGN_OR_RETURN(uint64_t id, PrepareCall(client.get(), params));  // all in regions
//   ATTND_RETURN_IF_ERROR(caller->Run(id));  // as RunPrepared(client, id), without the RPC
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/host_region.h"
#include "client/session.h"
#include "client/submission_ring.h"

namespace attnd::client {

struct RingCallerOptions {
  uint32_t entries = 16;  // ring slots: a power of two, 1..4096
  // How long Run polls the done word before it sleeps between looks (~20 µs each): polling sees
  // the end of a call within about a microsecond for a core kept busy meanwhile.
  absl::Duration spin = absl::Microseconds(500);
  // Set: the ring runs on this Session's ordered queue and the region and ring go with its
  // lease (the Session must outlive the caller). Null: the connection's unary ordered queue.
  Session* session = nullptr;
  absl::Duration timeout = kDefaultAdminTimeout;  // of the set-up and close RPCs
};

class RingCaller {
 public:
  // Creates the region (ring_layout::Bytes(entries) + 128 bytes), opens the ring in it.
  static absl::StatusOr<std::unique_ptr<RingCaller>> Open(Client* client,
                                                          RingCallerOptions options = {});
  ~RingCaller();  // Close(), errors ignored
  RingCaller(const RingCaller&) = delete;
  RingCaller& operator=(const RingCaller&) = delete;

  // Runs prepared call `call_id` (a call of this client's identity) once the caller's earlier
  // calls on the same ordered queue are over, and waits for it: OK when its outputs are in
  // place. ABORTED when it failed (why: the daemon's log and metrics; a Session also gets
  // call_failed), DEADLINE_EXCEEDED after `timeout` (the call may still run: the next Run waits
  // behind it), FAILED_PRECONDITION when the ring was closed (e.g. its lease ended).
  absl::Status Run(uint64_t call_id, absl::Duration timeout = absl::InfiniteDuration());

  // As Run, but the call also waits for the caller's ready word: `enqueue_ready(word, value)`
  // must arrange for *word = value once the call's inputs are complete (e.g. a
  // cuStreamWriteValue64 on the producing stream at the word's device address, the region
  // registered with the GPU runtime through region()), so the thread never synchronises the
  // device; an error from it is returned and nothing is submitted.
  absl::Status RunAfter(
      uint64_t call_id,
      const std::function<absl::Status(uint64_t* word, uint64_t value)>& enqueue_ready,
      absl::Duration timeout = absl::InfiniteDuration());

  // The caller's region (the ring, the done word, the ready word): for a GPU runtime
  // registration of its pages.
  const HostRegion& region() const { return *region_; }

  // Closes the ring, then unregisters the region; idempotent.
  absl::Status Close();

  uint64_t calls() const { return value_; }  // Runs submitted so far

 private:
  RingCaller() = default;
  std::unique_ptr<HostRegion> region_;
  std::unique_ptr<SubmissionRing> ring_;
  uint64_t done_offset_ = 0;  // the done word, then the ready word 64 bytes on
  uint64_t value_ = 0;        // the done word's value of the latest Run
  absl::Duration spin_;
};

}  // namespace attnd::client
