// Sparse MLA validation (one row per malformed input: INVALID_ARGUMENT naming the tensor), the
// CPU implementation's data-dependent CSR checks, and the FLOP / logical-byte counts.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "tests/harness/harness.h"
#include "tests/kernels/sparse_mla/case.h"

namespace attnd::testing {
namespace {

using kernels::DType;
using kernels::sparse_mla::Params;
using kernels::sparse_mla::Validate;

struct Mutation {
  const char* what;
  bool csr;  // start from the CSR form instead of the table form (FP8 table: the FP8 cache)
  std::function<void(Params&)> apply;
  const char* tensor;  // the message must start with "<tensor>:"
};

int32_t dummy_i32[64];

const std::vector<Mutation>& Mutations() {
  static const auto* rows = new std::vector<Mutation>{
      {"q missing", false, [](Params& p) { p.q = {}; }, "q"},
      {"q dtype f32", false, [](Params& p) { p.q.dtype = DType::kF32; }, "q"},
      {"q rank 2", false, [](Params& p) { p.q.rank = 2; }, "q"},
      {"q zero heads", false, [](Params& p) { p.q.shape[1] = 0; }, "q"},
      {"q 129 heads", false, [](Params& p) { p.q.shape[1] = 129; }, "q"},
      {"q d_qk 575", false, [](Params& p) { p.q.shape[2] = 575; }, "q"},
      {"q d_qk 128", false, [](Params& p) { p.q.shape[2] = 128; }, "q"},
      {"q negative T", false, [](Params& p) { p.q.shape[0] = -1; }, "q"},
      {"q last dim strided", false, [](Params& p) { p.q.strides[2] = 2; }, "q"},
      {"q head stride too small", false, [](Params& p) { p.q.strides[1] = 100; }, "q"},
      {"q null data", false, [](Params& p) { p.q.data = nullptr; }, "q"},
      {"kv missing", false, [](Params& p) { p.kv = {}; }, "kv"},
      {"kv dtype fp8", false, [](Params& p) { p.kv.dtype = DType::kFp8E4M3; }, "kv"},
      {"kv rank 3", false, [](Params& p) { p.kv.rank = 3; }, "kv"},
      {"kv d_qk 512 vs q 576", false, [](Params& p) { p.kv.shape[1] = 512; }, "kv"},
      {"kv negative S", false, [](Params& p) { p.kv.shape[0] = -4; }, "kv"},
      {"kv row stride below d_qk", false, [](Params& p) { p.kv.strides[0] = 500; }, "kv"},
      {"kv negative row stride", false, [](Params& p) { p.kv.strides[0] = -576; }, "kv"},
      {"kv null data", false, [](Params& p) { p.kv.data = nullptr; }, "kv"},
      {"indices missing", false, [](Params& p) { p.indices = {}; }, "indices"},
      {"indices dtype f32", false, [](Params& p) { p.indices.dtype = DType::kF32; }, "indices"},
      {"indices rank 1 without indptr", false, [](Params& p) { p.indices.rank = 1; }, "indices"},
      {"indices T+1 rows", false, [](Params& p) { p.indices.shape[0] += 1; }, "indices"},
      {"indices negative K", false, [](Params& p) { p.indices.shape[1] = -1; }, "indices"},
      {"indices row stride below K", false, [](Params& p) { p.indices.strides[0] = 3; }, "indices"},
      {"topk_length dtype f32", false, [](Params& p) { p.topk_length.dtype = DType::kF32; },
       "topk_length"},
      {"topk_length T+1", false, [](Params& p) { p.topk_length.shape[0] += 1; }, "topk_length"},
      {"topk_length rank 2", false, [](Params& p) { p.topk_length.rank = 2; }, "topk_length"},
      {"topk_length with CSR", true,
       [](Params& p) { p.topk_length = kernels::MakeTensor(dummy_i32, DType::kI32, {3}); },
       "topk_length"},
      {"indptr size T", true, [](Params& p) { p.indptr.shape[0] -= 1; }, "indptr"},
      {"indptr dtype f32", true, [](Params& p) { p.indptr.dtype = DType::kF32; }, "indptr"},
      {"indptr rank 2", true, [](Params& p) { p.indptr.rank = 2; }, "indptr"},
      {"CSR indices rank 2", true,
       [](Params& p) {
         p.indices = kernels::MakeTensor(dummy_i32, DType::kI32, {3, 4});
       },
       "indices"},
      {"CSR indices dtype bf16", true, [](Params& p) { p.indices.dtype = DType::kBF16; },
       "indices"},
      {"sm_scale 0", false, [](Params& p) { p.sm_scale = 0.0f; }, "sm_scale"},
      {"sm_scale negative", false, [](Params& p) { p.sm_scale = -0.1f; }, "sm_scale"},
      {"sm_scale NaN", false,
       [](Params& p) { p.sm_scale = std::numeric_limits<float>::quiet_NaN(); }, "sm_scale"},
      {"sm_scale inf", false,
       [](Params& p) { p.sm_scale = std::numeric_limits<float>::infinity(); }, "sm_scale"},
      {"out missing", false, [](Params& p) { p.out = {}; }, "out"},
      {"out dtype f32", false, [](Params& p) { p.out.dtype = DType::kF32; }, "out"},
      {"out d_v 576", false, [](Params& p) { p.out.shape[2] = 576; }, "out"},
      {"out H-1", false, [](Params& p) { p.out.shape[1] -= 1; }, "out"},
      {"out T+1", false, [](Params& p) { p.out.shape[0] += 1; }, "out"},
      {"out rank 2", false, [](Params& p) { p.out.rank = 2; }, "out"},
      {"out token stride too small", false, [](Params& p) { p.out.strides[0] = 512; }, "out"},
      {"lse dtype bf16", false, [](Params& p) { p.lse.dtype = DType::kBF16; }, "lse"},
      {"lse H+1", false, [](Params& p) { p.lse.shape[1] += 1; }, "lse"},
      {"lse rank 1", false, [](Params& p) { p.lse.rank = 1; }, "lse"},
      // Any layout whose elements cannot share an address is fine (docs/CONTRACTS.md "Strided
      // lse"); these overlap. T = 3, H = 16.
      {"lse both strides 1", false, [](Params& p) { p.lse.strides[0] = p.lse.strides[1] = 1; },
       "lse"},
      {"lse [H, T] view with head stride 2 < T", false,
       [](Params& p) {
         p.lse.strides[0] = 1;
         p.lse.strides[1] = 2;
       },
       "lse"},
      {"lse head stride 0", false, [](Params& p) { p.lse.strides[1] = 0; }, "lse"},
      {"lse token stride 15 < H", false, [](Params& p) { p.lse.strides[0] = 15; }, "lse"},
      {"lse negative head stride", false, [](Params& p) { p.lse.strides[1] = -1; }, "lse"},
  };
  return *rows;
}

// Applied to a valid call with the FP8 cache (u8 [S, 656], row stride 672 bytes).
const std::vector<Mutation>& Fp8Mutations() {
  static const auto* rows = new std::vector<Mutation>{
      {"fp8 kv width 655", false, [](Params& p) { p.kv.shape[1] = 655; }, "kv"},
      // A u8 row of d_qk bytes is the per-tensor FP8 cache, which needs kv_scale.
      {"fp8 kv width 576 without kv_scale", false, [](Params& p) { p.kv.shape[1] = 576; },
       "kv_scale"},
      {"fp8 kv with kv_scale", false, [](Params& p) { p.kv_scale = 1.0f; }, "kv_scale"},
      {"fp8 kv with d_qk 512", false, [](Params& p) { p.q.shape[2] = 512; }, "kv"},
      {"fp8 kv row stride 658 (not a multiple of 4)", false,
       [](Params& p) { p.kv.strides[0] = 658; }, "kv"},
      {"fp8 kv row stride 650 (below 656)", false, [](Params& p) { p.kv.strides[0] = 650; }, "kv"},
      {"fp8 kv base not 4-byte aligned", false,
       [](Params& p) { p.kv.data = static_cast<char*>(p.kv.data) + 2; }, "kv"},
      {"fp8 kv rank 3", false, [](Params& p) { p.kv.rank = 3; }, "kv"},
      {"fp8 kv last dim strided", false, [](Params& p) { p.kv.strides[1] = 2; }, "kv"},
      {"fp8 kv null data", false, [](Params& p) { p.kv.data = nullptr; }, "kv"},
      {"kv dtype fp8_e4m3 with 656-byte rows", false,
       [](Params& p) { p.kv.dtype = DType::kFp8E4M3; }, "kv"},
      {"kv dtype i32", false, [](Params& p) { p.kv.dtype = DType::kI32; }, "kv"},
  };
  return *rows;
}

void ExpectEachRejected(SparseMlaCase& c, const std::vector<Mutation>& mutations) {
  for (const Mutation& m : mutations) {
    Params p = c.MakeParams(m.csr);
    m.apply(p);
    const absl::Status s = Validate(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << m.what << ": " << s;
    EXPECT_EQ(std::string(s.message()).rfind(std::string(m.tensor) + ":", 0), 0u)
        << m.what << ": message does not name " << m.tensor << ": " << s.message();
    kernels::ExecContext ctx;
    ctx.pool = TestPool();
    EXPECT_EQ(kernels::sparse_mla::Run(p, ctx).code(), absl::StatusCode::kInvalidArgument)
        << m.what;
  }
}

TEST(SparseMlaValidate, RejectsEachMalformedInput) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.t = 3;
  spec.with_topk_length = true;
  SparseMlaCase c(spec, rng);
  for (bool csr : {false, true}) {
    const Params good = c.MakeParams(csr);
    ASSERT_TRUE(Validate(good).ok()) << Validate(good);
  }
  ExpectEachRejected(c, Mutations());
}

TEST(SparseMlaValidate, RejectsEachMalformedFp8Cache) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.t = 3;
  spec.kv_format = KvFormat::kFp8;
  spec.kv_row_stride = 672;
  SparseMlaCase c(spec, rng);
  for (bool csr : {false, true}) {
    const Params good = c.MakeParams(csr);
    ASSERT_TRUE(Validate(good).ok()) << Validate(good);
  }
  // Any row stride >= 656 that is a multiple of 4 is valid (GPU kernels want 16: Supports).
  Params wide = c.MakeParams(false);
  wide.kv.strides[0] = 660;
  wide.kv.shape[0] = 10;
  EXPECT_TRUE(Validate(wide).ok()) << Validate(wide);
  ExpectEachRejected(c, Fp8Mutations());
}

// Applied to a valid call with the per-tensor FP8 cache (u8 [S, d_qk], kv_scale).
const std::vector<Mutation>& PerTensorMutations() {
  static const auto* rows = new std::vector<Mutation>{
      {"per-tensor kv_scale missing", false, [](Params& p) { p.kv_scale = 0.0f; }, "kv_scale"},
      {"per-tensor kv_scale negative", false, [](Params& p) { p.kv_scale = -0.5f; }, "kv_scale"},
      {"per-tensor kv_scale NaN", false,
       [](Params& p) { p.kv_scale = std::numeric_limits<float>::quiet_NaN(); }, "kv_scale"},
      {"per-tensor kv_scale inf", false,
       [](Params& p) { p.kv_scale = std::numeric_limits<float>::infinity(); }, "kv_scale"},
      {"per-tensor kv_scale -0", false, [](Params& p) { p.kv_scale = -0.0f; }, "kv_scale"},
      {"per-tensor kv 512 wide with q d_qk 576", false, [](Params& p) { p.kv.shape[1] = 512; },
       "kv"},
      {"per-tensor kv with q d_qk 512", false, [](Params& p) { p.q.shape[2] = 512; }, "kv"},
      {"per-tensor kv dtype fp8_e4m3", false, [](Params& p) { p.kv.dtype = DType::kFp8E4M3; },
       "kv"},
      {"per-tensor kv row stride 500", false, [](Params& p) { p.kv.strides[0] = 500; }, "kv"},
      {"per-tensor kv rank 3", false, [](Params& p) { p.kv.rank = 3; }, "kv"},
      {"per-tensor named FP8_512 on 576 rows", false,
       [](Params& p) { p.kv_layout = kernels::CacheLayout::kFp8_512PerTensor; }, "kv_layout"},
      {"per-tensor named FLASHMLA_FP8_656", false,
       [](Params& p) { p.kv_layout = kernels::CacheLayout::kFlashMlaFp8_656; }, "kv_layout"},
      {"per-tensor named BF16_576", false,
       [](Params& p) { p.kv_layout = kernels::CacheLayout::kBf16_576; }, "kv_layout"},
  };
  return *rows;
}

TEST(SparseMlaValidate, RejectsEachMalformedPerTensorFp8Cache) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.t = 3;
  spec.kv_format = KvFormat::kFp8PerTensor;
  spec.kv_row_stride = 592;
  SparseMlaCase c(spec, rng);
  for (bool csr : {false, true}) {
    Params good = c.MakeParams(csr);
    ASSERT_TRUE(Validate(good).ok()) << Validate(good);
    good.kv_layout = kernels::CacheLayout::kFp8_576PerTensor;  // named: the same call
    ASSERT_TRUE(Validate(good).ok()) << Validate(good);
  }
  ExpectEachRejected(c, PerTensorMutations());
  // A bf16 cache with a scale: refused, naming kv_scale.
  SparseMlaSpec bf16_spec;
  SparseMlaCase b(bf16_spec, rng);
  Params p = b.MakeParams(false);
  p.kv_scale = 0.5f;
  EXPECT_EQ(Validate(p).message(),
            "kv_scale: is 0.5, but kv is not a per-tensor FP8 cache (u8 [S, d_qk]): leave it "
            "unset (0)");
  p = c.MakeParams(false);
  p.kv_scale = 0.0f;
  EXPECT_EQ(Validate(p).message(),
            "kv_scale: missing: kv is per-tensor FP8 (u8 [S, 576]), whose values are e4m3 x "
            "kv_scale");
  p = c.MakeParams(false);
  p.kv_scale = -1.0f;
  EXPECT_EQ(Validate(p).message(), "kv_scale: is -1, want finite and > 0");
  // d_qk 512 (GLM-5.3-Flash): u8 [S, 512] rows, named or inferred.
  SparseMlaSpec glm = spec;
  glm.d_qk = 512;
  SparseMlaCase g(glm, rng);
  p = g.MakeParams(false);
  EXPECT_TRUE(Validate(p).ok()) << Validate(p);
  p.kv_layout = kernels::CacheLayout::kFp8_512PerTensor;
  EXPECT_TRUE(Validate(p).ok()) << Validate(p);
  p.kv_layout = kernels::CacheLayout::kFp8_576PerTensor;
  EXPECT_EQ(Validate(p).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SparseMlaValidate, AcceptsLseInAnyNonOverlappingLayout) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.t = 3;
  SparseMlaCase c(spec, rng);
  // Validation does not read lse, so the dense buffer's pointer serves every layout here.
  for (const auto& strides : {std::pair<int64_t, int64_t>{1, 3}, {1, 7}, {20, 1}, {1, 1000}}) {
    Params p = c.MakeParams(false);
    p.lse.strides[0] = strides.first;
    p.lse.strides[1] = strides.second;
    EXPECT_TRUE(Validate(p).ok()) << strides.first << "," << strides.second << ": " << Validate(p);
  }
}

