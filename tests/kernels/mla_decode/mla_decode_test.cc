// mla_decode: every implementation against the fp64 reference on fresh random data, one named
// case per edge case of the contract (docs/CONTRACTS.md "mla_decode").
#include "kernels/mla_decode/mla_decode.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/mla_decode/reference.h"
#include "tests/harness/harness.h"
#include "tests/harness/sparse_buffer.h"
#include "tests/kernels/mla_decode/decode_case.h"

namespace attnd::kernels::mla_decode {
namespace {

using testing::ExpectClose;

// Builds the case, runs every implementation in both precisions and checks out / lse against
// the reference. Returns the reference lse so callers can assert the case really has what it
// claims.
std::vector<double> CheckCase(const DecodeCase& c) {
  auto rng = testing::MakeRng();
  DecodeTensors t(c, rng);
  Params p = t.params();
  EXPECT_TRUE(Validate(p).ok()) << Validate(p);
  std::vector<double> ref_out, ref_lse, ref_abs;
  Reference(p, &ref_out, &ref_lse, &ref_abs);
  for (const Precision precision : testing::kPrecisions) {
    p.precision = precision;
    const int runs =
        testing::RunEachImpl(Implementations(), p, t.outputs(), [&](const std::string& impl) {
          testing::ExpectAttentionOut(testing::ToDoubles(t.out()), ref_out, ref_abs, precision,
                                      kOutTol, impl + " out");
          if (c.with_lse) {
            ExpectClose(testing::ToDoubles(t.lse()), ref_lse, kLseTol, impl + " lse");
            ExpectLseGapsPoisoned(t.lse(), impl);
          }
        });
    EXPECT_GE(runs, 1);
  }
  return ref_lse;
}

int CountEmptyRows(const std::vector<double>& lse) {
  int n = 0;
  for (double v : lse) n += std::isinf(v) ? 1 : 0;
  return n;
}

TEST(MlaDecode, SqOneNonCausal) {
  DecodeCase c;
  c.s_q = 1;
  c.seqlens = {130, 77};
  CheckCase(c);
}

TEST(MlaDecode, SqOneCausal) {
  DecodeCase c;
  c.s_q = 1;
  c.causal = true;
  c.seqlens = {130, 77};
  CheckCase(c);
}

TEST(MlaDecode, SqTwoNonCausal) {
  DecodeCase c;
  c.s_q = 2;
  c.seqlens = {130, 77};
  CheckCase(c);
}

// Query 0 of two sees one token less than query 1; at seqlen 1 query 0 sees nothing.
TEST(MlaDecode, SqTwoCausal) {
  DecodeCase c;
  c.s_q = 2;
  c.causal = true;
  c.seqlens = {130, 65, 1};
  const auto lse = CheckCase(c);
  EXPECT_EQ(CountEmptyRows(lse), c.heads);  // request 2, query 0
}

// s_q larger than the context: the leading queries see nothing (out 0, lse -inf).
TEST(MlaDecode, CausalQueriesBeyondContextAreEmpty) {
  DecodeCase c;
  c.s_q = 4;
  c.heads = 8;
  c.causal = true;
  c.seqlens = {2, 70};
  const auto lse = CheckCase(c);
  EXPECT_EQ(CountEmptyRows(lse), 2 * c.heads);
}

class MlaDecodeSeqlen : public ::testing::TestWithParam<int> {};
TEST_P(MlaDecodeSeqlen, AroundThePageBoundary) {
  for (bool causal : {false, true}) {
    DecodeCase c;
    c.s_q = 2;
    c.causal = causal;
    c.seqlens = {GetParam(), 3};
    const auto lse = CheckCase(c);
    if (GetParam() == 0) {
      EXPECT_GE(CountEmptyRows(lse), 2 * c.heads);
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Lengths, MlaDecodeSeqlen, ::testing::Values(0, 1, 63, 64, 65),
                         [](const auto& info) { return "L" + std::to_string(info.param); });

class MlaDecodeBatch : public ::testing::TestWithParam<int> {};
TEST_P(MlaDecodeBatch, OddBatchSizes) {
  DecodeCase c;
  c.heads = 4;
  c.s_q = 2;
  c.causal = true;
  std::mt19937_64 rng = testing::MakeRng();
  c.seqlens.clear();
  for (int b = 0; b < GetParam(); ++b) c.seqlens.push_back(static_cast<int32_t>(rng() % 200));
  CheckCase(c);
}
INSTANTIATE_TEST_SUITE_P(Sizes, MlaDecodeBatch, ::testing::Values(1, 3, 5),
                         [](const auto& info) { return "B" + std::to_string(info.param); });

class MlaDecodeHeads : public ::testing::TestWithParam<int> {};
TEST_P(MlaDecodeHeads, AnyHeadCount) {
  DecodeCase c;
  c.heads = GetParam();
  c.s_q = 2;
  c.causal = true;
  c.seqlens = {70, 129};
  CheckCase(c);
}
INSTANTIATE_TEST_SUITE_P(Heads, MlaDecodeHeads, ::testing::Values(1, 3, 16, 64, 128),
                         [](const auto& info) { return "H" + std::to_string(info.param); });

class MlaDecodeHeadDim : public ::testing::TestWithParam<int> {};
TEST_P(MlaDecodeHeadDim, RopeAndNoRope) {
  DecodeCase c;
  c.d_qk = GetParam();
  c.seqlens = {100, 64};
  CheckCase(c);
}
INSTANTIATE_TEST_SUITE_P(Dims, MlaDecodeHeadDim, ::testing::Values(576, 512),
                         [](const auto& info) { return "D" + std::to_string(info.param); });

// The per-tensor FP8 cache (CACHE_LAYOUT_FP8_576_PER_TENSOR / FP8_512_PER_TENSOR, vLLM's
// kv_cache_dtype "fp8"), every token row written by vLLM's writer rules from bf16 rows with
// subnormal and saturating values (tests/harness/fp8_kv.h), with a masked page. The CPU
// implementation dequantises e4m3 × kv_scale in f32 (one rounding of 2^-24 at most): it is held to
// the bf16 cache's bounds against the exact reference. The GPU kernels round each e4m3 × kv_scale
// to bf16 once (docs/ACCURACY.md "FP8 KV cache"), then run the bf16 path: they are held to the
// same bounds against the reference of that bf16-rounded cache, which is the exact one when the
// scale is a power of two.
void CheckFp8Case(const DecodeCase& c) {
  auto rng = testing::MakeRng();
  DecodeTensors t(c, rng);
  Params p = t.params();
  ASSERT_TRUE(Validate(p).ok()) << Validate(p);
  std::vector<double> exact_out, exact_lse, exact_abs, gpu_out, gpu_lse, gpu_abs;
  Reference(p, &exact_out, &exact_lse, &exact_abs);
  testing::HostTensor rounded = t.RoundedKvAsBf16();
  Params rp = p;
  rp.kv_cache = rounded.tensor();
  rp.kv_scale = 0;
  Reference(rp, &gpu_out, &gpu_lse, &gpu_abs);
  // kOutTol's absolute part is the f32 path's |Δout| ≲ 2·max|Δs|·max|v| with scores of N(0,1)
  // data (max|Δs| ~1e-7..1e-6) and |v| < 6 (decode_case.h). This cache's saturated codes decode
  // to 448·kv_scale (28 at 2^-4), and K and V are the same rows: the score error scales with
  // max|k| and the output error with max|v|, so that part scales with (max|v| / 6)^2 here: the
  // same derivation, not a wider bound (at 2^-4 the CPU's HIGH error reached 1.6e-5, and once
  // 1.1e-4 on a |ref| = 0.0128 element, against the unscaled 1e-5 and the linearly scaled
  // 4.7e-5).
  // kLseTol's absolute part is that score error plus f32 rounding: it scales with max|k| / 6.
  testing::Tolerance out_tol = kOutTol, lse_tol = kLseTol;
  const double v_range = std::max(1.0, 448.0 * static_cast<double>(c.fp8_kv_scale) / 6.0);
  out_tol.atol *= v_range * v_range;
  lse_tol.atol *= v_range;
  for (const Precision precision : testing::kPrecisions) {
    p.precision = precision;
    const int runs =
        testing::RunEachImpl(Implementations(), p, t.outputs(), [&](const std::string& impl) {
          const bool cpu = impl == "cpu";
          testing::ExpectAttentionOut(testing::ToDoubles(t.out()), cpu ? exact_out : gpu_out,
                                      cpu ? exact_abs : gpu_abs, precision, out_tol, impl + " out");
          ExpectClose(testing::ToDoubles(t.lse()), cpu ? exact_lse : gpu_lse, lse_tol,
                      impl + " lse");
        });
    EXPECT_GE(runs, 1);
  }
}

class MlaDecodeFp8PerTensor : public ::testing::TestWithParam<std::tuple<int, bool>> {};
TEST_P(MlaDecodeFp8PerTensor, FrontendBuiltCacheMatchesReference) {
  DecodeCase c;
  c.d_qk = std::get<0>(GetParam());
  c.fp8_kv_scale = std::get<1>(GetParam()) ? 0.03125f : 0.0371f;  // 2^-5, or calibrated-like
  c.s_q = 2;
  c.causal = true;
  c.heads = 16;
  c.seqlens = {130, 77, 1, 0};
  c.invalid_pages = {{0, 1}};
  CheckFp8Case(c);
}
INSTANTIATE_TEST_SUITE_P(Widths, MlaDecodeFp8PerTensor,
                         ::testing::Combine(::testing::Values(576, 512), ::testing::Bool()),
                         [](const auto& info) {
                           return "D" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_Pow2Scale" : "_OtherScale");
                         });

// Padded strides (rows not 16-byte multiples: the GPU copies one code at a time), odd page size,
// 128 heads, split contexts.
TEST(MlaDecodeFp8PerTensorShapes, PaddedStridesOddPagesManyHeads) {
  for (int64_t d_qk : {576, 512}) {
    DecodeCase c;
    c.d_qk = d_qk;
    c.fp8_kv_scale = 0.0625f;
    c.padded_strides = true;
    c.page_size = 13;
    c.heads = 128;
    c.seqlens = {300, 41};
    CheckFp8Case(c);
  }
}

// The per-tensor FP8 cache on 16-byte aligned rows (what the GPU's tensor-core kernel reads, as
// well as SIMT): H 16, 64 and 128 (one to four 64-row blocks), s_q 1 and 2 causal, page size 64
// and 37 (a tile spans pages), a calibrated-like scale, invalid page ids (-1 and num_pages, which
// land on NaN guard pages), lengths around the 64-token tile and one long enough to split.
class MlaDecodeFp8PerTensorAligned : public ::testing::TestWithParam<std::tuple<int, int, int>> {};
TEST_P(MlaDecodeFp8PerTensorAligned, HeadsPagesCausal) {
  for (const int64_t s_q : {1, 2}) {
    SCOPED_TRACE("s_q " + std::to_string(s_q));
    DecodeCase c;
    c.d_qk = std::get<0>(GetParam());
    c.heads = std::get<1>(GetParam());
    c.page_size = std::get<2>(GetParam());
    c.fp8_kv_scale = 0.0371f;
    c.s_q = s_q;
    c.causal = true;
    c.seqlens = {700, 64, 129, 1};
    c.invalid_pages = {{0, 1}, {2, 1}};
    const int64_t num_pages = 4 * ((700 + c.page_size - 1) / c.page_size) + c.spare_pages;
    c.invalid_ids = {-1, static_cast<int32_t>(num_pages)};
    CheckFp8Case(c);
  }
}
INSTANTIATE_TEST_SUITE_P(Shapes, MlaDecodeFp8PerTensorAligned,
                         ::testing::Combine(::testing::Values(576, 512),
                                            ::testing::Values(16, 64, 128),
                                            ::testing::Values(64, 37)),
                         [](const auto& info) {
                           return "D" + std::to_string(std::get<0>(info.param)) + "_H" +
                                  std::to_string(std::get<1>(info.param)) + "_P" +
                                  std::to_string(std::get<2>(info.param));
                         });

// Pages of every request shuffled over the whole cache, a table wider than needed, and page
// sizes other than 64 (tokens of a tile then come from several pages).
TEST(MlaDecode, PermutedBlockTableOddPageCounts) {
  DecodeCase c;
  c.seqlens = {320, 5, 191};
  c.max_pages = 7;
  c.spare_pages = 5;
  CheckCase(c);
}

class MlaDecodePageSize : public ::testing::TestWithParam<int> {};
TEST_P(MlaDecodePageSize, AnyPageSize) {
  DecodeCase c;
  c.page_size = GetParam();
  c.s_q = 2;
  c.causal = true;
  c.seqlens = {150, 17};
  CheckCase(c);
}
INSTANTIATE_TEST_SUITE_P(Pages, MlaDecodePageSize, ::testing::Values(1, 13, 64, 100),
                         [](const auto& info) { return "P" + std::to_string(info.param); });

// Ids -1, num_pages (both land on NaN guard pages if read) and extremes mask their tokens.
TEST(MlaDecode, InvalidPageIdsAreMasked) {
  DecodeCase c;
  c.s_q = 2;
  c.causal = true;
  c.seqlens = {256, 130, 64};
  c.spare_pages = 0;
  c.invalid_pages = {{0, 1}, {0, 3}, {1, 0}, {2, 0}};
  const int64_t num_pages = 3 * 4;
  c.invalid_ids = {-1, static_cast<int32_t>(num_pages), 2147483647, -2147483647 - 1};
  const auto lse = CheckCase(c);
  EXPECT_EQ(CountEmptyRows(lse), 2 * c.heads);  // request 2's only page is invalid
}

// Every dimension of every tensor padded (strided views of a larger cache, table and outputs).
TEST(MlaDecode, PaddedStrides) {
  DecodeCase c;
  c.s_q = 2;
  c.causal = true;
  c.padded_strides = true;
  c.seqlens = {129, 40};
  c.invalid_pages = {{0, 1}};
  CheckCase(c);
}

// Lengths are data: negative ones clamp to 0, ones past the table's capacity to the capacity.
TEST(MlaDecode, SeqlensAreClamped) {
  DecodeCase c;
  c.max_pages = 2;
  c.seqlens = {-5, 100000, 70};
  const auto lse = CheckCase(c);
  EXPECT_EQ(CountEmptyRows(lse), c.heads);
}

TEST(MlaDecode, WithoutLse) {
  DecodeCase c;
  c.with_lse = false;
  c.seqlens = {90};
  CheckCase(c);
}

// lse as a view of FlashMLA's [B, H, s_q] (docs/CONTRACTS.md "Strided lse"), with and without
// padding between head rows: s_q 1 (a plain decode step) and s_q 3 causal (speculative tokens;
// query 0 of the 2-token request sees nothing: lse -inf through the strides); context long
// enough that the GPU kernels split it and the combine writes lse.
TEST(MlaDecode, LseInFlashMlaLayout) {
  for (const int64_t pad : {0, 5}) {
    for (const int64_t s_q : {1, 3}) {
      SCOPED_TRACE("pad " + std::to_string(pad) + " s_q " + std::to_string(s_q));
      DecodeCase c;
      c.heads = 16;
      c.s_q = s_q;
      c.causal = s_q > 1;
      c.seqlens = {1500, 2, 77};
      c.lse_head_major = true;
      c.lse_pad = pad;
      const auto lse = CheckCase(c);
      if (s_q > 1) {
        EXPECT_GT(CountEmptyRows(lse), 0);
      }
    }
  }
}

// Long contexts with a single row block: the tokens are split across threads and combined.
// Split ranges at the end of the shorter request are empty and must read nothing.
TEST(MlaDecode, SplitContextCombine) {
  DecodeCase c;
  c.heads = 8;
  c.s_q = 2;
  c.causal = true;
  c.seqlens = {2000, 300};
  c.invalid_pages = {{0, 5}, {0, 6}, {0, 7}, {0, 8}, {0, 9}, {0, 10}, {1, 0}};
  c.invalid_ids = {-1, 2000};
  CheckCase(c);
}

TEST(MlaDecode, SplitContextAllMaskedSplit) {
  DecodeCase c;
  c.heads = 2;
  c.seqlens = {1500};
  // Pages 0..15 invalid: the first splits see only masked tokens.
  for (int64_t j = 0; j < 16; ++j) c.invalid_pages.push_back({0, j});
  CheckCase(c);
}

// A cache view whose page stride puts page 2 past 2^31 elements (4 GiB): every offset must be
// 64-bit. Only the three pages used are backed by memory.
TEST(MlaDecode, OffsetsPast2To31Elements) {
  constexpr int64_t kPage = 64, kD = 576, kPageStride = (int64_t{1} << 30) + kD;
  testing::SparseBuffer kv_mem((2 * kPageStride + kPage * kD) * 2);
  if (kv_mem.data() == nullptr) GTEST_SKIP() << "no 4 GiB of address space";
  Tensor kv = MakeStridedTensor(kv_mem.data(), DType::kBF16, {3, kPage, kD}, {kPageStride, kD, 1});
  auto rng = testing::MakeRng();
  std::normal_distribution<float> dist;
  for (int64_t page = 0; page < 3; ++page) {
    for (int64_t i = 0; i < kPage * kD; ++i) {
      kv.ptr<bf16_t>()[page * kPageStride + i] = FloatToBf16(dist(rng));
    }
  }
  DecodeCase c;
  c.s_q = 2;
  c.heads = 4;
  c.causal = true;
  c.seqlens = {150};  // pages 2, 0, 1 in that order (the last partly)
  DecodeTensors t(c, rng);
  Params p = t.params();
  p.kv_cache = kv;
  int32_t table[3] = {2, 0, 1};
  p.block_table = MakeTensor(table, DType::kI32, {1, 3});
  ASSERT_TRUE(Validate(p).ok()) << Validate(p);
  std::vector<double> ref_out, ref_lse, ref_abs;
  Reference(p, &ref_out, &ref_lse, &ref_abs);
  for (const Precision precision : testing::kPrecisions) {
    p.precision = precision;
    const int runs =
        testing::RunEachImpl(Implementations(), p, t.outputs(), [&](const std::string& impl) {
          testing::ExpectAttentionOut(testing::ToDoubles(t.out()), ref_out, ref_abs, precision,
                                      kOutTol, impl + " out");
          ExpectClose(testing::ToDoubles(t.lse()), ref_lse, kLseTol, impl + " lse");
        });
    EXPECT_GE(runs, 1);
  }
}

TEST(MlaDecode, RunDispatchesToCpu) {
  auto rng = testing::MakeRng();
  DecodeCase c;
  c.seqlens = {10};
  DecodeTensors t(c, rng);
  ExecContext ctx;
  ctx.pool = testing::TestPool();
  std::string impl;
  ASSERT_TRUE(mla_decode::Run(t.params(), ctx, &impl).ok());
  EXPECT_EQ(impl, "cpu");
  Params bad = t.params();
  bad.sm_scale = -1;
  EXPECT_EQ(mla_decode::Run(bad, ctx).code(), absl::StatusCode::kInvalidArgument);
}

// FLOPs count visible readable tokens per row; bytes count each readable token once.
TEST(MlaDecode, CountsVisibleWork) {
  auto rng = testing::MakeRng();
  DecodeCase c;
  c.s_q = 2;
  c.heads = 4;
  c.causal = true;
  c.seqlens = {130, 0};
  c.invalid_pages = {{0, 1}};  // tokens 64..127 masked: 66 readable, rows see 65 and 66
  DecodeTensors t(c, rng);
  const WorkCount w = Count(t.params());
  EXPECT_DOUBLE_EQ(w.flops, 2.0 * 4 * (576 + 512) * (65 + 66));
  const double rows = 2 * 2 * 4;
  EXPECT_DOUBLE_EQ(w.bytes,
                   2 * rows * 576 + 2 * 576 * 66.0 + 2 * rows * 512 + 4 * rows + 4 * 2 * (3 + 1));
}

}  // namespace
}  // namespace attnd::kernels::mla_decode
