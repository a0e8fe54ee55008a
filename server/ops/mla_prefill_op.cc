// MlaPrefill: q, k, v, cu_seqlens_q, cu_seqlens_k from the request; out/lse derived as
// [total_q, H, d_v] bf16 and [total_q, H] f32 when the request leaves them out.
#include "server/ops/op_handler.h"

#include "kernels/mla_prefill/mla_prefill.h"

namespace attnd::server::ops {
namespace {

namespace op = kernels::mla_prefill;

struct MlaPrefillTraits {
  using Params = op::Params;
  using Request = v1::MlaPrefillRequest;
  using Response = v1::MlaPrefillResponse;
  static constexpr OpId kId = OpId::kMlaPrefill;
  static constexpr const char* kFastPaths =
      "qk 192 / v 128 (DeepSeek), varlen, causal bottom-right; any head dim <= 256 runs";

  static absl::Status SetScalars(const Request& r, Params* p) {
    p->sm_scale = r.sm_scale();
    p->causal = r.causal();
    if (absl::Status s = PrecisionFromProto(r.precision(), &p->precision); !s.ok()) return s;
    return absl::OkStatus();
  }
  static OutputSpec Output(const Params& p, const Request&, absl::string_view name) {
    if (name == "out") {
      return {true, kernels::DType::kBF16, {p.q.dim(0), p.q.dim(1), p.v.dim(2)}};
    }
    return {true, kernels::DType::kF32, {p.q.dim(0), p.q.dim(1)}};  // lse
  }
  static absl::Status Validate(const Params& p) { return op::Validate(p); }
  static kernels::WorkCount Count(const Params& p) { return op::Count(p); }
  // The tensors whose data Count reads (read back from device regions on a GPU).
  static bool CountReads(absl::string_view name) {
    return name == "cu_seqlens_q" || name == "cu_seqlens_k";
  }
  static absl::Status CheckData(const Params& p) { return op::CheckCuSeqlens(p); }
  static const auto& Implementations() { return op::Implementations(); }
  static absl::Status Run(const Params& p, const kernels::ExecContext& ctx, std::string* impl) {
    return op::Run(p, ctx, impl);
  }
};

}  // namespace

std::unique_ptr<OpHandler> MakeMlaPrefillHandler() {
  return std::make_unique<TypedOpHandler<MlaPrefillTraits>>();
}

}  // namespace attnd::server::ops
