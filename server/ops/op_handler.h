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
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "kernels/common/cache_layout.h"
#include "kernels/common/precision.h"
#include "kernels/common/registry.h"
#include "server/engine/backend.h"
#include "server/engine/op_call.h"
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

// The request's `ready_event` (empty or exactly 64 bytes, else INVALID_ARGUMENT) and
// `device_uuid` fields (empty when the message has none).
absl::Status ReadCallOptions(const google::protobuf::Message& request, std::string* ready_event,
                             std::string* device_uuid);

// A request's `precision` field (proto Precision, its raw value) into *out: FAST gives kFast,
// HIGH kHigh, UNSPECIFIED the op's default `unspecified` (kFast for the attention ops, kHigh for
// the indexer ops); any other value (proto3 enums are open) INVALID_ARGUMENT naming the field
// (`field`: DsaAttention's index_precision passes its own name), *out unchanged.
absl::Status PrecisionFromProto(int value, kernels::Precision* out,
                                kernels::Precision unspecified = kernels::Precision::kFast,
                                absl::string_view field = "precision");
v1::Precision PrecisionToProto(kernels::Precision p);

// Whether an op's Params has the `precision` option (the attention ops, the indexer ops).
template <class Params, class = void>
struct HasPrecision : std::false_type {};
template <class Params>
struct HasPrecision<Params, std::void_t<decltype(std::declval<Params&>().precision)>>
    : std::is_same<decltype(std::declval<Params&>().precision), kernels::Precision> {};

// Whether an op's Params has the `index_precision` option (dsa: its indexer step's).
template <class Params, class = void>
struct HasIndexPrecision : std::false_type {};
template <class Params>
struct HasIndexPrecision<Params, std::void_t<decltype(std::declval<Params&>().index_precision)>>
    : std::is_same<decltype(std::declval<Params&>().index_precision), kernels::Precision> {};

// Whether an op's Params has the `batch_invariant` option (sparse_mla, mla_decode, dsa).
template <class Params, class = void>
struct HasBatchInvariant : std::false_type {};
template <class Params>
struct HasBatchInvariant<Params, std::void_t<decltype(std::declval<Params&>().batch_invariant)>>
    : std::is_same<decltype(std::declval<Params&>().batch_invariant), bool> {};

// A request's cache layout field (proto CacheLayout, its raw value) as the kernels' enum; the
// op's Validate refuses a value outside the enum (proto3 enums are open) naming the field.
inline kernels::CacheLayout CacheLayoutFromProto(int value) {
  return static_cast<kernels::CacheLayout>(value);
}

// One cache tensor of an op and the named layouts it may have (GetInfo's OpInfo.cache_layouts;
// docs/CONTRACTS.md "Named layouts").
struct CacheLayoutField {
  std::string field;   // the request's layout field, e.g. "kv_layout"
  std::string tensor;  // the cache tensor, e.g. "kv"
  std::vector<kernels::CacheLayoutUse> uses;
};

// Traits::CacheLayouts(): the op's cache layout fields (optional; none when absent).
template <class Traits, class = void>
struct CacheLayoutsOf {
  static std::vector<CacheLayoutField> Get() { return {}; }
};
template <class Traits>
struct CacheLayoutsOf<Traits, std::void_t<decltype(Traits::CacheLayouts())>> {
  static std::vector<CacheLayoutField> Get() { return Traits::CacheLayouts(); }
};

// Upper bound on the device-region bytes a call reads back to the host so that its work count
// (docs/CONTRACTS.md "Common rules") is exact; past it an op with a data-free upper bound reports
// that instead (CallStats.work_count "upper_bound"). docs/SERVICE.md "Work counts on a GPU".
inline constexpr uint64_t kMaxCountReadbackBytes = 1 << 20;

