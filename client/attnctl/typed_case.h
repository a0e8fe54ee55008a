// The OpCase of one operator's Params type: storage of the inputs (heap or a host region),
// remote output buffers per caller, the local run and the per-output checks. The builders in
// cases_*.cc fill a CaseBuilder and hand it to MakeTypedCase.
//   CaseBuilder<sparse_mla::Params> b("sparse_mla", "T=4 ...");
//   b.p.q = b.New(DType::kBF16, {t, h, d});  FillNormal(b.p.q, rng, 1.0);  ...
//   return MakeTypedCase(std::move(b), sparse_mla::Run-like fn, {{"out", kFloat}, ...});
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/attnctl/cases.h"
#include "client/attnctl/fill.h"
#include "client/stream_ordered.h"
#include "client/tensor_codec.h"

namespace attnd::attnctl {

enum class CheckKind { kFloat, kFloatRows, kIndexRows };

// Whether P has the `precision` option (the attention ops, the indexer ops).
template <class P, class = void>
struct HasPrecisionOption : std::false_type {};
template <class P>
struct HasPrecisionOption<P, std::void_t<decltype(std::declval<P&>().precision)>> : std::true_type {
};

// Whether P has the `index_precision` option (dsa: its indexer step's).
template <class P, class = void>
struct HasIndexPrecisionOption : std::false_type {};
template <class P>
struct HasIndexPrecisionOption<P, std::void_t<decltype(std::declval<P&>().index_precision)>>
    : std::true_type {};

// Whether P has the `batch_invariant` option (sparse_mla, mla_decode, dsa).
template <class P, class = void>
struct HasBatchInvariantOption : std::false_type {};
template <class P>
struct HasBatchInvariantOption<P, std::void_t<decltype(std::declval<P&>().batch_invariant)>>
    : std::true_type {};

template <class P>
struct CaseBuilder {
  CaseBuilder(std::string op_name, std::string shape_text)
      : op(std::move(op_name)), shape(std::move(shape_text)) {}
  // A dense heap tensor owned by the case.
  kernels::Tensor New(kernels::DType dtype, const std::vector<int64_t>& dims) {
    storage.push_back(client::HostArray::Dense(dtype, dims));
    return storage.back().view();
  }
  std::string op;
  std::string shape;
  P p;  // inputs filled; outputs present with their layout (data ignored)
  std::vector<client::HostArray> storage;
  // Outputs whose FAST result is held to a wider tolerance than their dtype's (the indexer ops'
  // logits: FP8 tensor-core accumulation), used when the case runs precision FAST.
  std::map<std::string, Tolerance> fast_tolerances;
};

// Allocates every present output of `p` anew (heap into `storage`, or `region`) and poisons it.
template <class P>
absl::Status AllocateOutputs(P* p, client::HostRegion* region,
                             std::vector<client::HostArray>* storage) {
  absl::Status st;
  p->ForEachTensor([&](const char* name, kernels::Tensor& t, kernels::Role role) {
    if (!st.ok() || role != kernels::Role::kOutput || !t.present()) return;
    std::vector<int64_t> dims(t.shape.begin(), t.shape.begin() + t.rank);
    if (region != nullptr) {
      absl::StatusOr<kernels::Tensor> r = region->Allocate(t.dtype, dims);
      if (!r.ok()) {
        st = absl::Status(r.status().code(), absl::StrCat(name, ": ", r.status().message()));
        return;
      }
      t = *r;
    } else {
      storage->push_back(client::HostArray::Dense(t.dtype, dims));
      t = storage->back().view();
    }
    Poison(t);
  });
  return st;
}

template <class P>
uint64_t RoleBytes(const P& p, kernels::Role want) {
  uint64_t bytes = 0;
  p.ForEachTensor([&](const char*, const kernels::Tensor& t, kernels::Role role) {
    if (role != want || !t.present()) return;
    bytes += client::RegionBytesFor(
        t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.rank));
  });
  return bytes;
}

template <class P>
class TypedRemoteCall final : public RemoteCall {
 public:
  explicit TypedRemoteCall(P p) : p_(std::move(p)) {}
  absl::StatusOr<client::CallResult> Run(const Caller& caller) override { return caller.Call(p_); }
  absl::StatusOr<uint64_t> Prepare(client::Client* client, const std::string& lease_id) override {
    return client::PrepareCall(client, p_, lease_id);
  }
  void Poison() override {
    p_.ForEachTensor([](const char*, kernels::Tensor& t, kernels::Role role) {
      if (role == kernels::Role::kOutput) attnctl::Poison(t);
    });
  }
  const P& params() const { return p_; }
  P* mutable_params() { return &p_; }
  std::vector<client::HostArray>* storage() { return &storage_; }

 private:
  P p_;
  std::vector<client::HostArray> storage_;
};

template <class P>
class TypedCase final : public OpCase {
 public:
  using LocalFn = std::function<absl::Status(const P&, const kernels::ExecContext&)>;

  TypedCase(CaseBuilder<P> b, LocalFn local, std::map<std::string, CheckKind> kinds)
      : op_(std::move(b.op)),
        shape_(std::move(b.shape)),
        base_(b.p),
        storage_(std::move(b.storage)),
        local_fn_(std::move(local)),
        kinds_(std::move(kinds)),
        fast_tolerances_(std::move(b.fast_tolerances)) {}