TEST(SparseMlaValidate, MessagesNameDimAndBothValues) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaCase c(SparseMlaSpec{}, rng);
  Params p = c.MakeParams(false);
  p.q.shape[2] = 575;
  EXPECT_EQ(Validate(p).message(), "q: dim 2 is 575, want 512 or 576 (d_qk)");
  p = c.MakeParams(false);
  p.q.shape[1] = 0;
  EXPECT_EQ(Validate(p).message(), "q: dim 1 is 0, want 1..128 (heads)");
  p = c.MakeParams(false);
  p.out.shape[2] = 576;
  EXPECT_EQ(Validate(p).message(), "out: dim 2 is 576, want 512");
  p = c.MakeParams(false);
  p.kv.dtype = DType::kF32;
  EXPECT_EQ(Validate(p).message(),
            "kv: dtype is f32, want bf16 [S, d_qk], u8 [S, 656] (the FP8 cache) or u8 [S, d_qk] "
            "(per-tensor FP8 codes, kv_scale)");

  SparseMlaSpec spec;
  spec.kv_format = KvFormat::kFp8;
  SparseMlaCase f(spec, rng);
  p = f.MakeParams(false);
  p.kv.shape[1] = 640;
  EXPECT_EQ(Validate(p).message(),
            "kv: dim 1 is 640, want 656 (CACHE_LAYOUT_FLASHMLA_FP8_656) or 576 "
            "(CACHE_LAYOUT_FP8_576_PER_TENSOR: q's d_qk, with kv_scale)");
  p = f.MakeParams(false);
  p.kv.strides[0] = 662;
  EXPECT_EQ(Validate(p).message(),
            "kv: stride of dim 0 is 662 bytes, want a multiple of 4 (FP8 rows hold f32 scales)");
  p = f.MakeParams(false);
  p.q.shape[2] = 512;
  EXPECT_EQ(Validate(p).message(),
            "kv: the FP8 cache (u8 [S, 656]) needs d_qk 576, q dim 2 is 512");
}