// A call ready to run: an engine::OpCall over its params. Owns its params and what their tensors
// point into; the request and the response it was prepared with must outlive it. Not
// thread-safe: the scheduler runs its steps on one worker at a time.
class PreparedCall : public engine::OpCall {
 public:
  // The steps to run in order: the call itself (one step).
  std::vector<engine::JobStep> Steps() { return {engine::JobStep(this)}; }
  // FLOPs and logical bytes of this call, after it ran: host-resident index data is read where
  // it lies, device-region data from the backend's readback (or an upper bound: count_basis()).
  virtual kernels::WorkCount Count() const = 0;
  // "exact" or "upper_bound" (what Count() reports).
  virtual const char* count_basis() const = 0;
  // The precision this call runs (of `out`, or of the indexer ops' logits; dispatch picks an
  // implementation that runs the requested one), or UNSPECIFIED for an op without the option.
  virtual v1::Precision precision() const { return v1::PRECISION_UNSPECIFIED; }
  // The precision of this call's indexer step (dsa_attention's index_precision), or UNSPECIFIED
  // for an op without the option.
  virtual v1::Precision index_precision() const { return v1::PRECISION_UNSPECIFIED; }
  // Whether this call asked for batch_invariant (false for an op without the option).
  virtual bool batch_invariant() const { return false; }
  CallTensors& call_tensors() { return tensors_; }
  // Reads the request's ready_event and device_uuid (ReadCallOptions).
  absl::Status ReadOptions(const google::protobuf::Message& request) {
    return ReadCallOptions(request, &ready_event_, &device_uuid_);
  }

  // engine::OpCall
  const std::vector<engine::TensorUse>& tensors() const override { return tensors_.uses(); }
  const std::string& ready_event() const override { return ready_event_; }
  const std::string& device_uuid() const override { return device_uuid_; }

 protected:
  PreparedCall(const regions::RegionRegistry* registry, uint64_t max_inline_bytes,
               engine::CallMemory* memory)
      : tensors_(registry, max_inline_bytes, memory) {}
  CallTensors tensors_;
  std::string ready_event_;
  std::string device_uuid_;
};

struct PrepareOptions {
  const regions::RegionRegistry* registry = nullptr;
  uint64_t max_inline_bytes = 0;  // the call's inline outputs, each and in total
  // The call's share of the host memory budget (null: no budget); must outlive the call.
  engine::CallMemory* memory = nullptr;
  std::string owner;  // the namespace region names resolve in (RegionRegistry::Acquire)
};

