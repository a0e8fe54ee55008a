// DsaAttention: the whole DSA layer (indexer -> top-k -> sparse MLA) in one call, gathered or
// paged (index_cache set). out/lse derived as [T, H, 512] bf16 and [T, H] f32; indices (i32
// [T, topk]) and logits (f32 [T, N]; paged: N = max_blocks * index_block_size) only when the
// request places them.
#include "server/ops/op_handler.h"

#include "kernels/dsa/dsa.h"
#include "kernels/indexer_logits_paged/params.h"
#include "kernels/sparse_mla/params.h"

namespace attnd::server::ops {
namespace {

namespace op = kernels::dsa;

struct DsaAttentionTraits {
  using Params = op::Params;
  using Request = v1::DsaAttentionRequest;
  using Response = v1::DsaAttentionResponse;
  static constexpr OpId kId = OpId::kDsaAttention;
  static constexpr const char* kFastPaths =
      "indexer H_i in {32, 64}, D_i = 128; topk <= 4096; sparse MLA d_qk 512 or 576, "
      "H in {8,16,32,64,128}";

  static absl::Status SetScalars(const Request& r, Params* p) {
    if (r.topk() != 0) p->topk = r.topk();  // 0: the model's 2048
    p->sm_scale = r.sm_scale();
    if (absl::Status s = PrecisionFromProto(r.precision(), &p->precision); !s.ok()) return s;
    // The indexer step's: UNSPECIFIED is HIGH, as IndexerLogits' precision; FAST is opt-in.
    if (absl::Status s = PrecisionFromProto(r.index_precision(), &p->index_precision,
                                            kernels::Precision::kHigh, "index_precision");
        !s.ok()) {
      return s;
    }
    p->batch_invariant = r.batch_invariant();
    p->kv_layout = CacheLayoutFromProto(r.kv_layout());
    p->kv_scale = r.kv_scale();
    if (r.index_block_size() != 0) p->index_block_size = r.index_block_size();  // 0: 64
    p->kv_block_size = r.kv_block_size();
    p->kv_block_stride = r.kv_block_stride();
    p->index_cache_layout = CacheLayoutFromProto(r.index_cache_layout());
    return absl::OkStatus();
  }
  static std::vector<CacheLayoutField> CacheLayouts() {
    const auto& uses = kernels::sparse_mla::kKvLayouts;
    const auto& index_uses = kernels::indexer_logits_paged::kKvCacheLayouts;
    return {{"kv_layout", "kv", {std::begin(uses), std::end(uses)}},
            {"index_cache_layout", "index_cache", {std::begin(index_uses), std::end(index_uses)}}};
  }
  static OutputSpec Output(const Params& p, const Request&, absl::string_view name) {
    const int64_t t = p.q.dim(0), h = p.q.dim(1);
    if (name == "out") return {true, kernels::DType::kBF16, {t, h, 512}};
    if (name == "lse") return {true, kernels::DType::kF32, {t, h}};
    if (name == "indices") return {false, kernels::DType::kI32, {t, p.topk}};
    // logits. Paged: every position the index table can name (an overflowing product is left
    // for Validate, which refuses it).
    int64_t n = p.index_k.dim(0);
    if (p.paged() && kernels::MulOverflow(p.index_block_table.dim(1), p.index_block_size, &n)) {
      n = 0;
    }
    return {false, kernels::DType::kF32, {t, n}};
  }
  static absl::Status Validate(const Params& p) { return op::Validate(p); }
  static kernels::WorkCount Count(const Params& p) { return op::Count(p); }
  // The tensors whose data Count reads (read back from device regions on a GPU).
  static bool CountReads(absl::string_view name) {
    return name == "ks" || name == "ke" || name == "context_lens";
  }
  static const auto& Implementations() { return op::Implementations(); }
  static absl::Status Run(const Params& p, const kernels::ExecContext& ctx, std::string* impl) {
    return op::Run(p, ctx, impl);
  }
};

}  // namespace

std::unique_ptr<OpHandler> MakeDsaAttentionHandler() {
  return std::make_unique<TypedOpHandler<DsaAttentionTraits>>();
}

}  // namespace attnd::server::ops