// indptr is data: Validate cannot see it; the CPU implementation refuses before writing.
TEST(SparseMlaValidate, CpuRejectsMalformedIndptrData) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.t = 4;
  spec.k = 10;
  SparseMlaCase c(spec, rng);
  struct Bad {
    const char* what;
    std::function<void(int32_t*)> apply;
  };
  const std::vector<Bad> bads = {
      {"indptr[0] = 1", [](int32_t* ip) { ip[0] = 1; }},
      {"indptr[0] = -1", [](int32_t* ip) { ip[0] = -1; }},
      {"decreasing", [](int32_t* ip) { ip[2] = ip[1] - 1; }},
      {"end below nnz", [](int32_t* ip) { ip[4] -= 1; }},
      {"end past nnz", [](int32_t* ip) { ip[4] += 1; }},
  };
  for (const Bad& bad : bads) {
    const Params p = c.MakeParams(/*csr=*/true);
    int32_t* ip = p.indptr.ptr<int32_t>();
    std::vector<int32_t> saved(ip, ip + spec.t + 1);
    bad.apply(ip);
    ASSERT_TRUE(Validate(p).ok()) << bad.what;
    for (const auto& impl : kernels::sparse_mla::Implementations()) {
      if (impl.backend != kernels::Backend::kCpu) continue;
      PoisonNaN(c.out());
      kernels::ExecContext ctx;
      ctx.pool = TestPool();
      const absl::Status s = impl.run(p, ctx);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.what << ": " << s;
      EXPECT_EQ(std::string(s.message()).rfind("indptr:", 0), 0u) << s.message();
      EXPECT_TRUE(std::isnan(c.out().At({0, 0, 0}))) << bad.what << ": output was written";
    }
    std::copy(saved.begin(), saved.end(), ip);
  }
}