// One operator's handler. Stateless and thread-safe.
class OpHandler {
 public:
  virtual ~OpHandler() = default;
  virtual OpId id() const = 0;
  virtual std::vector<std::string> Implementations() const = 0;
  virtual std::string FastPaths() const = 0;
  // The precisions a request may ask for (GetInfo); empty for ops without the option.
  virtual std::vector<v1::Precision> Precisions() const { return {}; }
  // Whether requests may ask for batch_invariant (GetInfo).
  virtual bool BatchInvariant() const { return false; }
  // The named layouts of the op's cache tensors (GetInfo); empty for ops without one.
  virtual std::vector<CacheLayoutField> CacheLayouts() const { return {}; }
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
// Appends the request's set scalar fields (not tensors, ready_event or device_uuid) to a launch
// key: field number and exact value (floats by bit pattern).
void AppendScalarKey(const google::protobuf::Message& request, std::string* key);
// Appends a tensor's name, dtype, shape and strides to a launch key.
void AppendTensorKey(absl::string_view name, const kernels::Tensor& t, std::string* key);

// Whether the op's Count reads the data of tensor `name`: Traits::CountReads(name) when defined.
template <class Traits, class = void>
struct CountReadsOf {
  static bool Get(absl::string_view) { return false; }
};
template <class Traits>
struct CountReadsOf<Traits, std::void_t<decltype(Traits::CountReads(absl::string_view()))>> {
  static bool Get(absl::string_view name) { return Traits::CountReads(name); }
};
// Traits::CountBound(p): an upper bound of Count(p) that reads no tensor data (optional).
template <class Traits, class = void>
struct CountBoundOf {
  static constexpr bool kHas = false;
  template <class P>
  static kernels::WorkCount Get(const P&) {
    return {};
  }
};
template <class Traits>
struct CountBoundOf<Traits, std::void_t<decltype(Traits::CountBound(
                                std::declval<const typename Traits::Params&>()))>> {
  static constexpr bool kHas = true;
  template <class P>
  static kernels::WorkCount Get(const P& p) {
    return Traits::CountBound(p);
  }
};

// Traits::CheckData(p): the op's checks of index data (cu_seqlens, CSR indptr) that its CPU
// implementation refuses and its GPU kernels only clamp (optional). The handler runs it on every
// backend when every tensor CountReads names is host-readable (inline, or a host-region snapshot),
// so a call's answer does not depend on the backend (docs/SERVICE.md "Trust model").
template <class Traits, class = void>
struct CheckDataOf {
  template <class P>
  static absl::Status Get(const P&) {
    return absl::OkStatus();
  }
};
template <class Traits>
struct CheckDataOf<Traits, std::void_t<decltype(Traits::CheckData(
                               std::declval<const typename Traits::Params&>()))>> {
  template <class P>
  static absl::Status Get(const P& p) {
    return Traits::CheckData(p);
  }
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
  std::vector<v1::Precision> Precisions() const override {
    if constexpr (HasPrecision<Params>::value) return {v1::PRECISION_FAST, v1::PRECISION_HIGH};
    return {};
  }
  bool BatchInvariant() const override { return HasBatchInvariant<Params>::value; }
  std::vector<CacheLayoutField> CacheLayouts() const override {
    return CacheLayoutsOf<Traits>::Get();
  }

  absl::StatusOr<std::unique_ptr<PreparedCall>> Prepare(
      const google::protobuf::Message& request, google::protobuf::Message* response,
      const PrepareOptions& options) const override {
    if (request.GetDescriptor() != Request::descriptor() ||
        response->GetDescriptor() != Response::descriptor()) {
      return absl::InternalError(absl::StrCat(OpName(Traits::kId), ": wrong message types"));
    }
    const auto& req = static_cast<const Request&>(request);
    auto call =
        std::make_unique<Call>(options.registry, options.max_inline_bytes, options.memory, &req);
    call->call_tensors().set_owner(options.owner);
    Params& p = call->params;
    if (absl::Status o = call->ReadOptions(req); !o.ok()) return o;
    absl::Status st = Traits::SetScalars(req, &p);
    if (!st.ok()) return st;
    p.ForEachTensor([&](const auto& name, kernels::Tensor& t, kernels::Role role) {
      if (!st.ok() || role != kernels::Role::kInput) return;
      st = call->call_tensors().Input(name, FindTensor(req, name), &t);
    });
    if (!st.ok()) return st;
    p.ForEachTensor([&](const auto& name, kernels::Tensor& t, kernels::Role role) {
      if (!st.ok() || role != kernels::Role::kOutput) return;
      const v1::Tensor* placement = FindTensor(req, name);
      const OutputSpec spec = Traits::Output(p, req, name);
      if (placement == nullptr && !spec.produce_when_absent) return;
      v1::Tensor* reply = MutableTensor(response, name);
      if (reply == nullptr) {
        st = absl::InternalError(
            absl::StrCat(OpName(Traits::kId), ": reply has no '", name, "' field"));
        return;
      }
      st = call->call_tensors().Output(name, placement, spec, reply, &t);
    });
    if (!st.ok()) return st;
    if (absl::Status v = Traits::Validate(p); !v.ok()) return v;
    if (call->DataOnHost()) {
      if (absl::Status d = CheckDataOf<Traits>::Get(p); !d.ok()) return d;
    }
    call->PlanCountReadback();
    return std::unique_ptr<PreparedCall>(std::move(call));
  }

 private:
  class Call : public PreparedCall {
   public:
    Call(const regions::RegionRegistry* registry, uint64_t max_inline_bytes,
         engine::CallMemory* memory, const Request* request)
        : PreparedCall(registry, max_inline_bytes, memory), request_(request) {}

    absl::string_view op() const override { return OpName(Traits::kId); }

    std::string LaunchKey() const override {
      std::string key = OpName(Traits::kId);
      params.ForEachTensor([&](const auto& name, const kernels::Tensor& t, kernels::Role) {
        if (t.present()) AppendTensorKey(name, t, &key);
      });
      AppendScalarKey(*request_, &key);
      return key;
    }

    absl::Status Select(const kernels::ExecContext& ctx, const std::vector<void*>& data,
                        std::string* impl, int64_t* workspace_bytes) override {
      Binding bound(this, data);
      if (!bound.status().ok()) return bound.status();
      std::string why;
      const auto* selected = kernels::SelectImpl(Traits::Implementations(), params, ctx, &why);
      if (selected == nullptr) return absl::UnimplementedError(why);
      *impl = selected->name;
      *workspace_bytes = selected->workspace ? selected->workspace(params) : 0;
      return absl::OkStatus();
    }

    absl::Status Run(const kernels::ExecContext& ctx, const std::vector<void*>& data,
                     std::string* impl) override {
      Binding bound(this, data);
      if (!bound.status().ok()) return bound.status();
      return Traits::Run(params, ctx, impl);
    }

    kernels::WorkCount Count() const override {
      if (count_bound_) return CountBoundOf<Traits>::Get(params);
      Params p = params;  // device-region tensors Count reads: their host readback copies
      for (const engine::TensorUse& use : tensors_.uses()) {
        if (use.readback == nullptr) continue;
        p.ForEachTensor([&](const auto& name, kernels::Tensor& t, kernels::Role) {
          if (use.name == name) t.data = use.readback;
        });
      }
      return Traits::Count(p);
    }
    const char* count_basis() const override { return count_bound_ ? "upper_bound" : "exact"; }
    v1::Precision precision() const override {
      if constexpr (HasPrecision<Params>::value) return PrecisionToProto(params.precision);
      return v1::PRECISION_UNSPECIFIED;
    }
    v1::Precision index_precision() const override {
      if constexpr (HasIndexPrecision<Params>::value) {
        return PrecisionToProto(params.index_precision);
      }
      return v1::PRECISION_UNSPECIFIED;
    }
    bool batch_invariant() const override {
      if constexpr (HasBatchInvariant<Params>::value) return params.batch_invariant;
      return false;
    }

    // Whether every tensor Count reads is host-readable (none lives in a device region).
    bool DataOnHost() const {
      for (const engine::TensorUse& use : tensors_.uses()) {
        if (use.residence == engine::Residence::kDeviceRegion &&
            CountReadsOf<Traits>::Get(use.name)) {
          return false;
        }
      }
      return true;
    }

    // Device-region tensors that Count reads get a host buffer the backend fills after the op,
    // unless they exceed kMaxCountReadbackBytes and the op has a data-free upper bound.
    void PlanCountReadback() {
      uint64_t bytes = 0;
      for (const engine::TensorUse& use : tensors_.uses()) {
        if (use.residence == engine::Residence::kDeviceRegion &&
            CountReadsOf<Traits>::Get(use.name)) {
          bytes += use.span_bytes;
        }
      }
      if (bytes == 0) return;
      if (bytes > kMaxCountReadbackBytes && CountBoundOf<Traits>::kHas) {
        count_bound_ = true;
        return;
      }
      for (engine::TensorUse& use : tensors_.mutable_uses()) {
        if (use.residence != engine::Residence::kDeviceRegion ||
            !CountReadsOf<Traits>::Get(use.name) || use.span_bytes == 0) {
          continue;
        }
        readback_.emplace_back(new char[use.span_bytes]);
        use.readback = readback_.back().get();
      }
    }

    Params params;

   private:
    // Points the params' tensors at `data` (one per tensors() entry, by name) for its lifetime.
    class Binding {
     public:
      Binding(Call* call, const std::vector<void*>& data) {
        const auto& uses = call->tensors_.uses();
        if (data.size() != uses.size()) {
          status_ = absl::InternalError("tensor binding: pointer count mismatch");
          return;
        }
        call->params.ForEachTensor([&](const auto& name, kernels::Tensor& t, kernels::Role) {
          for (size_t i = 0; i < uses.size(); ++i) {
            if (uses[i].name == name) {
              saved_.emplace_back(&t, t.data);
              t.data = data[i];
            }
          }
        });
      }
      ~Binding() {
        for (auto& [t, p] : saved_) t->data = p;
      }
      const absl::Status& status() const { return status_; }

     private:
      std::vector<std::pair<kernels::Tensor*, void*>> saved_;
      absl::Status status_;
    };

    const Request* const request_;
    bool count_bound_ = false;
    std::vector<std::unique_ptr<char[]>> readback_;
  };
};

// The handlers of every operator, one per OpId. Owned by main (or a test) and passed in.
class OpTable {
 public:
  OpTable();
  const OpHandler* Find(OpId id) const { return handlers_[static_cast<int>(id)].get(); }

 private:
  std::unique_ptr<OpHandler> handlers_[kNumOps];
};

// Per-op factories (server/ops/<op>_op.cc).
std::unique_ptr<OpHandler> MakeIndexerLogitsHandler();
std::unique_ptr<OpHandler> MakeIndexerLogitsPagedHandler();
std::unique_ptr<OpHandler> MakeTopKHandler();
std::unique_ptr<OpHandler> MakeSparseMlaHandler();
std::unique_ptr<OpHandler> MakeMlaDecodeHandler();
std::unique_ptr<OpHandler> MakeMlaPrefillHandler();
std::unique_ptr<OpHandler> MakeDsaAttentionHandler();

}  // namespace attnd::server::ops
