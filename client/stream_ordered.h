// Stream-ordered calls and prepared calls from the C++ client (docs/SERVICE.md "Stream-ordered
// calls and prepared calls"): an op call with a `ready` and/or `done` Signal is answered at once
// ("enqueued"); the daemon runs it once the u64 word at `ready` is >= its value and stores `done`
// (value, or value | kSignalFailureBit when the call failed or never ran). On the CPU daemon the
// words are 8-byte aligned words of a HostRegion of the caller's.
//   uint64_t* in = ...; uint64_t* out = ...;        // two words inside a HostRegion "sig"
//   ATTND_ASSIGN_OR_RETURN(uint64_t id, Enqueue(client, params, Signal{"sig", 0, 1},
//                                               Signal{"sig", 8, 1}));
//   StoreSignal(in, 1);                              // inputs ready
//   ATTND_RETURN_IF_ERROR(WaitSignal(out, 1, absl::Seconds(5)).status());
//   ATTND_ASSIGN_OR_RETURN(uint64_t call, PrepareCall(client, params));  // all in regions
//   ATTND_ASSIGN_OR_RETURN(v1::CallStats s, RunPrepared(client, call));  // blocking
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnd/v1/attention.pb.h"
#include "client/client.h"
#include "client/op_codec.h"
#include "google/protobuf/descriptor.h"

namespace attnd::client {

// Set in a `done` word when its call failed or never ran: done == value | kSignalFailureBit.
// Bit 62, so that a GPU stream waiting for done >= value (a cyclic compare) also ends on a
// failed call's word (docs/SERVICE.md "Failure bit"). Signal values must be below it: the daemon
// refuses a ready or done value >= 2^62 (INVALID_ARGUMENT).
inline constexpr uint64_t kSignalFailureBit = 1ull << 62;

// Signal is in op_codec.h: CallOptions::ready / done make any Client or Session call
// stream-ordered (Client::SparseMla(p, {.ready = ..., .done = ...})); Enqueue below is the same
// for the unary RPC, answering the daemon's request id.
v1::Signal ToProto(const Signal& s);

// Queues a stream-ordered op call (at least one signal; outputs placed in regions, op_codec.h);
// returns the daemon's request id once it is enqueued. options.timeout bounds the wait for
// `ready` as well.
template <class Params>
absl::StatusOr<uint64_t> Enqueue(Client* client, const Params& p,
                                 const std::optional<Signal>& ready,
                                 const std::optional<Signal>& done,
                                 const CallOptions& options = {});

// Prepares an op call whose tensors all lie in regions of this client; returns its call id.
// `lease_id` (optional) ties it to an open Session lease.
template <class Params>
absl::StatusOr<uint64_t> PrepareCall(Client* client, const Params& p,
                                     const std::string& lease_id = "",
                                     absl::Duration timeout = kDefaultAdminTimeout);

// Runs a prepared call: blocking without signals (its CallStats), else enqueued (CallStats with
// enqueued and request_id only).
absl::StatusOr<v1::CallStats> RunPrepared(Client* client, uint64_t call_id,
                                          const std::optional<Signal>& ready = std::nullopt,
                                          const std::optional<Signal>& done = std::nullopt,
                                          absl::Duration timeout = absl::InfiniteDuration());
absl::Status ReleaseCall(Client* client, uint64_t call_id,
                         absl::Duration timeout = kDefaultAdminTimeout);

// The caller's side of a signal word (8-byte aligned, in shared memory the daemon maps).
uint64_t LoadSignal(const uint64_t* word);     // atomic acquire load
void StoreSignal(uint64_t* word, uint64_t v);  // atomic release store
// Waits until *word's value (the failure bit aside) >= value: the word. ABORTED when it then
// carries the failure bit (an earlier call's failure does not end the wait), DEADLINE_EXCEEDED
// after `timeout`. docs/SERVICE.md "Failure bit". It polls the word without sleeping for `spin`
// (one core busy; a done word comes within a microsecond or so of the daemon's store), then
// sleeps ~20 µs between looks.
absl::StatusOr<uint64_t> WaitSignal(const uint64_t* word, uint64_t value, absl::Duration timeout,
                                    absl::Duration spin = absl::ZeroDuration());

namespace internal {

// The PrepareCallRequest field that holds `Request` (its oneof member of that message type).
template <class Request>
Request* PreparedField(v1::PrepareCallRequest* r) {
  const google::protobuf::Descriptor* d = v1::PrepareCallRequest::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    if (d->field(i)->message_type() == Request::descriptor()) {
      return static_cast<Request*>(r->GetReflection()->MutableMessage(r, d->field(i)));
    }
  }
  return nullptr;
}

// The PrepareCall RPC of a request built already: its call id.
absl::StatusOr<uint64_t> PrepareCallRpc(Client* client, const v1::PrepareCallRequest& request,
                                        absl::Duration timeout);
// WaitSignal that also ends with `check`'s status once it is not OK (asked between sleeps).
absl::StatusOr<uint64_t> WaitSignalUnless(const uint64_t* word, uint64_t value,
                                          absl::Duration timeout, absl::Duration spin,
                                          const std::function<absl::Status()>& check);
}  // namespace internal

}  // namespace attnd::client
