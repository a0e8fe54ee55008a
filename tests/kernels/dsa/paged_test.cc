// The paged DsaAttention (decode over the frontend's indexer cache and MLA cache with their block
// tables) against an fp64 reference composed from the steps' references: the paged indexer's
// logits give each token's true top-k positions, the block table gives the kv row of each
// position (the call's indices must be those rows, in ascending position order, then -1), and
// sparse MLA's reference on those rows gives out and lse (paged_check.h). Runs every
// implementation the build has (the GPU ones on a device: dsa_test --gtest_filter='*PagedDsa*').
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dsa/cpu.h"
#include "kernels/dsa/dsa.h"
#include "tests/harness/harness.h"
#include "tests/kernels/dsa/paged_case.h"
#include "tests/kernels/dsa/paged_check.h"

namespace attnd::testing {
namespace {

using kernels::DType;
using kernels::dsa::Params;

TEST(PagedDsa, NextN1SharedTableRaggedContexts) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;  // block 16, 8 blocks: positions 0..127, top-64
  spec.batch = 4;
  PagedDsaCase c(spec, rng);
  // top-64 of 70; fewer than k (every position chosen); the whole table; one position.
  c.SetContexts({70, 3, 128, 1});
  ExpectMatchesReference(c);
}

TEST(PagedDsa, NextN2PerRequestLengthsFp8Kv) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.next_n = 2;
  spec.fp8_kv = true;
  spec.pad = 4;
  PagedDsaCase c(spec, rng);
  // Token j of request b sees L − 2 + j + 1: 69/70, 0/1 (an empty window), 99/100.
  c.SetContexts({70, 1, 100});
  ExpectMatchesReference(c);
}

TEST(PagedDsa, NextN2PerTokenLengthsBf16) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.next_n = 2;
  spec.per_token_lens = true;
  spec.pad = 3;
  PagedDsaCase c(spec, rng);
  c.SetContexts({37, 90, 128});
  c.SetTokenLength(0, 1, 0);     // varlen padding: empty
  c.SetTokenLength(1, 0, 90);    // not increasing along j
  c.SetTokenLength(2, 1, 5000);  // past the table: clamped to 128
  ExpectMatchesReference(c);
}

// Separate tables: SGLang's token-granular MLA table (page 1), and a page-32 table whose pool
// interleaves other layers' rows (48 rows per block, 16 of them poison).
TEST(PagedDsa, SeparateKvTablePageOne) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.next_n = 2;
  spec.separate_kv_table = true;
  spec.kv_block_size = 1;
  spec.kv_blocks = 600;
  PagedDsaCase c(spec, rng);
  c.SetContexts({50, 128, 9});
  ExpectMatchesReference(c);
}

TEST(PagedDsa, SeparateKvTableInterleavedBlocksFp8) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.separate_kv_table = true;
  spec.kv_block_size = 32;
  spec.kv_block_stride = 48;
  spec.kv_blocks = 20;
  spec.fp8_kv = true;
  PagedDsaCase c(spec, rng);
  c.SetContexts({100, 33, 64});
  ExpectMatchesReference(c);
}

// vLLM's per-tensor FP8 MLA cache (kv_cache_dtype "fp8") through the paged form, at d_qk 576 and
// 512 (no rope), with a power-of-two kv_scale and 0.0371; an interleaved pool whose other layers'
// rows are NaN codes, next_n 2, one request with an empty window. Both bounds as DsaPerTensorKv
// (dsa_test.cc).
class PagedDsaPerTensorKv : public ::testing::TestWithParam<std::tuple<int64_t, float>> {};

TEST_P(PagedDsaPerTensorKv, MatchesReference) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  std::tie(spec.d_qk, spec.kv_scale) = GetParam();
  spec.per_tensor_kv = true;
  spec.batch = 4;
  spec.next_n = 2;
  spec.separate_kv_table = true;
  spec.kv_block_size = 32;
  spec.kv_block_stride = 40;
  spec.kv_blocks = 20;
  spec.pad = 5;
  PagedDsaCase c(spec, rng);
  c.SetContexts({100, 1, 128, 40});  // request 1: token 0 sees nothing
  const Params p = c.MakeParams();
  ASSERT_EQ(p.kv.dtype, DType::kU8);
  ASSERT_EQ(p.kv.dim(1), spec.d_qk);
  ExpectMatchesReference(c, /*gpu_on_rounded_kv=*/spec.kv_scale != 0.03125f);
}

