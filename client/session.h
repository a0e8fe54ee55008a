// A Session: one bidirectional stream to attnd carrying a lease (regions registered with
// lease_id() are removed when the session ends, however it ends) and pipelined operator calls
// matched to their replies by request id. The low-latency path for many small calls.
//   ATTND_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Session::Open(client, {}));
//   ATTND_ASSIGN_OR_RETURN(Session::Pending a, s->Start(params_a));  // both in flight
//   ATTND_ASSIGN_OR_RETURN(Session::Pending b, s->Start(params_b));
//   ATTND_ASSIGN_OR_RETURN(CallResult ra, a.Wait());                 // params_a's outputs filled
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attnd/v1/attention.grpc.pb.h"
#include "client/client.h"
#include "client/op_codec.h"

namespace attnd::client {

struct SessionOptions {
  std::string client_name = "attnd-cpp-client";  // for the daemon's logs
  absl::Duration open_timeout = absl::Seconds(30);
  // Extra time Pending::Wait gives a call with a finite CallOptions::timeout before it gives up
  // on the reply (DEADLINE_EXCEEDED) and asks the daemon to cancel it.
  absl::Duration wait_slack = absl::Seconds(5);
  // How long Close() waits for outstanding replies and the daemon's final status before it
  // cancels the stream.
  absl::Duration close_timeout = absl::Seconds(60);
  // How long Pending::Wait polls for the reply on the calling thread before it sleeps. The
  // stream's reader thread receives every reply; a caller that sleeps is woken by it, which on
  // some hosts costs tens of µs per call (docs/BENCHMARKS.md). Polling keeps one core busy for
  // up to this long per wait; zero (the default) never polls.
  absl::Duration wait_spin = absl::ZeroDuration();
};

// Thread-safe: calls may be started and waited for from many threads.
class Session {
 public:
  class Pending;

  // Opens the stream and its lease. UNAVAILABLE when the daemon cannot be reached.
  static absl::StatusOr<std::unique_ptr<Session>> Open(Client* client,
                                                       const SessionOptions& options = {});
  ~Session();  // Close(), errors ignored
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& lease_id() const { return lease_id_; }

  // Sends a call; the params' buffers must stay valid until Wait() returns (outputs are copied
  // into them there). Encoding follows op_codec.h.
  template <class Params>
  absl::StatusOr<Pending> Start(const Params& p, const CallOptions& options = {})
      ABSL_LOCKS_EXCLUDED(mu_, write_mu_);
  // Start + Wait.
  template <class Params>
  absl::StatusOr<CallResult> Call(const Params& p, const CallOptions& options = {})
      ABSL_LOCKS_EXCLUDED(mu_, write_mu_);

  // Sends any Session message (its request_id is assigned here) and waits up to `timeout` for
  // its reply; a reply with a code is that status. For messages without a typed method
  // (open_ring, close_ring: client/submission_ring.h).
  absl::StatusOr<v1::SessionResponse> Exchange(v1::SessionRequest request, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_, write_mu_);

  // Asks the daemon to cancel a call that has not started yet (its reply then says CANCELLED).
  absl::Status Cancel(uint64_t request_id) ABSL_LOCKS_EXCLUDED(mu_, write_mu_);

  // Half-closes the stream, waits for every outstanding reply and the daemon's final status
  // (at most close_timeout, then the stream is cancelled). The lease (and its regions) ends.
  // Idempotent.
  absl::Status Close() ABSL_LOCKS_EXCLUDED(mu_, write_mu_);

  // A call in flight. Move-only; Wait() at most once.
  class Pending {
   public:
    Pending() = default;
    uint64_t request_id() const;
    // Blocks until the reply arrives (or the session ends); fills the params' outputs.
    absl::StatusOr<CallResult> Wait();

   private:
    friend class Session;
    struct Slot;
    Session* session_ = nullptr;
    std::shared_ptr<Slot> slot_;
    absl::Duration wait_limit_ = absl::InfiniteDuration();
    absl::Duration spin_ = absl::ZeroDuration();
    std::function<absl::Status(const v1::SessionResponse&, CallResult*)> apply_;
  };

 private:
  Session(Client* client, SessionOptions options);
  std::shared_ptr<Pending::Slot> AddSlot(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  void DropSlot(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Write(const v1::SessionRequest& request) ABSL_LOCKS_EXCLUDED(write_mu_);
  void ReadLoop() ABSL_LOCKS_EXCLUDED(mu_);

  Client* const client_;
  const SessionOptions options_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream_;
  std::thread reader_;
  std::string lease_id_;

  absl::Mutex write_mu_;  // one Write (or WritesDone) on stream_ at a time: gRPC's rule
  bool writes_done_ ABSL_GUARDED_BY(write_mu_) = false;

  absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Pending::Slot>> slots_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;       // the stream has finished
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);  // its final status
  bool closed_ = false;                           // Close() ran (owner thread)
};

}  // namespace attnd::client
