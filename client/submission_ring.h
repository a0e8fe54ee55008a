// A shared-memory submission ring (docs/SERVICE.md "Submission rings"): runs this client's
// prepared calls stream-ordered without an RPC per call. OpenRing (one RPC) sets it up in a
// HostRegion of the client's; Submit then only writes a 64-byte slot and the ring's head word
// (no syscall, no allocation), and the daemon's poller queues the call like RunPrepared with
// signals. The ready and done words of every entry lie in one HostRegion named at Open.
//   ATTND_ASSIGN_OR_RETURN(auto ring, SubmissionRing::Open(client, *region, 0, 256));
//   if (ring->Submit(call, kReadyAt, 1, kDoneAt, 1) == absl::StatusCode::kResourceExhausted) ...
//   WaitSignal(done_word, 1, absl::Seconds(5));  // the failure bit as for RunPrepared
//   ring->Call(call, SubmissionRing::kNoReady, 0, kDoneAt, 2, absl::Seconds(5),
//   absl::Milliseconds(1));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/device_region.h"
#include "client/host_region.h"
#include "client/session.h"

namespace attnd::client {

// The ring's bytes from its offset, little-endian (docs/SERVICE.md "Submission rings").
namespace ring_layout {
inline constexpr uint64_t kHead = 0;     // u64, written by the client
inline constexpr uint64_t kTail = 64;    // u64, written by the daemon
inline constexpr uint64_t kState = 128;  // u64, written by the daemon: 0 open, 1 closed, 2 errored
inline constexpr uint64_t kBeat = 136;   // u64, written by the daemon's poller at least every ms
inline constexpr uint64_t kOpen = 0;
inline constexpr uint64_t kErrored = 2;
// Call: an open ring whose beat word has moved once and then stands still this long means the
// daemon is gone (UNAVAILABLE).
inline constexpr absl::Duration kDaemonSilence = absl::Seconds(3);
inline constexpr uint64_t kHeaderBytes = 192;
inline constexpr uint64_t kEntryBytes = 64;
inline constexpr uint64_t kFlagReady = 1;
inline constexpr uint32_t kMaxEntries = 4096;
inline constexpr uint64_t Bytes(uint32_t entries) {
  return kHeaderBytes + kEntryBytes * static_cast<uint64_t>(entries);
}
}  // namespace ring_layout

// Submit is for one thread at a time (the ring has one producer); the daemon is the consumer.
class SubmissionRing {
 public:
  // Submit's ready_offset that means "no ready word: run once the earlier calls are over".
  static constexpr uint64_t kNoReady = ~0ull;

  // Opens a ring of `entries` slots (a power of two, 1..4096) at `offset` (a multiple of 64) in
  // `region`, both registered through `client`; the entries' signal words lie in `signals`
  // (null: `region`). `lease_id` ties the ring to an open Session lease. The ring's
  // ring_layout::Bytes(entries) bytes must not be used for anything else while it is open.
  static absl::StatusOr<std::unique_ptr<SubmissionRing>> Open(
      Client* client, const HostRegion& region, uint64_t offset, uint32_t entries,
      const HostRegion* signals = nullptr, const std::string& lease_id = "",
      absl::Duration timeout = kDefaultAdminTimeout);
  // The same as a message of `session` (which must outlive the ring): the ring belongs to the
  // Session's lease and its calls run on the Session's ordered queue (cancelled with it).
  static absl::StatusOr<std::unique_ptr<SubmissionRing>> Open(
      Session* session, const HostRegion& region, uint64_t offset, uint32_t entries,
      const HostRegion* signals = nullptr, absl::Duration timeout = kDefaultAdminTimeout);
  // Both forms with the entries' signal words in a device region (a daemon that waits on device
  // words, docs/SERVICE.md "Submission rings"): the caller's stream writes the ready words and
  // waits for the done words (stream_ordered.h). Submit only: Call refuses with
  // FAILED_PRECONDITION, as this process cannot poll device memory.
  static absl::StatusOr<std::unique_ptr<SubmissionRing>> Open(
      Client* client, const HostRegion& region, uint64_t offset, uint32_t entries,
      const DeviceRegion& signals, const std::string& lease_id = "",
      absl::Duration timeout = kDefaultAdminTimeout);
  static absl::StatusOr<std::unique_ptr<SubmissionRing>> Open(
      Session* session, const HostRegion& region, uint64_t offset, uint32_t entries,
      const DeviceRegion& signals, absl::Duration timeout = kDefaultAdminTimeout);
  ~SubmissionRing();  // Close(), errors ignored
  SubmissionRing(const SubmissionRing&) = delete;
  SubmissionRing& operator=(const SubmissionRing&) = delete;

