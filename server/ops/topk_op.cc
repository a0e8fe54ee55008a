// TopK: logits, ks/ke or lengths, block_table (its rows by rows_per_request, req_id_per_row or
// cu_seqlens_q; block_stride), index_base from the request; indices derived as
// i32 [M, k]; values (f32 [M, k]) is optional and computed only when the request places it.
#include "server/ops/op_handler.h"

#include "absl/strings/str_cat.h"
#include "kernels/topk/topk.h"

namespace attnd::server::ops {
namespace {

namespace op = kernels::topk;

struct TopKTraits {
  using Params = op::Params;
  using Request = v1::TopKRequest;
  using Response = v1::TopKResponse;
  static constexpr OpId kId = OpId::kTopK;
  static constexpr const char* kFastPaths =
      "k <= 4096 (2048 in the model), optional fused block-table mapping (requests by row count, "
      "req_id_per_row or cu_seqlens_q; block_stride), either index base";

  static absl::Status SetScalars(const Request& r, Params* p) {
    p->k = r.k();
    p->page_size = r.page_size();
    p->block_stride = r.block_stride();
    p->rows_per_request = r.rows_per_request() > 0 ? r.rows_per_request() : 1;
    switch (r.index_base()) {
      case v1::TopKRequest::INDEX_BASE_UNSPECIFIED:
      case v1::TopKRequest::INDEX_BASE_ABSOLUTE: p->index_base = op::IndexBase::kAbsolute; break;
      case v1::TopKRequest::INDEX_BASE_ROW_START: p->index_base = op::IndexBase::kRowStart; break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "index_base is ", r.index_base(),
            ", want INDEX_BASE_ABSOLUTE (1, or 0: unset) or INDEX_BASE_ROW_START (2)"));
    }
    return absl::OkStatus();
  }
  static OutputSpec Output(const Params& p, const Request&, absl::string_view name) {
    if (name == "indices") return {true, kernels::DType::kI32, {p.logits.dim(0), p.k}};
    return {false, kernels::DType::kF32, {p.logits.dim(0), p.k}};  // values: optional
  }
  static absl::Status Validate(const Params& p) { return op::Validate(p); }
  static kernels::WorkCount Count(const Params& p) { return op::Count(p); }
  // The tensors whose data Count reads (read back from device regions on a GPU).
  static bool CountReads(absl::string_view name) {
    return name == "ks" || name == "ke" || name == "lengths";
  }
  static const auto& Implementations() { return op::Implementations(); }
  static absl::Status Run(const Params& p, const kernels::ExecContext& ctx, std::string* impl) {
    return op::Run(p, ctx, impl);
  }
};

}  // namespace

std::unique_ptr<OpHandler> MakeTopKHandler() {
  return std::make_unique<TypedOpHandler<TopKTraits>>();
}

}  // namespace attnd::server::ops
