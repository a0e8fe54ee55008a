// Encoding an operator call (a kernels Params struct) into its request message and applying the
// reply back, the same way for unary RPCs and Session calls. The rules, per tensor of Params:
//   input present:   a RegionSlice when its span lies in a registered region, else inline bytes;
//   output present with a host buffer in a region: placed there (written in place, zero copy);
//   output present with another host buffer: returned inline and copied into that buffer;
//   output present with a null data pointer: returned inline into CallResult::returned;
//   output absent:   left to the server (required outputs come back in CallResult::returned,
//                    optional ones such as top-k values are not computed).
// So client.SparseMla(p) leaves p's outputs as kernels::sparse_mla::Run(p, ctx) would.
//   ATTND_RETURN_IF_ERROR(BuildRequest(p, &table, /*inline_only=*/false, &request));
//   ATTND_RETURN_IF_ERROR(ApplyReply(p, response, &result));
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/op_traits.h"
#include "client/region_table.h"
#include "client/tensor_codec.h"
#include "google/protobuf/message.h"

namespace attnd::client {

// A signal word of a stream-ordered call (client/stream_ordered.h): the u64 at `offset` bytes
// into registered region `region`, and this call's value.
struct Signal {
  std::string region;
  uint64_t offset = 0;
  uint64_t value = 0;
};

struct CallOptions {
  absl::Duration timeout = absl::InfiniteDuration();  // per call (the RPC or Session deadline)
  bool inline_only = false;  // send every tensor inline even when it lies in a region
  uint64_t request_id = 0;   // unary: sent as x-request-id metadata (the server's log id)
  // Either or both: a stream-ordered call (docs/SERVICE.md "Stream-ordered calls and prepared
  // calls"). The reply means "enqueued" (CallResult::stats.enqueued(), outputs not yet written):
  // the daemon runs the op once `ready` is reached and then stores `done`. Outputs must lie in
  // regions.
  std::optional<Signal> ready;
  std::optional<Signal> done;
};

// Sets the request's ready/done fields from `options`.
template <class Request>
void SetSignals(const CallOptions& options, Request* request) {
  for (auto [signal, field] : {std::pair{&options.ready, request->mutable_ready()},
                               std::pair{&options.done, request->mutable_done()}}) {
    if (!signal->has_value()) continue;
    field->mutable_slice()->set_region((*signal)->region);
    field->mutable_slice()->set_offset((*signal)->offset);
    field->set_value((*signal)->value);
  }
  if (!options.ready) request->clear_ready();
  if (!options.done) request->clear_done();
}

struct CallResult {
  v1::CallStats stats;            // the server's figures (queue, compute, bytes, FLOPs, ...)
  double round_trip_seconds = 0;  // client-measured: request sent -> reply received
  std::map<std::string, HostArray> returned;  // inline outputs params had no buffer for

  // The returned output `name`, or null.
  const HostArray* Returned(absl::string_view name) const {
    auto it = returned.find(std::string(name));
    return it == returned.end() ? nullptr : &it->second;
  }
};

// One tensor field of a request/response message, by name (the rules above). `table` may be
// null (everything inline).
absl::Status EncodeTensorField(const char* name, const kernels::Tensor& t, kernels::Role role,
                               const RegionTable* table, bool inline_only,
                               google::protobuf::Message* request);
absl::Status ApplyTensorField(const char* name, const kernels::Tensor& t, kernels::Role role,
                              const google::protobuf::Message& response, CallResult* result);

template <class Params>
absl::Status BuildRequest(const Params& p, const RegionTable* table, bool inline_only,
                          typename OpTraits<Params>::Request* request) {
  OpTraits<Params>::SetScalars(p, request);
  absl::Status st;
  p.ForEachTensor([&](const char* name, const kernels::Tensor& t, kernels::Role role) {
    if (st.ok()) st = EncodeTensorField(name, t, role, table, inline_only, request);
  });
  return st;
}

template <class Params>
absl::Status ApplyReply(const Params& p, const typename OpTraits<Params>::Response& response,
                        CallResult* result) {
  result->stats = response.stats();
  if (response.stats().enqueued()) return absl::OkStatus();  // stream-ordered: nothing written yet
  absl::Status st;
  p.ForEachTensor([&](const char* name, const kernels::Tensor& t, kernels::Role role) {
    if (st.ok() && role == kernels::Role::kOutput) {
      st = ApplyTensorField(name, t, role, response, result);
    }
  });
  return st;
}

}  // namespace attnd::client
