// MlaDecode: q, kv_cache, block_table, cache_seqlens from the request; out/lse derived as
// [B, s_q, H, 512] bf16 and [B, s_q, H] f32 when the request leaves them out.
#include "server/ops/op_handler.h"

#include "kernels/mla_decode/mla_decode.h"

namespace attnd::server::ops {
namespace {

namespace op = kernels::mla_decode;

struct MlaDecodeTraits {
  using Params = op::Params;
  using Request = v1::MlaDecodeRequest;
  using Response = v1::MlaDecodeResponse;
  static constexpr OpId kId = OpId::kMlaDecode;
  static constexpr const char* kFastPaths =
      "d_qk 576 or 512, H <= 16, 64, 128 (any H in 1..128 runs), paged cache, any batch";

  static absl::Status SetScalars(const Request& r, Params* p) {
    p->sm_scale = r.sm_scale();
    p->causal = r.causal();
    if (absl::Status s = PrecisionFromProto(r.precision(), &p->precision); !s.ok()) return s;
    p->batch_invariant = r.batch_invariant();
    p->kv_cache_layout = CacheLayoutFromProto(r.kv_cache_layout());
    p->kv_scale = r.kv_scale();
    return absl::OkStatus();
  }
  static std::vector<CacheLayoutField> CacheLayouts() {
    const auto& uses = op::kKvCacheLayouts;
    return {{"kv_cache_layout", "kv_cache", {std::begin(uses), std::end(uses)}}};
  }
  static OutputSpec Output(const Params& p, const Request&, absl::string_view name) {
    const int64_t b = p.q.dim(0), s_q = p.q.dim(1), h = p.q.dim(2);
    if (name == "out") return {true, kernels::DType::kBF16, {b, s_q, h, op::kDv}};
    return {true, kernels::DType::kF32, {b, s_q, h}};  // lse
  }
  static absl::Status Validate(const Params& p) { return op::Validate(p); }
  static kernels::WorkCount Count(const Params& p) { return op::Count(p); }
  // The tensors whose data Count reads (read back from device regions on a GPU).
  static bool CountReads(absl::string_view name) {
    return name == "cache_seqlens" || name == "block_table";
  }
  static const auto& Implementations() { return op::Implementations(); }
  static absl::Status Run(const Params& p, const kernels::ExecContext& ctx, std::string* impl) {
    return op::Run(p, ctx, impl);
  }
};

}  // namespace

std::unique_ptr<OpHandler> MakeMlaDecodeHandler() {
  return std::make_unique<TypedOpHandler<MlaDecodeTraits>>();
}

}  // namespace attnd::server::ops
