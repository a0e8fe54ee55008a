// The generic glue between an operator (kernels/<op>: Params with ForEachTensor, Validate, Count,
// Run) and its proto messages. Every tensor of an op's Params is resolved from the request field
// of the same name (by protobuf reflection), so an op's own glue is a small traits struct
// (server/ops/<op>_op.cc): its scalar options, the shapes of its outputs when the request leaves
// them out, and its kernel entry points.
//   const OpHandler* h = table.Find(OpId::kSparseMla);
//   ATTND_ASSIGN_OR_RETURN(auto call, h->Prepare(request, &response, options));
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "kernels/common/registry.h"
#include "server/engine/backend.h"
#include "server/ops/tensors.h"

namespace attnd::server::ops {

enum class OpId {
  kIndexerLogits = 0,
  kIndexerLogitsPaged,
  kTopK,
  kSparseMla,
  kMlaDecode,
  kMlaPrefill,
  kDsaAttention,
};
inline constexpr int kNumOps = 7;
const char* OpName(OpId id);  // "indexer_logits", ...: the `op` metrics label
const char* OpRpc(OpId id);   // "IndexerLogits", ...: the RPC name

// A call ready to run. Owns its params and what their tensors point into; the request and the
// response it was prepared with must outlive it. Not thread-safe: the scheduler runs its steps
// on one worker at a time.
class PreparedCall {
 public:
  virtual ~PreparedCall() = default;
  // The steps to run in order (closures over this object).
  virtual std::vector<engine::StepFn> Steps() = 0;
  // FLOPs and logical bytes of this call (after it ran: counts may read host-resident data).
  virtual kernels::WorkCount Count() const = 0;
  CallTensors& tensors() { return tensors_; }

 protected:
  PreparedCall(const regions::RegionRegistry* registry, uint64_t max_inline_bytes)
      : tensors_(registry, max_inline_bytes) {}
  CallTensors tensors_;
};

struct PrepareOptions {
  const regions::RegionRegistry* registry = nullptr;
  uint64_t max_inline_bytes = 0;  // per inline output
};

// One operator's handler. Stateless and thread-safe.
class OpHandler {
 public:
  virtual ~OpHandler() = default;
  virtual OpId id() const = 0;
  virtual std::vector<std::string> Implementations() const = 0;
  virtual std::string FastPaths() const = 0;
  // Resolves `request`'s tensors (this op's request message), allocates inline outputs in
  // `response` (this op's response message), and validates. INVALID_ARGUMENT / NOT_FOUND etc.
  // name the tensor.
  virtual absl::StatusOr<std::unique_ptr<PreparedCall>> Prepare(
      const google::protobuf::Message& request, google::protobuf::Message* response,
      const PrepareOptions& options) const = 0;
};

// Reflection helpers: the Tensor field `name` of a message, null when the message has no such
// field (or, for FindTensor, when it is not set).
const v1::Tensor* FindTensor(const google::protobuf::Message& m, absl::string_view name);
v1::Tensor* MutableTensor(google::protobuf::Message* m, absl::string_view name);
// The `stats` field every op response has (null if absent).
v1::CallStats* MutableStats(google::protobuf::Message* m);

// The proto field of a params tensor: Traits::ProtoField(name) when the traits define it (an op
// whose public field names predate its params), else the params name itself.
template <class Traits, class = void>
struct ProtoFieldOf {
  static absl::string_view Get(absl::string_view name) { return name; }
};
template <class Traits>
struct ProtoFieldOf<Traits, std::void_t<decltype(Traits::ProtoField(absl::string_view()))>> {
  static absl::string_view Get(absl::string_view name) { return Traits::ProtoField(name); }
};

// The handler of an op described by `Traits` (see server/ops/<op>_op.cc for the contract).
template <class Traits>
class TypedOpHandler : public OpHandler {
 public:
  using Params = typename Traits::Params;
  using Request = typename Traits::Request;
  using Response = typename Traits::Response;

  OpId id() const override { return Traits::kId; }
  std::vector<std::string> Implementations() const override {
    std::vector<std::string> names;
    for (const auto& impl : Traits::Implementations()) names.push_back(impl.name);
    return names;
  }
  std::string FastPaths() const override { return Traits::kFastPaths; }

  absl::StatusOr<std::unique_ptr<PreparedCall>> Prepare(
      const google::protobuf::Message& request, google::protobuf::Message* response,
      const PrepareOptions& options) const override {
    if (request.GetDescriptor() != Request::descriptor() ||
        response->GetDescriptor() != Response::descriptor()) {
      return absl::InternalError(absl::StrCat(OpName(Traits::kId), ": wrong message types"));
    }
    const auto& req = static_cast<const Request&>(request);
    auto call = std::make_unique<Call>(options.registry, options.max_inline_bytes);
    Params& p = call->params;
    absl::Status st = Traits::SetScalars(req, &p);
    if (!st.ok()) return st;
    p.ForEachTensor([&](const auto& name, kernels::Tensor& t, kernels::Role role) {
      if (!st.ok() || role != kernels::Role::kInput) return;
      st = call->tensors().Input(name, FindTensor(req, ProtoFieldOf<Traits>::Get(name)), &t);
    });
    if (!st.ok()) return st;
    p.ForEachTensor([&](const auto& name, kernels::Tensor& t, kernels::Role role) {
      if (!st.ok() || role != kernels::Role::kOutput) return;
      const absl::string_view field = ProtoFieldOf<Traits>::Get(name);
      const v1::Tensor* placement = FindTensor(req, field);
      const OutputSpec spec = Traits::Output(p, req, name);
      if (placement == nullptr && !spec.produce_when_absent) return;
      v1::Tensor* reply = MutableTensor(response, field);
      if (reply == nullptr) {
        st = absl::InternalError(absl::StrCat(OpName(Traits::kId), ": reply has no '", field,
                                              "' field"));
        return;
      }
      st = call->tensors().Output(name, placement, spec, reply, &t);
    });
    if (!st.ok()) return st;
    if (absl::Status v = Traits::Validate(p); !v.ok()) return v;
    return std::unique_ptr<PreparedCall>(std::move(call));
  }

 private:
  class Call : public PreparedCall {
   public:
    Call(const regions::RegionRegistry* registry, uint64_t max_inline_bytes)
        : PreparedCall(registry, max_inline_bytes) {}
    std::vector<engine::StepFn> Steps() override {
      return {[this](const kernels::ExecContext& ctx, std::string* impl) {
        return Traits::Run(params, ctx, impl);
      }};
    }
    kernels::WorkCount Count() const override { return Traits::Count(params); }
    Params params;
  };
};

// The handlers built into this binary, one per OpId (null for an op whose kernels are not
// built). Owned by main (or a test) and passed in.
class OpTable {
 public:
  OpTable();
  const OpHandler* Find(OpId id) const { return handlers_[static_cast<int>(id)].get(); }

 private:
  std::unique_ptr<OpHandler> handlers_[kNumOps];
};

// Per-op factories (server/ops/<op>_op.cc); each returns null when its op is not built.
std::unique_ptr<OpHandler> MakeIndexerLogitsHandler();
std::unique_ptr<OpHandler> MakeIndexerLogitsPagedHandler();
std::unique_ptr<OpHandler> MakeTopKHandler();
std::unique_ptr<OpHandler> MakeSparseMlaHandler();
std::unique_ptr<OpHandler> MakeMlaDecodeHandler();
std::unique_ptr<OpHandler> MakeMlaPrefillHandler();
std::unique_ptr<OpHandler> MakeDsaAttentionHandler();

}  // namespace attnd::server::ops
