// The paged DsaAttention's multi-token (MTP) and hostile-data cases against the fp64 reference
// (paged_check.h): next_n 3 and 4 with each token's own visible length, table entries out of
// range of either pool, and extreme context lengths. Table entries and lengths are data, masked
// or clamped rather than refused (docs/CONTRACTS.md "dsa_attention", "Paged form"). Runs every
// implementation the build has (the GPU ones on a device: dsa_test --gtest_filter='*PagedDsa*').
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dsa/dsa.h"
#include "kernels/sparse_mla/reference.h"
#include "tests/harness/harness.h"
#include "tests/kernels/dsa/paged_case.h"
#include "tests/kernels/dsa/paged_check.h"

namespace attnd::testing {
namespace {

using kernels::dsa::Params;

constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();

// (next_n, FP8 KV, per-token lengths): speculative decoding with 2 and 3 draft tokens.
class PagedDsaNextN : public ::testing::TestWithParam<std::tuple<int64_t, bool, bool>> {};

TEST_P(PagedDsaNextN, MatchesReference) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;  // block 16, 8 blocks: positions 0..127, top-64
  std::tie(spec.next_n, spec.fp8_kv, spec.per_token_lens) = GetParam();
  spec.batch = 5;
  spec.pad = 3;
  PagedDsaCase c(spec, rng);
  // Token j of a request of L sees L − next_n + j + 1: 70 (more than k), 2 (shorter than
  // next_n: the first tokens see nothing), 128 (the whole table), 33 (fewer than k), 9000 (past
  // the table: clamped to 128).
  c.SetContexts({70, 2, 128, 33, 9000});
  if (spec.per_token_lens) c.SetTokenLength(1, spec.next_n - 1, 128);  // varlen: its own length
  ExpectMatchesReference(c);
}

INSTANTIATE_TEST_SUITE_P(Mtp, PagedDsaNextN,
                         ::testing::Combine(::testing::Values(3, 4), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return "next" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_fp8" : "_bf16") +
                                  (std::get<2>(info.param) ? "_per_token" : "_per_request");
                         });

// DeepSeek-V3.2's shapes (indexer H64 D128, block 64, H128 d576, FP8 cache) at next_n 4 with a
// separate table over an interleaved pool: the GPU's fast paths on the MTP shape.
TEST(PagedDsaNextN, DeepSeekShapesNextN4SeparateTable) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.batch = 3;
  spec.next_n = 4;
  spec.index_heads = 64;
  spec.heads = 128;
  spec.fp8_kv = true;
  spec.index_block_size = 64;
  spec.max_blocks = 4;
  spec.index_blocks = 14;
  spec.topk = 128;
  spec.separate_kv_table = true;
  spec.kv_block_size = 64;
  spec.kv_block_stride = 80;
  spec.kv_blocks = 13;
  PagedDsaCase c(spec, rng);
  c.SetContexts({256, 3, 130});
  ExpectMatchesReference(c);
}

// Index table entries out of range of index_cache inside the visible window (negative, the first
// id past the pool, INT32_MAX, INT32_MIN): their positions get -inf logits and are never chosen;
// a request whose visible blocks are all bad has an empty selection (out 0, lse -inf).
TEST(PagedDsaHostile, IndexTableIdsOutOfThePoolAreMasked) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.batch = 4;
  spec.next_n = 2;
  spec.pad = 2;
  PagedDsaCase c(spec, rng);
  c.SetContexts({128, 100, 40, 20});
  c.SetIndexBlock(0, 1, -1);
  c.SetIndexBlock(0, 5, static_cast<int32_t>(spec.index_blocks));
  c.SetIndexBlock(1, 0, kI32Max);
  c.SetIndexBlock(1, 6, kI32Min);
  c.SetIndexBlock(3, 0, -7);
  c.SetIndexBlock(3, 1, 1 << 30);
  ExpectMatchesReference(c);
  // Request 3 (rows 6, 7): no eligible position.
  const Params p = c.MakeParams();
  const int runs =
      RunEachImpl(kernels::dsa::Implementations(), p, c.Outputs(), [&](const std::string& impl) {
        for (int64_t row = 6; row < 8; ++row) {
          for (int64_t i = 0; i < spec.topk; ++i) {
            EXPECT_EQ(c.indices().data<int32_t>()[row * spec.topk + i], -1) << impl;
          }
          for (int64_t h = 0; h < spec.heads; ++h) {
            EXPECT_EQ(c.out().At({row, h, 0}), 0.0) << impl;
            EXPECT_EQ(c.lse().At({row, h}), -std::numeric_limits<double>::infinity()) << impl;
          }
        }
      });
  EXPECT_GE(runs, 1);
}