  const std::string& op() const override { return op_; }
  const std::string& shape() const override { return shape_; }
  uint64_t InputBytes() const override { return RoleBytes(base_, kernels::Role::kInput); }
  uint64_t OutputBytes() const override { return RoleBytes(base_, kernels::Role::kOutput); }

  absl::Status MoveInputsTo(client::HostRegion* region) override {
    absl::Status st;
    base_.ForEachTensor([&](const char* name, kernels::Tensor& t, kernels::Role role) {
      if (!st.ok() || role != kernels::Role::kInput || !t.present()) return;
      const std::vector<int64_t> dims(t.shape.begin(), t.shape.begin() + t.rank);
      absl::StatusOr<kernels::Tensor> r = region->Allocate(t.dtype, dims);
      if (!r.ok()) {
        st = absl::Status(r.status().code(), absl::StrCat(name, ": ", r.status().message()));
        return;
      }
      st = client::CopyTensor(t, *r, name);
      t = *r;
    });
    return st;
  }

  absl::Status SetPrecision(kernels::Precision precision) override {
    if constexpr (HasPrecisionOption<P>::value) {
      base_.precision = precision;
      return absl::OkStatus();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--precision: ", op_,
          " has no precision option (attention ops, indexer_logits and indexer_logits_paged "
          "only)"));
    }
  }

  absl::Status SetIndexPrecision(kernels::Precision precision) override {
    if constexpr (HasIndexPrecisionOption<P>::value) {
      base_.index_precision = precision;
      return absl::OkStatus();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--index_precision: ", op_, " has no index_precision option (dsa_attention only)"));
    }
  }

  absl::Status SetBatchInvariant(bool batch_invariant) override {
    if constexpr (HasBatchInvariantOption<P>::value) {
      base_.batch_invariant = batch_invariant;
      return absl::OkStatus();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--batch_invariant: ", op_,
          " has no batch_invariant option (sparse_mla, mla_decode, dsa_attention only)"));
    }
  }

  absl::StatusOr<std::unique_ptr<RemoteCall>> NewRemoteCall(client::HostRegion* outputs) override {
    auto call = std::make_unique<TypedRemoteCall<P>>(base_);
    if (absl::Status s = AllocateOutputs(call->mutable_params(), outputs, call->storage());
        !s.ok()) {
      return s;
    }
    return std::unique_ptr<RemoteCall>(std::move(call));
  }

  absl::Status RunLocal(kernels::ThreadPool* pool) override {
    local_ = base_;
    local_storage_.clear();
    if (absl::Status s = AllocateOutputs(&local_, nullptr, &local_storage_); !s.ok()) return s;
    kernels::ExecContext ctx;
    ctx.backend = kernels::Backend::kCpu;
    ctx.pool = pool;
    return local_fn_(local_, ctx);
  }

  std::vector<Check> Compare(const RemoteCall& call,
                             const client::CallResult& result) const override {
    const P& remote = static_cast<const TypedRemoteCall<P>&>(call).params();
    std::vector<kernels::Tensor> got;
    remote.ForEachTensor([&](const char*, const kernels::Tensor& t, kernels::Role role) {
      if (role == kernels::Role::kOutput) got.push_back(t);
    });
    std::vector<Check> checks;
    size_t i = 0;
    local_.ForEachTensor([&](const char* name, const kernels::Tensor& ref, kernels::Role role) {
      if (role != kernels::Role::kOutput) return;
      kernels::Tensor g = got[i++];
      if (!ref.present()) return;
      if (g.data == nullptr) {
        const client::HostArray* a = result.Returned(name);
        if (a == nullptr) {
          checks.push_back(FailedCheck(name, "the reply carries no such output"));
          return;
        }
        g = a->view();
      }
      auto it = kinds_.find(name);
      const CheckKind kind = it == kinds_.end() ? CheckKind::kFloat : it->second;
      Tolerance tol = ref.dtype == kernels::DType::kBF16 ? kBf16Tolerance : kF32Tolerance;
      if constexpr (HasPrecisionOption<P>::value) {
        const auto fast = fast_tolerances_.find(name);
        if (base_.precision == kernels::Precision::kFast && fast != fast_tolerances_.end()) {
          tol = fast->second;
        }
      }
      if (kind == CheckKind::kIndexRows) {
        checks.push_back(CompareIndexRows(name, g, ref));
      } else if (kind == CheckKind::kFloatRows) {
        checks.push_back(CompareFloatRows(name, g, ref, tol));
      } else {
        checks.push_back(CompareFloat(name, g, ref, tol));
      }
    });
    return checks;
  }

 private:
  const std::string op_;
  const std::string shape_;
  P base_;
  std::vector<client::HostArray> storage_;
  LocalFn local_fn_;
  std::map<std::string, CheckKind> kinds_;
  std::map<std::string, Tolerance> fast_tolerances_;
  P local_;
  std::vector<client::HostArray> local_storage_;
};

template <class P>
std::unique_ptr<OpCase> MakeTypedCase(CaseBuilder<P> b, typename TypedCase<P>::LocalFn local,
                                      std::map<std::string, CheckKind> kinds = {}) {
  return std::make_unique<TypedCase<P>>(std::move(b), std::move(local), std::move(kinds));
}

}  // namespace attnd::attnctl
