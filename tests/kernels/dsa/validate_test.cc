// Fused DSA validation (one row per malformed input: INVALID_ARGUMENT naming the tensor as this
// op calls it) and the FLOP / logical-byte counts.
#include <functional>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "kernels/dsa/dsa.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "tests/harness/harness.h"
#include "tests/kernels/dsa/dsa_case.h"
#include "tests/kernels/dsa/paged_case.h"

namespace attnd::testing {
namespace {

using kernels::DType;
using kernels::dsa::Params;
using kernels::dsa::Validate;

struct Mutation {
  const char* what;
  std::function<void(Params&)> apply;
  const char* tensor;  // the message must start with "<tensor>:"
};

float dummy_f32[64];

const std::vector<Mutation>& Mutations() {
  static const auto* rows = new std::vector<Mutation>{
      {"index_q missing", [](Params& p) { p.index_q = {}; }, "index_q"},
      {"index_q dtype bf16", [](Params& p) { p.index_q.dtype = DType::kBF16; }, "index_q"},
      {"index_q rank 2", [](Params& p) { p.index_q.rank = 2; }, "index_q"},
      {"index_q 0 heads", [](Params& p) { p.index_q.shape[1] = 0; }, "index_q"},
      {"index_q D 100", [](Params& p) { p.index_q.shape[2] = 100; }, "index_q"},
      {"index_q negative T", [](Params& p) { p.index_q.shape[0] = -1; }, "index_q"},
      {"index_k missing", [](Params& p) { p.index_k = {}; }, "index_k"},
      {"index_k dtype f32", [](Params& p) { p.index_k.dtype = DType::kF32; }, "index_k"},
      {"index_k D 64 vs 128", [](Params& p) { p.index_k.shape[1] = 64; }, "index_k"},
      {"index_k row stride", [](Params& p) { p.index_k.strides[0] = 3; }, "index_k"},
      {"index_k_scale missing", [](Params& p) { p.index_k_scale = {}; }, "index_k_scale"},
      {"index_k_scale N-1", [](Params& p) { p.index_k_scale.shape[0] -= 1; }, "index_k_scale"},
      {"index_k_scale dtype bf16", [](Params& p) { p.index_k_scale.dtype = DType::kBF16; },
       "index_k_scale"},
      {"index_weights missing", [](Params& p) { p.index_weights = {}; }, "index_weights"},
      {"index_weights H_i+1", [](Params& p) { p.index_weights.shape[1] += 1; }, "index_weights"},
      {"ks missing", [](Params& p) { p.ks = {}; }, "ks"},
      {"ks dtype f32", [](Params& p) { p.ks.dtype = DType::kF32; }, "ks"},
      {"ke T+1", [](Params& p) { p.ke.shape[0] += 1; }, "ke"},
      {"ks T-1", [](Params& p) { p.ks.shape[0] -= 1; }, "ks"},
      {"index_weights T+1", [](Params& p) { p.index_weights.shape[0] += 1; }, "index_weights"},
      {"out T+1", [](Params& p) { p.out.shape[0] += 1; }, "out"},
      {"lse T-1", [](Params& p) { p.lse.shape[0] -= 1; }, "lse"},
      {"index_q T+1 vs q", [](Params& p) { p.index_q.shape[0] += 1; }, "index_weights"},
      {"topk 0", [](Params& p) { p.topk = 0; }, "topk"},
      {"topk 4097", [](Params& p) { p.topk = 4097; }, "topk"},
      {"q missing", [](Params& p) { p.q = {}; }, "q"},
      {"q T+1", [](Params& p) { p.q.shape[0] += 1; }, "q"},
      {"q d_qk 575", [](Params& p) { p.q.shape[2] = 575; }, "q"},
      {"q 129 heads", [](Params& p) { p.q.shape[1] = 129; }, "q"},
      {"q dtype fp8", [](Params& p) { p.q.dtype = DType::kFp8E4M3; }, "q"},
      {"kv missing", [](Params& p) { p.kv = {}; }, "kv"},
      {"kv N-1 rows", [](Params& p) { p.kv.shape[0] -= 1; }, "kv"},
      {"kv d_qk 512 vs 576", [](Params& p) { p.kv.shape[1] = 512; }, "kv"},
      {"kv row stride", [](Params& p) { p.kv.strides[0] = 100; }, "kv"},
      {"kv f32", [](Params& p) { p.kv.dtype = DType::kF32; }, "kv"},
      // u8 rows of d_qk codes are the per-tensor FP8 cache, which needs kv_scale.
      {"kv u8 576 wide without kv_scale", [](Params& p) { p.kv.dtype = DType::kU8; }, "kv_scale"},
      {"kv_scale with bf16 kv", [](Params& p) { p.kv_scale = 0.5f; }, "kv_scale"},
      {"kv_layout FP8_576_PER_TENSOR for bf16 rows",
       [](Params& p) { p.kv_layout = kernels::CacheLayout::kFp8_576PerTensor; }, "kv_layout"},
      {"sm_scale 0", [](Params& p) { p.sm_scale = 0.0f; }, "sm_scale"},
      {"sm_scale NaN", [](Params& p) { p.sm_scale = std::numeric_limits<float>::quiet_NaN(); },
       "sm_scale"},
      {"index_precision 7",
       [](Params& p) { p.index_precision = static_cast<kernels::Precision>(7); },
       "index_precision"},
      {"logits N+1",
       [](Params& p) {
         p.logits = kernels::MakeTensor(dummy_f32, DType::kF32, {p.q.dim(0), p.kv.dim(0) + 1});
       },
       "logits"},
      {"logits dtype bf16",
       [](Params& p) {
         p.logits = kernels::MakeTensor(dummy_f32, DType::kBF16, {p.q.dim(0), p.kv.dim(0)});
       },
       "logits"},
      {"out missing", [](Params& p) { p.out = {}; }, "out"},
      {"out d_v 576", [](Params& p) { p.out.shape[2] = 576; }, "out"},
      {"out dtype f32", [](Params& p) { p.out.dtype = DType::kF32; }, "out"},
      {"lse H+1", [](Params& p) { p.lse.shape[1] += 1; }, "lse"},
      {"indices k+1", [](Params& p) { p.indices.shape[1] += 1; }, "indices"},
      {"indices dtype f32", [](Params& p) { p.indices.dtype = DType::kF32; }, "indices"},
      {"indices T-1", [](Params& p) { p.indices.shape[0] -= 1; }, "indices"},
  };
  return *rows;
}

// Each row applied to `good` is refused INVALID_ARGUMENT naming its tensor, by Validate and Run.
void ExpectEachRejected(const Params& good, const std::vector<Mutation>& rows) {
  ASSERT_TRUE(Validate(good).ok()) << Validate(good);
  for (const Mutation& m : rows) {
    Params p = good;
    m.apply(p);
    const absl::Status s = Validate(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << m.what << ": " << s;
    EXPECT_EQ(std::string(s.message()).rfind(std::string(m.tensor) + ":", 0), 0u)
        << m.what << ": message does not name " << m.tensor << ": " << s.message();
    kernels::ExecContext ctx;
    ctx.pool = TestPool();
    EXPECT_EQ(kernels::dsa::Run(p, ctx).code(), absl::StatusCode::kInvalidArgument) << m.what;
  }
}

TEST(DsaValidate, RejectsEachMalformedInput) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.t = 4;
  DsaCase c(spec, rng);
  ExpectEachRejected(c.MakeParams(), Mutations());
}

// Applied to a valid call, either form, with the per-tensor FP8 cache (u8 [S, d_qk], kv_scale).
const std::vector<Mutation>& PerTensorMutations() {
  static const auto* rows = new std::vector<Mutation>{
      {"kv_scale missing", [](Params& p) { p.kv_scale = 0.0f; }, "kv_scale"},
      {"kv_scale negative", [](Params& p) { p.kv_scale = -0.5f; }, "kv_scale"},
      {"kv_scale -0", [](Params& p) { p.kv_scale = -0.0f; }, "kv_scale"},
      {"kv_scale NaN", [](Params& p) { p.kv_scale = std::numeric_limits<float>::quiet_NaN(); },
       "kv_scale"},
      {"kv_scale inf", [](Params& p) { p.kv_scale = std::numeric_limits<float>::infinity(); },
       "kv_scale"},
      {"kv_scale -inf", [](Params& p) { p.kv_scale = -std::numeric_limits<float>::infinity(); },
       "kv_scale"},
      {"kv_layout BF16 for u8 rows",
       [](Params& p) { p.kv_layout = kernels::CacheLayout::kBf16_576; }, "kv_layout"},
      {"kv_layout FLASHMLA_FP8_656 for per-tensor rows",
       [](Params& p) { p.kv_layout = kernels::CacheLayout::kFlashMlaFp8_656; }, "kv_layout"},
      {"kv_layout of the other width",
       [](Params& p) {
         p.kv_layout = p.kv.dim(1) == 576 ? kernels::CacheLayout::kFp8_512PerTensor
                                          : kernels::CacheLayout::kFp8_576PerTensor;
       },
       "kv_layout"},
      {"kv as bf16 with kv_scale", [](Params& p) { p.kv.dtype = DType::kBF16; }, "kv_layout"},
  };
  return *rows;
}

TEST(DsaValidate, PerTensorFp8KvNeedsAValidKvScale) {
  for (const int64_t d_qk : {576, 512}) {
    SCOPED_TRACE("d_qk " + std::to_string(d_qk));
    std::mt19937_64 rng = MakeRng();
    DsaSpec spec;
    spec.t = 4;
    spec.d_qk = d_qk;
    spec.per_tensor_kv = true;
    DsaCase c(spec, rng);
    ExpectEachRejected(c.MakeParams(), PerTensorMutations());
    Params unnamed = c.MakeParams();  // the layout inferred from u8 [N, d_qk]
    unnamed.kv_layout = kernels::CacheLayout::kUnspecified;
    EXPECT_TRUE(Validate(unnamed).ok()) << Validate(unnamed);
  }
}

TEST(DsaValidate, FlashMlaFp8KvRefusesKvScale) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.t = 2;
  spec.fp8_kv = true;
  DsaCase c(spec, rng);
  Params p = c.MakeParams();
  ASSERT_TRUE(Validate(p).ok()) << Validate(p);
  p.kv_scale = 1.0f;
  const absl::Status s = Validate(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(std::string(s.message()).rfind("kv_scale:", 0), 0u) << s.message();
}

TEST(DsaValidate, OptionalTensorsMayBeAbsent) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.with_indices = false;
  spec.with_lse = false;
  spec.with_logits = false;
  DsaCase c(spec, rng);
  EXPECT_TRUE(Validate(c.MakeParams()).ok()) << Validate(c.MakeParams());
}

TEST(DsaCount, AddsIndexerAndSparseMla) {
  std::mt19937_64 rng = MakeRng();
  DsaSpec spec;
  spec.t = 3;
  spec.prefix = 70;  // windows 71, 72 and (below) 0 rows; top-64
  DsaCase c(spec, rng);
  c.SetWindow(2, 9, 9);
  const Params p = c.MakeParams();
  const double t = 3, n = 73, hi = 16, di = 128, h = 16, d = 576, k = 64;
  const double pairs = 71 + 72, selections = 64 + 64;
  const kernels::WorkCount w = kernels::dsa::Count(p);
  EXPECT_DOUBLE_EQ(w.flops, 2 * hi * di * pairs + 2 * h * (d + 512) * selections);
  EXPECT_DOUBLE_EQ(w.bytes, t * hi * di + n * di + 4 * n + 4 * t * hi + 8 * t + 2 * t * h * d +
                                2 * d * selections + 2 * t * h * 512 + 4 * t * h + 4 * t * k);
}

int32_t dummy_i32[64];

// The paged form: one row per malformed input, on a call with a separate kv_block_table, per-token
// context_lens and every optional tensor present.
const std::vector<Mutation>& PagedMutations() {
  static const auto* rows = new std::vector<Mutation>{
      {"index_k with index_cache",
       [](Params& p) {
         p.index_k = kernels::MakeTensor(dummy_f32, DType::kFp8E4M3, {4, 128});
       },
       "index_k"},
      {"index_k_scale with index_cache",
       [](Params& p) { p.index_k_scale = kernels::MakeTensor(dummy_f32, DType::kF32, {4}); },
       "index_k_scale"},
      {"ks with index_cache",
       [](Params& p) { p.ks = kernels::MakeTensor(dummy_i32, DType::kI32, {6}); }, "ks"},
      {"ke with index_cache",
       [](Params& p) { p.ke = kernels::MakeTensor(dummy_i32, DType::kI32, {6}); }, "ke"},
      {"index_block_table missing", [](Params& p) { p.index_block_table = {}; },
       "index_block_table"},
      {"context_lens missing", [](Params& p) { p.context_lens = {}; }, "context_lens"},
      {"index_q rank 3 (the gathered shape)", [](Params& p) { p.index_q.rank = 3; }, "index_q"},
      {"index_q next_n 0", [](Params& p) { p.index_q.shape[1] = 0; }, "index_q"},
      {"index_q D 100", [](Params& p) { p.index_q.shape[3] = 100; }, "index_q"},
      {"index_q dtype bf16", [](Params& p) { p.index_q.dtype = DType::kBF16; }, "index_q"},
      {"index_cache dtype f32", [](Params& p) { p.index_cache.dtype = DType::kF32; },
       "index_cache"},
      {"index_cache row of another block size", [](Params& p) { p.index_cache.shape[1] -= 132; },
       "index_cache"},
      {"index_cache_layout a MLA layout",
       [](Params& p) { p.index_cache_layout = kernels::CacheLayout::kBf16_576; },
       "index_cache_layout"},
      {"index_cache_layout out of range",
       [](Params& p) { p.index_cache_layout = static_cast<kernels::CacheLayout>(99); },
       "index_cache_layout"},
      {"index_block_size 0", [](Params& p) { p.index_block_size = 0; }, "index_block_size"},
      {"index_block_size 15 (rows of 16)", [](Params& p) { p.index_block_size = 15; },
       "index_cache"},
      {"index_block_table B+1", [](Params& p) { p.index_block_table.shape[0] += 1; },
       "index_block_table"},
      {"index_block_table dtype f32", [](Params& p) { p.index_block_table.dtype = DType::kF32; },
       "index_block_table"},
      {"context_lens rank 3", [](Params& p) { p.context_lens.rank = 3; }, "context_lens"},
      {"context_lens next_n+1", [](Params& p) { p.context_lens.shape[1] += 1; }, "context_lens"},
      {"context_lens B-1 ([B] form)",
       [](Params& p) {
         p.context_lens.rank = 1;
         p.context_lens.shape[0] -= 1;
       },
       "context_lens"},
      {"kv_block_table B-1", [](Params& p) { p.kv_block_table.shape[0] -= 1; }, "kv_block_table"},
      {"kv_block_table dtype u8", [](Params& p) { p.kv_block_table.dtype = DType::kU8; },
       "kv_block_table"},
      {"kv_block_size -1", [](Params& p) { p.kv_block_size = -1; }, "kv_block_size"},
      {"kv_block_stride -2", [](Params& p) { p.kv_block_stride = -2; }, "kv_block_stride"},
      {"kv_block_stride < kv_block_size", [](Params& p) { p.kv_block_stride = 3; },
       "kv_block_stride"},
      {"index_weights T+1", [](Params& p) { p.index_weights.shape[0] += 1; }, "index_weights"},
      {"index_weights H_i-1", [](Params& p) { p.index_weights.shape[1] -= 1; }, "index_weights"},
      {"q T-1", [](Params& p) { p.q.shape[0] -= 1; }, "q"},
      {"out T+1", [](Params& p) { p.out.shape[0] += 1; }, "out"},
      {"lse T+1", [](Params& p) { p.lse.shape[0] += 1; }, "lse"},
      {"logits T+1", [](Params& p) { p.logits.shape[0] += 1; }, "logits"},
      {"logits dtype bf16", [](Params& p) { p.logits.dtype = DType::kBF16; }, "logits"},
      {"indices k+1", [](Params& p) { p.indices.shape[1] += 1; }, "indices"},
      {"kv f32", [](Params& p) { p.kv.dtype = DType::kF32; }, "kv"},
      {"kv u8 576 wide without kv_scale", [](Params& p) { p.kv.dtype = DType::kU8; }, "kv_scale"},
      {"kv_scale with bf16 kv", [](Params& p) { p.kv_scale = 1.0f; }, "kv_scale"},
      {"kv_layout FP8_576_PER_TENSOR for bf16 rows",
       [](Params& p) { p.kv_layout = kernels::CacheLayout::kFp8_576PerTensor; }, "kv_layout"},
      {"kv missing", [](Params& p) { p.kv = {}; }, "kv"},
      {"kv_layout FP8 for bf16 rows",
       [](Params& p) { p.kv_layout = kernels::CacheLayout::kFlashMlaFp8_656; }, "kv_layout"},
      {"topk 0", [](Params& p) { p.topk = 0; }, "topk"},
      {"sm_scale 0", [](Params& p) { p.sm_scale = 0.0f; }, "sm_scale"},
      // Strides and the shared B / T.
      {"index_block_table column stride 2", [](Params& p) { p.index_block_table.strides[1] = 2; },
       "index_block_table"},
      {"index_block_table rows overlap", [](Params& p) { p.index_block_table.strides[0] = 1; },
       "index_block_table"},
      {"kv_block_table column stride 2", [](Params& p) { p.kv_block_table.strides[1] = 2; },
       "kv_block_table"},
      {"context_lens column stride 2", [](Params& p) { p.context_lens.strides[1] = 2; },
       "context_lens"},
      {"index_q heads overlap", [](Params& p) { p.index_q.strides[2] = 1; }, "index_q"},
      {"index_cache byte stride 2", [](Params& p) { p.index_cache.strides[1] = 2; }, "index_cache"},
      {"kv rows overlap", [](Params& p) { p.kv.strides[0] = 8; }, "kv"},
      {"q last stride 2", [](Params& p) { p.q.strides[2] = 2; }, "q"},
      {"out last stride 2", [](Params& p) { p.out.strides[2] = 2; }, "out"},
      {"index_q B+1 (the tables' B)", [](Params& p) { p.index_q.shape[0] += 1; },
       "index_block_table"},
      {"index_q next_n 1 (T = B·next_n of the others)", [](Params& p) { p.index_q.shape[1] = 1; },
       "index_weights"},
      {"kv d_qk 512 with q 576", [](Params& p) { p.kv.shape[1] = 512; }, "kv"},
      {"topk 4097", [](Params& p) { p.topk = 4097; }, "topk"},
      {"sm_scale NaN", [](Params& p) { p.sm_scale = std::numeric_limits<float>::quiet_NaN(); },
       "sm_scale"},
      {"index_precision 7",
       [](Params& p) { p.index_precision = static_cast<kernels::Precision>(7); },
       "index_precision"},
  };
  return *rows;
}

PagedDsaSpec ValidatePagedSpec() {
  PagedDsaSpec spec;
  spec.next_n = 2;
  spec.per_token_lens = true;
  spec.separate_kv_table = true;
  spec.kv_block_size = 8;
  spec.with_logits = true;
  return spec;
}

TEST(DsaValidate, PagedRejectsEachMalformedInput) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaCase c(ValidatePagedSpec(), rng);
  ExpectEachRejected(c.MakeParams(), PagedMutations());
}

