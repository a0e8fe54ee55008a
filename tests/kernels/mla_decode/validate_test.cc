// mla_decode::Validate: one row per malformed input, each rejected with INVALID_ARGUMENT and a
// message that starts with the offending tensor's (or scalar's) name.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/mla_decode/mla_decode.h"
#include "tests/harness/harness.h"
#include "tests/kernels/mla_decode/decode_case.h"

namespace attnd::kernels::mla_decode {
namespace {

struct Mutation {
  const char* what;
  const char* name;  // the tensor or scalar the message must start with
  std::function<void(Params&)> apply;
};

void SetDim(Tensor& t, int d, int64_t v) { t.shape[d] = v; }

const std::vector<Mutation>& Mutations() {
  static const auto* rows = new std::vector<Mutation>{
      {"q missing", "q", [](Params& p) { p.q = Tensor(); }},
      {"q dtype", "q", [](Params& p) { p.q.dtype = DType::kF32; }},
      {"q rank", "q", [](Params& p) { p.q.rank = 3; }},
      {"q negative batch", "q", [](Params& p) { SetDim(p.q, 0, -1); }},
      {"q negative s_q", "q", [](Params& p) { SetDim(p.q, 1, -2); }},
      {"q zero heads", "q", [](Params& p) { SetDim(p.q, 2, 0); }},
      {"q 129 heads", "q", [](Params& p) { SetDim(p.q, 2, 129); }},
      {"q d_qk 575", "q", [](Params& p) { SetDim(p.q, 3, 575); }},
      {"q d_qk 192", "q", [](Params& p) { SetDim(p.q, 3, 192); }},
      {"q last dim strided", "q", [](Params& p) { p.q.strides[3] = 2; }},
      {"q head stride overlaps", "q", [](Params& p) { p.q.strides[2] = 100; }},
      {"q negative stride", "q", [](Params& p) { p.q.strides[0] = -1; }},
      {"q null data", "q", [](Params& p) { p.q.data = nullptr; }},
      {"kv_cache missing", "kv_cache", [](Params& p) { p.kv_cache = Tensor(); }},
      {"kv_cache dtype", "kv_cache", [](Params& p) { p.kv_cache.dtype = DType::kFp8E4M3; }},
      {"kv_cache rank", "kv_cache", [](Params& p) { p.kv_cache.rank = 2; }},
      {"kv_cache d_qk differs from q", "kv_cache", [](Params& p) { SetDim(p.kv_cache, 2, 512); }},
      {"kv_cache page size 0", "kv_cache", [](Params& p) { SetDim(p.kv_cache, 1, 0); }},
      {"kv_cache negative pages", "kv_cache", [](Params& p) { SetDim(p.kv_cache, 0, -3); }},
      {"kv_cache token stride overlaps", "kv_cache",
       [](Params& p) { p.kv_cache.strides[1] = 100; }},
      {"kv_cache page stride overflows", "kv_cache",
       [](Params& p) { p.kv_cache.strides[0] = std::numeric_limits<int64_t>::max() / 2; }},
      {"block_table missing", "block_table", [](Params& p) { p.block_table = Tensor(); }},
      {"block_table dtype", "block_table", [](Params& p) { p.block_table.dtype = DType::kF32; }},
      {"block_table rank", "block_table", [](Params& p) { p.block_table.rank = 1; }},
      {"block_table batch", "block_table", [](Params& p) { SetDim(p.block_table, 0, 3); }},
      {"block_table negative width", "block_table",
       [](Params& p) { SetDim(p.block_table, 1, -1); }},
      {"cache_seqlens missing", "cache_seqlens", [](Params& p) { p.cache_seqlens = Tensor(); }},
      {"cache_seqlens dtype", "cache_seqlens",
       [](Params& p) { p.cache_seqlens.dtype = DType::kBF16; }},
      {"cache_seqlens rank", "cache_seqlens", [](Params& p) { p.cache_seqlens.rank = 2; }},
      {"cache_seqlens batch", "cache_seqlens", [](Params& p) { SetDim(p.cache_seqlens, 0, 1); }},
      {"out missing", "out", [](Params& p) { p.out = Tensor(); }},
      {"out dtype", "out", [](Params& p) { p.out.dtype = DType::kF32; }},
      {"out rank", "out", [](Params& p) { p.out.rank = 3; }},
      {"out batch", "out", [](Params& p) { SetDim(p.out, 0, 1); }},
      {"out s_q", "out", [](Params& p) { SetDim(p.out, 1, 3); }},
      {"out heads", "out", [](Params& p) { SetDim(p.out, 2, 15); }},
      {"out width 576", "out", [](Params& p) { SetDim(p.out, 3, 576); }},
      {"out last dim strided", "out", [](Params& p) { p.out.strides[3] = 0; }},
      {"lse dtype", "lse", [](Params& p) { p.lse.dtype = DType::kBF16; }},
      {"lse rank", "lse", [](Params& p) { p.lse.rank = 2; }},
      {"lse heads", "lse", [](Params& p) { SetDim(p.lse, 2, 17); }},
      {"lse s_q", "lse", [](Params& p) { SetDim(p.lse, 1, 1); }},
      // Any layout whose elements cannot share an address is fine (docs/CONTRACTS.md "Strided
      // lse"); these overlap. B = 2, s_q = 2, H = 16.
      {"lse heads and s_q both unit stride", "lse",
       [](Params& p) { p.lse.strides[1] = p.lse.strides[2] = 1; }},
      {"lse [B, H, s_q] view with batch stride 31 < H·s_q", "lse",
       [](Params& p) {
         p.lse.strides[0] = 31;
         p.lse.strides[1] = 1;
         p.lse.strides[2] = 2;
       }},
      {"lse batch stride 31 < 32", "lse", [](Params& p) { p.lse.strides[0] = 31; }},
      {"lse head stride 0", "lse", [](Params& p) { p.lse.strides[2] = 0; }},
      {"lse negative s_q stride", "lse", [](Params& p) { p.lse.strides[1] = -16; }},
      {"sm_scale NaN", "sm_scale", [](Params& p) { p.sm_scale = std::nanf(""); }},
      {"sm_scale inf", "sm_scale",
       [](Params& p) { p.sm_scale = std::numeric_limits<float>::infinity(); }},
      {"sm_scale zero", "sm_scale", [](Params& p) { p.sm_scale = 0; }},
      {"sm_scale negative", "sm_scale", [](Params& p) { p.sm_scale = -0.1f; }},
  };
  return *rows;
}

DecodeCase BaseCase() {
  DecodeCase c;
  c.s_q = 2;
  c.heads = 16;
  c.seqlens = {70, 5};
  return c;
}

TEST(MlaDecodeValidate, BaseCaseIsValid) {
  auto rng = testing::MakeRng();
  DecodeTensors t(BaseCase(), rng);
  EXPECT_TRUE(Validate(t.params()).ok()) << Validate(t.params());
}

TEST(MlaDecodeValidate, EachMutationIsRejectedNamingTheTensor) {
  auto rng = testing::MakeRng();
  DecodeTensors t(BaseCase(), rng);
  for (const Mutation& m : Mutations()) {
    Params p = t.params();
    m.apply(p);
    const absl::Status s = Validate(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << m.what << ": " << s;
    EXPECT_TRUE(absl::StartsWith(s.message(), std::string(m.name) + ":") ||
                absl::StartsWith(s.message(), std::string(m.name) + " "))
        << m.what << ": message \"" << s.message() << "\" does not name " << m.name;
  }
}

// Shapes the contract allows at its edges: empty batch, s_q 0, one head, 128 heads, d_qk 512,
// page size 1, a table with no pages, and lse absent.
// The per-tensor FP8 cache (u8 codes with kv_scale): a valid call, then one row per malformed
// input.
const std::vector<Mutation>& Fp8Mutations() {
  static const auto* rows = new std::vector<Mutation>{
      {"fp8 kv_scale missing", "kv_scale", [](Params& p) { p.kv_scale = 0; }},
      {"fp8 kv_scale negative", "kv_scale", [](Params& p) { p.kv_scale = -2.0f; }},
      {"fp8 kv_scale NaN", "kv_scale", [](Params& p) { p.kv_scale = std::nanf(""); }},
      {"fp8 kv_scale inf", "kv_scale",
       [](Params& p) { p.kv_scale = std::numeric_limits<float>::infinity(); }},
      {"fp8 kv_cache dtype fp8_e4m3", "kv_cache",
       [](Params& p) { p.kv_cache.dtype = DType::kFp8E4M3; }},
      {"fp8 kv_cache dtype i32", "kv_cache", [](Params& p) { p.kv_cache.dtype = DType::kI32; }},
      {"fp8 kv_cache 512 wide with q d_qk 576", "kv_cache",
       [](Params& p) { SetDim(p.kv_cache, 2, 512); }},
      {"fp8 kv_cache token stride overlaps", "kv_cache",
       [](Params& p) { p.kv_cache.strides[1] = 100; }},
      {"fp8 named FP8_512 on 576-wide rows", "kv_cache_layout",
       [](Params& p) { p.kv_cache_layout = CacheLayout::kFp8_512PerTensor; }},
      {"fp8 named BF16_576 on u8 rows", "kv_cache_layout",
       [](Params& p) { p.kv_cache_layout = CacheLayout::kBf16_576; }},
      {"fp8 named FLASHMLA_FP8_656 (not read here)", "kv_cache_layout",
       [](Params& p) { p.kv_cache_layout = CacheLayout::kFlashMlaFp8_656; }},
  };
  return *rows;
}

TEST(MlaDecodeValidate, PerTensorFp8CacheAndItsScale) {
  auto rng = testing::MakeRng();
  DecodeCase c = BaseCase();
  c.fp8_kv_scale = 0.25f;
  DecodeTensors t(c, rng);
  Params good = t.params();
  ASSERT_TRUE(Validate(good).ok()) << Validate(good);
  good.kv_cache_layout = CacheLayout::kFp8_576PerTensor;
  EXPECT_TRUE(Validate(good).ok()) << Validate(good);
  for (const Mutation& m : Fp8Mutations()) {
    Params p = t.params();
    m.apply(p);
    const absl::Status s = Validate(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << m.what << ": " << s;
    EXPECT_TRUE(absl::StartsWith(s.message(), std::string(m.name) + ":"))
        << m.what << ": message \"" << s.message() << "\" does not name " << m.name;
  }
  Params p = t.params();
  p.kv_scale = 0;
  EXPECT_EQ(Validate(p).message(),
            "kv_scale: missing: kv_cache is per-tensor FP8 (u8 [..., 576]), whose values are e4m3 "
            "x kv_scale");
  // A bf16 cache with a scale.
  DecodeTensors b(BaseCase(), rng);
  p = b.params();
  p.kv_scale = 0.5f;
  EXPECT_EQ(Validate(p).message(),
            "kv_scale: is 0.5, but kv_cache is bf16 (no scale): leave it unset (0)");
  // d_qk 512 (GLM-5.3-Flash): inferred and named.
  c.d_qk = 512;
  DecodeTensors g(c, rng);
  p = g.params();
  EXPECT_TRUE(Validate(p).ok()) << Validate(p);
  p.kv_cache_layout = CacheLayout::kFp8_512PerTensor;
  EXPECT_TRUE(Validate(p).ok()) << Validate(p);
}

TEST(MlaDecodeValidate, EdgeShapesAreAccepted) {
  auto rng = testing::MakeRng();
  for (int64_t heads : {1, 128}) {
    DecodeCase c = BaseCase();
    c.heads = heads;
    c.d_qk = 512;
    c.page_size = 1;
    c.with_lse = false;
    DecodeTensors t(c, rng);
    EXPECT_TRUE(Validate(t.params()).ok()) << Validate(t.params());
  }
  DecodeTensors t(BaseCase(), rng);
  Params p = t.params();
  SetDim(p.block_table, 1, 0);
  EXPECT_TRUE(Validate(p).ok()) << Validate(p);
  p = t.params();
  for (Tensor* x : {&p.q, &p.out, &p.lse}) SetDim(*x, 1, 0);
  EXPECT_TRUE(Validate(p).ok()) << Validate(p);
  p = t.params();
  for (Tensor* x : {&p.q, &p.out, &p.lse, &p.block_table, &p.cache_seqlens}) SetDim(*x, 0, 0);
  EXPECT_TRUE(Validate(p).ok()) << Validate(p);
  // lse in any non-overlapping order (docs/CONTRACTS.md "Strided lse"): FlashMLA's [B, H, s_q]
  // seen as [B, s_q, H], with or without padding; Validate does not read it.
  for (const int64_t row : {2, 7}) {
    p = t.params();
    p.lse.strides[0] = 16 * row;
    p.lse.strides[1] = 1;
    p.lse.strides[2] = row;
    EXPECT_TRUE(Validate(p).ok()) << row << ": " << Validate(p);
  }
}

}  // namespace
}  // namespace attnd::kernels::mla_decode
