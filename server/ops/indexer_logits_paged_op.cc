// IndexerLogitsPaged: q, kv_cache, block_table, context_lens, weights from the request; logits
// derived as f32 [B·next_n, N] with N = max_context_len, or max_blocks·block_size when 0;
// precision HIGH unless FAST is asked for.
#include "server/ops/op_handler.h"

#include "kernels/indexer_logits_paged/indexer_logits_paged.h"

namespace attnd::server::ops {
namespace {

namespace op = kernels::indexer_logits_paged;

struct IndexerLogitsPagedTraits {
  using Params = op::Params;
  using Request = v1::IndexerLogitsPagedRequest;
  using Response = v1::IndexerLogitsPagedResponse;
  static constexpr OpId kId = OpId::kIndexerLogitsPaged;
  static constexpr const char* kFastPaths =
      "H in {32, 64}, D = 128, block_size 64 (precision FAST: the fp8 wgmma kernel on sm_90); any "
      "H <= 128 runs";

  static absl::Status SetScalars(const Request& r, Params* p) {
    if (r.has_clean_logits() && !r.clean_logits()) {
      return absl::InvalidArgumentError(
          "clean_logits: the paged indexer always writes -inf outside each row's window; "
          "leave it unset or true");
    }
    if (r.block_size() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("block_size is ", r.block_size(), ", want >= 1 (0: 64)"));
    }
    if (r.block_size() > 0) p->block_size = r.block_size();
    if (r.max_context_len() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_context_len is ", r.max_context_len(), ", want >= 0"));
    }
    p->kv_cache_layout = CacheLayoutFromProto(r.kv_cache_layout());
    // UNSPECIFIED is HIGH here, as for IndexerLogits (docs/ACCURACY.md "Indexer logits, HIGH");
    // FAST is opt-in.
    return PrecisionFromProto(r.precision(), &p->precision, kernels::Precision::kHigh);
  }
  static std::vector<CacheLayoutField> CacheLayouts() {
    const auto& uses = op::kKvCacheLayouts;
    return {{"kv_cache_layout", "kv_cache", {std::begin(uses), std::end(uses)}}};
  }
  static OutputSpec Output(const Params& p, const Request& r, absl::string_view) {
    int64_t rows = 0, cols = r.max_context_len();
    if (__builtin_mul_overflow(p.q.dim(0), p.q.dim(1), &rows)) rows = -1;  // refused later
    if (cols == 0 && __builtin_mul_overflow(p.block_table.dim(1), p.block_size, &cols)) {
      cols = -1;
    }
    return {true, kernels::DType::kF32, {rows, cols}};  // logits
  }
  static absl::Status Validate(const Params& p) { return op::Validate(p); }
  static kernels::WorkCount Count(const Params& p) { return op::Count(p); }
  // The tensors whose data Count reads (read back from device regions on a GPU).
  static bool CountReads(absl::string_view name) { return name == "context_lens"; }
  static const auto& Implementations() { return op::Implementations(); }
  static absl::Status Run(const Params& p, const kernels::ExecContext& ctx, std::string* impl) {
    return op::Run(p, ctx, impl);
  }
};

}  // namespace

std::unique_ptr<OpHandler> MakeIndexerLogitsPagedHandler() {
  return std::make_unique<TypedOpHandler<IndexerLogitsPagedTraits>>();
}

}  // namespace attnd::server::ops