TEST(SparseMlaCount, FollowsSeedFormula) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.t = 2;
  spec.h = 8;
  spec.s = 10;
  spec.k = 3;
  // Valid: row 0 {0}, row 1 {5, 5, 9} -> E = 4 (the duplicate counts twice).
  SparseMlaCase c(spec, rng, {{0, -1, 10}, {5, 5, 9}}, {});
  const double t = 2, h = 8, d = 576, e = 4, slots = 6;
  const double base = 2 * t * h * d + 2 * d * e + 2 * t * h * 512 + 4 * t * h;
  Params p = c.MakeParams(false);
  EXPECT_EQ(kernels::sparse_mla::CountValidSelections(p), 4);
  EXPECT_DOUBLE_EQ(kernels::sparse_mla::Count(p).flops, 2 * h * (d + 512) * e);
  EXPECT_DOUBLE_EQ(kernels::sparse_mla::Count(p).bytes, base + 4 * slots);
  p = c.MakeParams(true);
  EXPECT_DOUBLE_EQ(kernels::sparse_mla::Count(p).bytes, base + 4 * slots + 4 * (t + 1));
  const kernels::WorkCount all = kernels::sparse_mla::CountSlots(p);
  EXPECT_DOUBLE_EQ(all.flops, 2 * h * (d + 512) * slots);
  // topk_length {1, 2}: row 0 {0}, row 1 {5, 5} -> E = 3, plus 4·T bytes of lengths.
  SparseMlaCase c2(spec, rng, {{0, -1, 10}, {5, 5, 9}}, {1, 2});
  p = c2.MakeParams(false);
  EXPECT_EQ(kernels::sparse_mla::CountValidSelections(p), 3);
  EXPECT_DOUBLE_EQ(kernels::sparse_mla::Count(p).bytes, base - 2 * d + 4 * slots + 4 * t);
  // The FP8 cache: 656 logical bytes per gathered row; the same FLOPs.
  spec.kv_format = KvFormat::kFp8;
  SparseMlaCase c3(spec, rng, {{0, -1, 10}, {5, 5, 9}}, {});
  p = c3.MakeParams(false);
  EXPECT_DOUBLE_EQ(kernels::sparse_mla::Count(p).flops, 2 * h * (d + 512) * e);
  EXPECT_DOUBLE_EQ(kernels::sparse_mla::Count(p).bytes, base - 2 * d * e + 656 * e + 4 * slots);
  EXPECT_DOUBLE_EQ(kernels::sparse_mla::CountSlots(p).bytes,
                   base - 2 * d * e + 656 * slots + 4 * slots);
  // The per-tensor FP8 cache: d_qk logical bytes (one code a column) per gathered row.
  spec.kv_format = KvFormat::kFp8PerTensor;
  SparseMlaCase c4(spec, rng, {{0, -1, 10}, {5, 5, 9}}, {});
  p = c4.MakeParams(false);
  EXPECT_DOUBLE_EQ(kernels::sparse_mla::Count(p).flops, 2 * h * (d + 512) * e);
  EXPECT_DOUBLE_EQ(kernels::sparse_mla::Count(p).bytes, base - 2 * d * e + d * e + 4 * slots);
}

}  // namespace
}  // namespace attnd::testing