  // Queues prepared call `call_id`: it runs once the u64 at `ready_offset` of the signal region
  // is >= ready_value (kNoReady: no wait) and the earlier calls of the caller's ordered queue are
  // over; the daemon then stores done_value at `done_offset` (| 2^62 when it failed or never
  // ran, also for an entry it refused, e.g. one with a value >= 2^62). kOk; kResourceExhausted when
  // the ring is full (the daemon has not taken older entries yet: retry); kFailedPrecondition when
  // the ring is closed or errored. No syscall, no allocation.
  absl::StatusCode Submit(uint64_t call_id, uint64_t ready_offset, uint64_t ready_value,
                          uint64_t done_offset, uint64_t done_value);

  // A blocking call through the ring (docs/SERVICE.md "Blocking calls through a ring"): Submit
  // (retried while the ring is full), then waits until the done word at `done_offset` of the
  // signal region reaches done_value, polling it without sleeping for `spin` first (one core
  // busy meanwhile), then every ~20 µs. The word's value; ABORTED when it carries the failure
  // bit, DEADLINE_EXCEEDED after `timeout` (the call may still run later), FAILED_PRECONDITION
  // when the ring is closed or errored before the entry was taken, UNAVAILABLE when the daemon
  // stopped polling the open ring (its beat word still for ring_layout::kDaemonSilence: it
  // exited or hangs), INVALID_ARGUMENT for a done
  // word outside the signal region or not 8-byte aligned, FAILED_PRECONDITION for a ring whose
  // signal words are in a device region. The done word must be this caller's own, below
  // done_value when called (values count up). No RPC, no allocation.
  absl::StatusOr<uint64_t> Call(uint64_t call_id, uint64_t ready_offset, uint64_t ready_value,
                                uint64_t done_offset, uint64_t done_value, absl::Duration timeout,
                                absl::Duration spin = absl::ZeroDuration());

  // CloseRing (or the Session's close_ring); idempotent, and OK when the daemon closed the ring
  // already (its NOT_FOUND). Entries already taken still run.
  absl::Status Close();

  uint64_t ring_id() const { return ring_id_; }
  uint32_t entries() const { return entries_; }
  uint64_t submitted() const { return head_; }
  uint64_t taken() const;  // the daemon's tail
  uint64_t state() const;  // ring_layout's state word
  uint64_t beat() const;   // ring_layout's beat word
  // How long the daemon has not polled this open ring, once that is past
  // ring_layout::kDaemonSilence (it exited or hangs); nullopt otherwise. The beat seen last and
  // when it moved are the ring's, kept across calls: after the daemon died, the first look that
  // comes one silence after the last move reports it. A daemon that never beats (an older one)
  // leaves the word at 0 and is never reported.
  std::optional<absl::Duration> Silence(absl::Time now);

 private:
  SubmissionRing() = default;
  struct Signals;
  static absl::StatusOr<std::unique_ptr<SubmissionRing>> OpenOn(
      Client* client, Session* session, const HostRegion& region, uint64_t offset, uint32_t entries,
      const Signals& signals, const std::string& lease_id, absl::Duration timeout);
  Client* client_ = nullptr;
  Session* session_ = nullptr;  // set: opened on this Session
  char* base_ = nullptr;
  char* signals_ = nullptr;  // the signal region's first byte; null: a device region
  uint64_t signals_bytes_ = 0;
  std::string signal_region_;
  uint64_t ring_id_ = 0;
  uint32_t entries_ = 0;
  uint64_t head_ = 0;
  bool open_ = false;
  // Silence(): the beat word as last seen, and when it last moved.
  uint64_t beat_seen_ = 0;
  absl::Time beat_moved_ = absl::InfinitePast();
  absl::Duration timeout_;
};

namespace internal {

// A host region of `bytes` bytes of this client's (under `session`'s lease when set) with a ring
// of `entries` slots at its start whose signal words lie in the same region (opened on the
// Session when set): what RingCaller and OrderedCaller keep.
absl::Status OpenOwnRing(Client* client, Session* session, uint64_t bytes, uint32_t entries,
                         absl::Duration timeout, std::unique_ptr<HostRegion>* region,
                         std::unique_ptr<SubmissionRing>* ring);

}  // namespace internal

}  // namespace attnd::client
