// attnctl's operator cases: random inputs of a named shape preset for one op, buffers for the
// daemon's outputs (heap or a host region), the same call run locally with the kernels' CPU
// implementation, and the comparison of the two.
//   ATTND_ASSIGN_OR_RETURN(auto c, MakeOpCase("sparse_mla", "decode", {}, seed));
//   ATTND_ASSIGN_OR_RETURN(auto call, c->NewRemoteCall(/*outputs=*/nullptr));
//   ATTND_ASSIGN_OR_RETURN(CallResult r, call->Run(caller));
//   ATTND_RETURN_IF_ERROR(c->RunLocal(&pool));
//   for (const Check& k : c->Compare(*call, r)) ...
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/attnctl/compare.h"
#include "client/client.h"
#include "client/host_region.h"
#include "client/session.h"
#include "kernels/common/precision.h"
#include "kernels/common/thread_pool.h"

namespace attnd::attnctl {

// Sends a call as a unary RPC, or on a Session when one is given.
struct Caller {
  client::Client* client = nullptr;
  client::Session* session = nullptr;
  client::CallOptions options;

  template <class Params>
  absl::StatusOr<client::CallResult> Call(const Params& p) const {
    return session != nullptr ? session->Call(p, options) : client->Call(p, options);
  }
};

// One set of remote output buffers and the call that fills them. Thread-compatible: one
// RemoteCall per concurrent caller.
class RemoteCall {
 public:
  virtual ~RemoteCall() = default;
  virtual absl::StatusOr<client::CallResult> Run(const Caller& caller) = 0;
  // Prepares this call on the daemon (every tensor in regions of `client`): its call id.
  virtual absl::StatusOr<uint64_t> Prepare(client::Client* client, const std::string& lease_id) = 0;
  // Fills the output buffers with NaN / 0x7f7f7f7f so an unwritten element fails the check.
  virtual void Poison() = 0;
};

class OpCase {
 public:
  virtual ~OpCase() = default;
  virtual const std::string& op() const = 0;
  virtual const std::string& shape() const = 0;  // "T=64 H=16 d_qk=512 S=8192 K=2048"
  // Region bytes the inputs, and one set of outputs, take (64-byte aligned tensors).
  virtual uint64_t InputBytes() const = 0;
  virtual uint64_t OutputBytes() const = 0;
  // Copies the inputs into `region` and uses those copies from now on (zero-copy calls).
  virtual absl::Status MoveInputsTo(client::HostRegion* region) = 0;
  // Fresh output buffers (poisoned): in `outputs` when given, else on the heap.
  virtual absl::StatusOr<std::unique_ptr<RemoteCall>> NewRemoteCall(
      client::HostRegion* outputs) = 0;
  // The precision the remote and the local call ask for (the attention ops, indexer_logits,
  // indexer_logits_paged); INVALID_ARGUMENT for an op without the option.
  virtual absl::Status SetPrecision(kernels::Precision precision) = 0;
  // The precision of the indexer step the remote and the local call ask for (dsa_attention);
  // INVALID_ARGUMENT for an op without the option.
  virtual absl::Status SetIndexPrecision(kernels::Precision precision) = 0;
  // Sets batch_invariant on the remote and the local call (sparse_mla, mla_decode,
  // dsa_attention); INVALID_ARGUMENT for an op without the option.
  virtual absl::Status SetBatchInvariant(bool batch_invariant) = 0;
  // Runs the op locally (kernels' CPU implementation) on the same inputs.
  virtual absl::Status RunLocal(kernels::ThreadPool* pool) = 0;
  // The remote outputs of `call` (after Run returned `result`) against the local ones.
  virtual std::vector<Check> Compare(const RemoteCall& call,
                                     const client::CallResult& result) const = 0;
};

// Named integer dimensions of a preset ("T" -> 64); --set overrides them.
using Dims = std::map<std::string, int64_t>;

struct PresetInfo {
  std::string name;
  std::string description;
  Dims dims;
};

// The op names attnctl knows (snake case, as in GetInfo: "sparse_mla", "dsa_attention").
const std::vector<std::string>& OpNames();
// Accepts the snake-case name, the RPC name ("SparseMla") or "dsa"; empty when unknown.
std::string CanonicalOpName(const std::string& name);
// The presets of an op, in listing order. Empty for an unknown op.
std::vector<PresetInfo> Presets(const std::string& op);

// Builds a case: the preset's dims, with `overrides` applied (unknown names are refused),
// inputs drawn from a generator seeded with `seed`. INVALID_ARGUMENT for an unknown op, preset
// or dim, or dims the op refuses (the op's Validate message).
absl::StatusOr<std::unique_ptr<OpCase>> MakeOpCase(const std::string& op, const std::string& preset,
                                                   const Dims& overrides, uint64_t seed);

}  // namespace attnd::attnctl
