// IndexerLogits: q, k, k_scale, weights, ks, ke from the request; logits derived as f32 [M, N]
// (M = q's rows, N = k's rows) when the request leaves it out; precision HIGH unless FAST is
// asked for.
#include "server/ops/op_handler.h"

#include "kernels/indexer_logits/indexer_logits.h"

namespace attnd::server::ops {
namespace {

namespace op = kernels::indexer_logits;

struct IndexerLogitsTraits {
  using Params = op::Params;
  using Request = v1::IndexerLogitsRequest;
  using Response = v1::IndexerLogitsResponse;
  static constexpr OpId kId = OpId::kIndexerLogits;
  static constexpr const char* kFastPaths =
      "H in {32, 64}, D = 128 (precision FAST: the fp8 wgmma kernel on sm_90); any H <= 128, D in "
      "{64, 128} runs";

  static absl::Status SetScalars(const Request& r, Params* p) {
    if (r.has_clean_logits()) p->clean_logits = r.clean_logits();
    // UNSPECIFIED is HIGH here (DESIGN.md §2's exact contract); FAST is opt-in.
    return PrecisionFromProto(r.precision(), &p->precision, kernels::Precision::kHigh);
  }
  static OutputSpec Output(const Params& p, const Request&, absl::string_view) {
    return {true, kernels::DType::kF32, {p.q.dim(0), p.k.dim(0)}};  // logits
  }
  static absl::Status Validate(const Params& p) { return op::Validate(p); }
  static kernels::WorkCount Count(const Params& p) { return op::Count(p); }
  // The tensors whose data Count reads (read back from device regions on a GPU).
  static bool CountReads(absl::string_view name) { return name == "ks" || name == "ke"; }
  static const auto& Implementations() { return op::Implementations(); }
  static absl::Status Run(const Params& p, const kernels::ExecContext& ctx, std::string* impl) {
    return op::Run(p, ctx, impl);
  }
};

}  // namespace

std::unique_ptr<OpHandler> MakeIndexerLogitsHandler() {
  return std::make_unique<TypedOpHandler<IndexerLogitsTraits>>();
}

}  // namespace attnd::server::ops