INSTANTIATE_TEST_SUITE_P(Layouts, PagedDsaPerTensorKv,
                         ::testing::Combine(::testing::Values(576, 512),
                                            ::testing::Values(0.03125f, 0.0371f)),
                         [](const auto& info) {
                           return "d" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == 0.03125f ? "_Pow2Scale"
                                                                       : "_OtherScale");
                         });

TEST(PagedDsa, SharedTableInterleavedLayers) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.kv_block_stride = 40;  // 16 rows of this layer, 24 of others', per block
  PagedDsaCase c(spec, rng);
  c.SetContexts({65, 128, 17});
  ExpectMatchesReference(c);
}

// (H_i, D_i, H, d_qk, FP8 KV): DeepSeek-V3.2 (block 64, FP8 cache), GLM-5 (d_qk 512), a small
// odd indexer.
class PagedDsaShapes
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>> {};

TEST_P(PagedDsaShapes, MatchesReference) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  std::tie(spec.index_heads, spec.index_dim, spec.heads, spec.d_qk, spec.fp8_kv) = GetParam();
  spec.batch = 2;
  spec.next_n = 2;
  spec.index_block_size = 64;
  spec.max_blocks = 4;
  spec.index_blocks = 12;
  spec.topk = 128;
  PagedDsaCase c(spec, rng);
  c.SetContexts({200, 77});
  ExpectMatchesReference(c);
}

INSTANTIATE_TEST_SUITE_P(Models, PagedDsaShapes,
                         ::testing::Values(std::make_tuple(64, 128, 128, 576, true),
                                           std::make_tuple(32, 128, 64, 512, false),
                                           std::make_tuple(5, 64, 8, 576, false)),
                         [](const auto& info) {
                           return "Hi" + std::to_string(std::get<0>(info.param)) + "_Di" +
                                  std::to_string(std::get<1>(info.param)) + "_H" +
                                  std::to_string(std::get<2>(info.param)) + "_d" +
                                  std::to_string(std::get<3>(info.param)) +
                                  (std::get<4>(info.param) ? "_fp8" : "_bf16");
                         });

TEST(PagedDsa, CallerLogitsAreCleanedPerToken) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.next_n = 2;
  spec.with_logits = true;
  spec.pad = 5;
  PagedDsaCase c(spec, rng);
  c.SetContexts({70, 2, 128});
  ExpectMatchesReference(c);
  const Params p = c.MakeParams();
  for (int64_t row = 0; row < c.t(); ++row) {
    const int64_t visible = ExpectedLength(p, row / 2, row % 2);
    for (int64_t col = 0; col < p.logits.dim(1); ++col) {
      const double v = c.logits().At({row, col});
      if (col < visible) {
        ASSERT_TRUE(std::isfinite(v)) << "row " << row << " col " << col;
      } else {
        ASSERT_EQ(v, -std::numeric_limits<double>::infinity()) << "row " << row << " col " << col;
      }
    }
  }
}

// index_precision FAST through the paged indexer at the FP8 kernel's shape (H_i 64, D_i 128,
// block 64), next_n 2: every implementation's selection within FAST's bound and its out / lse
// within the attention bounds. The CPU implementation runs a FAST indexer as the exact sums
// (docs/ACCURACY.md "Indexer logits, FAST"), so its FAST call is bit for bit its HIGH one.
TEST(PagedDsa, IndexPrecisionFastRunsAndValidates) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec = FastIndexerSpec();
  spec.with_logits = true;
  PagedDsaCase c(spec, rng);
  c.SetContexts({150, 1, 192});  // token 0 of request 1 sees nothing
  ExpectMatchesReference(c, /*gpu_on_rounded_kv=*/false, kernels::Precision::kFast);

  Params p = c.MakeParams();
  p.index_precision = kernels::Precision::kFast;
  ASSERT_TRUE(kernels::dsa::Validate(p).ok()) << kernels::dsa::Validate(p);
  EXPECT_EQ(kernels::dsa::PagedIndexerStep(p, 0, c.t(), p.logits).precision,
            kernels::Precision::kFast);
  ExpectCpuIndexPrecisionsAgree(p, c.Outputs(), {&c.logits(), &c.indices(), &c.out(), &c.lse()},
                                [&](const Params& q) { ExpectPagedTopk(q, c.indices()); });
}