// kv table entries past the MLA pool: the positions are chosen by their logits as usual and
// their kv rows (>= S) are skipped by the attention.
TEST(PagedDsaHostile, KvTableIdsPastThePoolAreSkipped) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.next_n = 2;
  spec.fp8_kv = true;
  spec.separate_kv_table = true;
  spec.kv_block_size = 8;
  spec.kv_blocks = 60;
  PagedDsaCase c(spec, rng);
  c.SetContexts({128, 90, 50});
  c.SetKvBlock(0, 3, static_cast<int32_t>(spec.kv_blocks));
  c.SetKvBlock(1, 0, static_cast<int32_t>(spec.kv_blocks + 1000));
  c.SetKvBlock(2, 5, 1 << 20);
  ExpectMatchesReference(c);
}

// A negative kv table entry: its positions' slots in indices are -1 (a hole in the ascending
// list) and the attention skips them. With every window no longer than k the selection is
// exact: every visible position, in order.
TEST(PagedDsaHostile, NegativeKvTableIdsGiveMinusOne) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.batch = 2;
  spec.topk = 128;  // = N: every visible position is chosen
  spec.separate_kv_table = true;
  spec.kv_block_size = 8;
  spec.kv_blocks = 40;
  spec.pad = 1;
  PagedDsaCase c(spec, rng);
  c.SetContexts({128, 45});
  c.SetKvBlock(0, 2, -1);
  c.SetKvBlock(1, 5, kI32Min);
  const Params p = c.MakeParams();
  const kernels::Tensor& table = p.kv_block_table;
  for (const kernels::Precision precision : kPrecisions) {
    Params run = p;
    run.precision = precision;
    const int runs = RunEachImpl(
        kernels::dsa::Implementations(), run, c.Outputs(), [&](const std::string& impl) {
          SCOPED_TRACE(impl + " " + kernels::PrecisionName(precision));
          for (int64_t b = 0; b < 2; ++b) {
            const int64_t visible = ExpectedLength(p, b, 0);
            for (int64_t i = 0; i < spec.topk; ++i) {
              int32_t want = -1;
              if (i < visible) {
                const int32_t id = table.ptr<const int32_t>()[b * table.stride(0) + i / 8];
                if (id >= 0) want = static_cast<int32_t>(id * 8 + i % 8);
              }
              ASSERT_EQ(c.indices().data<int32_t>()[b * spec.topk + i], want)
                  << "request " << b << " slot " << i;
            }
          }
          const kernels::sparse_mla::Reference ref = kernels::sparse_mla::ComputeReference(
              kernels::dsa::SparseMlaStep(run, 0, c.t(), c.indices().tensor()));
          ExpectAttentionOut(ToDoubles(c.out()), ref.out, ref.out_abs, precision, kPagedOutTol,
                             impl + " out");
          ExpectClose(ToDoubles(c.lse()), ref.lse, kPagedLseTol, impl + " lse");
        });
    EXPECT_GE(runs, 1);
  }
}

// context_lens at the ends of i32 ([B] form, next_n 3: L − next_n + j + 1 must not wrap) and
// negative: clamped to [0, N].
TEST(PagedDsaHostile, ExtremeContextLensAreClamped) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.batch = 4;
  spec.next_n = 3;
  PagedDsaCase c(spec, rng);
  c.SetContexts({kI32Max, kI32Min, -5, 100});
  ExpectMatchesReference(c);
}

TEST(PagedDsaHostile, ExtremePerTokenLengthsAreClamped) {
  std::mt19937_64 rng = MakeRng();
  PagedDsaSpec spec;
  spec.next_n = 2;
  spec.per_token_lens = true;
  spec.fp8_kv = true;
  PagedDsaCase c(spec, rng);
  c.SetContexts({128, 60, 90});
  c.SetTokenLength(0, 0, kI32Min);
  c.SetTokenLength(0, 1, kI32Max);
  c.SetTokenLength(1, 0, -1);
  c.SetTokenLength(2, 1, 129);
  ExpectMatchesReference(c);
}

}  // namespace
}  // namespace attnd::testing