TEST(DsaValidate, PagedPerTensorFp8KvNeedsAValidKvScale) {
  for (const int64_t d_qk : {576, 512}) {
    SCOPED_TRACE("d_qk " + std::to_string(d_qk));
    std::mt19937_64 rng = MakeRng();
    PagedDsaSpec spec = ValidatePagedSpec();
    spec.d_qk = d_qk;
    spec.per_tensor_kv = true;
    PagedDsaCase c(spec, rng);
    ExpectEachRejected(c.MakeParams(), PerTensorMutations());
  }
}

// The paged form's tensors without index_cache: refused, naming the tensor.
TEST(DsaValidate, PagedTensorsWithoutIndexCache) {
  std::mt19937_64 rng = MakeRng();
  DsaCase c(DsaSpec{}, rng);
  for (const char* name : {"index_block_table", "context_lens", "kv_block_table"}) {
    Params p = c.MakeParams();
    kernels::Tensor t = kernels::MakeTensor(dummy_i32, DType::kI32, {1, 4});
    if (std::string(name) == "index_block_table") p.index_block_table = t;
    if (std::string(name) == "context_lens") p.context_lens = t;
    if (std::string(name) == "kv_block_table") p.kv_block_table = t;
    const absl::Status s = Validate(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(std::string(s.message()).rfind(std::string(name) + ":", 0), 0u) << s.message();
  }
}

TEST(DsaValidate, PagedOptionalTensorsMayBeAbsent) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec = ValidatePagedSpec();
  spec.separate_kv_table = false;
  spec.per_token_lens = false;
  spec.with_logits = false;
  spec.with_indices = false;
  spec.with_lse = false;
  PagedDsaCase c(spec, rng);
  EXPECT_TRUE(Validate(c.MakeParams()).ok()) << Validate(c.MakeParams());
}

}  // namespace
}  // namespace attnd::testing
