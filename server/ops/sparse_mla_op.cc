// SparseMla: q, kv, indices, indptr, topk_length from the request; out/lse derived as
// [T, H, 512] bf16 and [T, H] f32 when the request leaves them out.
#include "server/ops/op_handler.h"

#include "kernels/sparse_mla/sparse_mla.h"

namespace attnd::server::ops {
namespace {

namespace op = kernels::sparse_mla;

struct SparseMlaTraits {
  using Params = op::Params;
  using Request = v1::SparseMlaRequest;
  using Response = v1::SparseMlaResponse;
  static constexpr OpId kId = OpId::kSparseMla;
  static constexpr const char* kFastPaths =
      "d_qk 512 or 576, H in {8,16,32,64,128}, any K (top-k table or CSR)";

  static absl::Status SetScalars(const Request& r, Params* p) {
    p->sm_scale = r.sm_scale();
    if (absl::Status s = PrecisionFromProto(r.precision(), &p->precision); !s.ok()) return s;
    p->batch_invariant = r.batch_invariant();
    p->kv_layout = CacheLayoutFromProto(r.kv_layout());
    p->kv_scale = r.kv_scale();
    return absl::OkStatus();
  }
  static std::vector<CacheLayoutField> CacheLayouts() {
    return {{"kv_layout", "kv", {std::begin(op::kKvLayouts), std::end(op::kKvLayouts)}}};
  }
  static OutputSpec Output(const Params& p, const Request&, absl::string_view name) {
    if (name == "out") return {true, kernels::DType::kBF16, {p.q.dim(0), p.q.dim(1), op::kDimV}};
    return {true, kernels::DType::kF32, {p.q.dim(0), p.q.dim(1)}};  // lse
  }
  static absl::Status Validate(const Params& p) { return op::Validate(p); }
  static kernels::WorkCount Count(const Params& p) { return op::Count(p); }
  // The tensors whose data Count reads (read back from device regions on a GPU).
  static bool CountReads(absl::string_view name) {
    return name == "indices" || name == "indptr" || name == "topk_length";
  }
  // Every slot counted as a valid selection (reads no data): for a selection too large to read
  // back from a device region (kMaxCountReadbackBytes).
  static kernels::WorkCount CountBound(const Params& p) { return op::CountSlots(p); }
  static absl::Status CheckData(const Params& p) { return op::CheckSelectionData(p); }
  static const auto& Implementations() { return op::Implementations(); }
  static absl::Status Run(const Params& p, const kernels::ExecContext& ctx, std::string* impl) {
    return op::Run(p, ctx, impl);
  }
};

}  // namespace

std::unique_ptr<OpHandler> MakeSparseMlaHandler() {
  return std::make_unique<TypedOpHandler<SparseMlaTraits>>();
}

}  // namespace attnd::server::ops