// Blocks of whole requests: 1 and 2 requests' logits per block give the bits of one block.
TEST(PagedDsa, SmallScratchBlocksGiveTheSameBits) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.batch = 5;
  spec.next_n = 2;
  PagedDsaCase c(spec, rng);
  c.SetContexts({70, 1, 128, 40, 9});
  const Params p = c.MakeParams();
  kernels::ExecContext ctx;
  ctx.pool = TestPool();
  for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
  ASSERT_TRUE(kernels::dsa::RunCpuWithScratch(p, ctx, kernels::dsa::kScratchBytes).ok());
  const std::vector<uint8_t> out = Bits(c.out()), lse = Bits(c.lse()), idx = Bits(c.indices());
  const int64_t row_bytes = kernels::dsa::LogitsColumns(p) * 4;
  for (int64_t bytes : {2 * row_bytes, 4 * row_bytes, 1 * row_bytes}) {  // 1, 2, 1 request(s)
    for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
    ASSERT_TRUE(kernels::dsa::RunCpuWithScratch(p, ctx, bytes).ok());
    EXPECT_EQ(Bits(c.out()), out) << bytes << " scratch bytes";
    EXPECT_EQ(Bits(c.lse()), lse) << bytes << " scratch bytes";
    EXPECT_EQ(Bits(c.indices()), idx) << bytes << " scratch bytes";
  }
  ExpectPagedTopk(p, c.indices());
}

TEST(PagedDsa, IndicesAndLseOptional) {
  std::mt19937_64 rng = MakeRng();
  std::mt19937_64 rng_copy = rng;
  PagedDsaSpec spec;
  spec.next_n = 2;
  PagedDsaCase full(spec, rng);
  spec.with_indices = false;
  spec.with_lse = false;
  PagedDsaCase bare(spec, rng_copy);  // the same inputs
  full.SetContexts({70, 5, 100});
  bare.SetContexts({70, 5, 100});
  ExpectMatchesReference(full);
  std::map<std::string, std::vector<uint8_t>> full_out;
  RunEachImpl(kernels::dsa::Implementations(), full.MakeParams(), full.Outputs(),
              [&](const std::string& impl) { full_out[impl] = Bits(full.out()); });
  const int runs = RunEachImpl(
      kernels::dsa::Implementations(), bare.MakeParams(), bare.Outputs(),
      [&](const std::string& impl) { EXPECT_EQ(Bits(bare.out()), full_out[impl]) << impl; });
  EXPECT_GE(runs, 1);
}

TEST(PagedDsa, ZeroRequestsIsANoOp) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.batch = 0;
  PagedDsaCase c(spec, rng);
  const Params p = c.MakeParams();
  EXPECT_TRUE(kernels::dsa::Validate(p).ok()) << kernels::dsa::Validate(p);
  EXPECT_GE(RunEachImpl(kernels::dsa::Implementations(), p, c.Outputs(), [](const std::string&) {}),
            1);
}

// N comes from scalars and the table's width, not from data the call sends: a request whose
// logits would take more than kMaxScratchBytes is RESOURCE_EXHAUSTED on the CPU, not an attempt
// to allocate them (here 2^29 positions over an empty indexer cache).
TEST(PagedDsa, HugeLogitsScratchIsResourceExhausted) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaCase c(PagedDsaSpec{}, rng);
  Params p = c.MakeParams();
  p.index_block_size = int64_t{1} << 26;  // 8 table columns: N = 2^29
  p.index_cache = kernels::MakeTensor(nullptr, DType::kU8, {0, p.index_block_size * (128 + 4)});
  ASSERT_TRUE(kernels::dsa::Validate(p).ok()) << kernels::dsa::Validate(p);
  kernels::ExecContext ctx;
  ctx.pool = TestPool();
  const absl::Status s = kernels::dsa::RunCpu(p, ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

// FLOPs: the paged indexer's over each token's visible positions plus sparse MLA's over
// min(k, visible) rows per token.
TEST(PagedDsa, CountFollowsVisibleLengths) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.next_n = 2;
  PagedDsaCase c(spec, rng);
  c.SetContexts({70, 1, 128});
  const Params p = c.MakeParams();
  double pairs = 0, selections = 0;
  for (int64_t row = 0; row < c.t(); ++row) {
    const int64_t visible = ExpectedLength(p, row / 2, row % 2);
    pairs += static_cast<double>(visible);
    selections += static_cast<double>(std::min(spec.topk, visible));
  }
  const kernels::WorkCount w = kernels::dsa::Count(p);
  const double expected =
      2.0 * static_cast<double>(spec.index_heads * spec.index_dim) * pairs +
      2.0 * static_cast<double>(spec.heads) * static_cast<double>(spec.d_qk + 512) * selections;
  EXPECT_DOUBLE_EQ(w.flops, expected);
  EXPECT_GT(w.bytes, 0.0);
}

}  // namespace
}  // namespace attnd::testing
