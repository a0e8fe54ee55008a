// Every implementation of indexer_logits_paged against the fp64 reference on fresh random data:
// next_n 1/2/3/5, context lengths around a block (1, 63, 64, 65), short and negative contexts,
// odd block tables, invalid page ids (masked, and proven never read), a block table read only
// below each context, padded strides, head shapes, block sizes, offsets past 2^31 elements, and
// the model's shape (D 128, block 64) at next_n 1/2/4 and H 7 to 128 with ragged contexts.
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/harness/harness.h"
#include "tests/kernels/indexer_logits/mapped_region.h"
#include "tests/kernels/indexer_logits_paged/paged_problem.h"

namespace attnd::kernels::indexer_logits_paged {
namespace {

using testing::MakeRng;
using testing::MappedRegion;

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

class NextNTest : public ::testing::TestWithParam<int64_t> {};

// H64 puts 4 queries in a block, so next_n 5 spans two query blocks.
TEST_P(NextNTest, MatchesReference) {
  const int64_t next_n = GetParam();
  auto rng = MakeRng();
  PagedProblem prob({3, next_n, 64, 128, 64, 12, 40, 768}, rng);
  prob.SetContexts({Uniform(rng, next_n, 768), Uniform(rng, 1, 700), Uniform(rng, 1, 130)});
  EXPECT_GE(prob.RunAndCheck(), 1);
}

INSTANTIATE_TEST_SUITE_P(IndexerLogitsPaged, NextNTest, ::testing::Values(1, 2, 3, 5),
                         [](const auto& info) { return "NextN" + std::to_string(info.param); });

class ContextLengthTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

// Contexts one token into a block, one short of, exactly at and one past a 64-token block.
TEST_P(ContextLengthTest, MatchesReference) {
  const auto [context, next_n] = GetParam();
  auto rng = MakeRng();
  PagedProblem prob({2, next_n, 32, 128, 64, 3, 8, 150}, rng);
  prob.SetContexts({context, context});
  EXPECT_GE(prob.RunAndCheck(), 1);
}

INSTANTIATE_TEST_SUITE_P(IndexerLogitsPaged, ContextLengthTest,
                         ::testing::Combine(::testing::Values(1, 63, 64, 65),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return "Context" + std::to_string(std::get<0>(info.param)) + "_NextN" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Contexts below next_n, zero and negative: those rows see nothing and are -inf throughout.
TEST(IndexerLogitsPaged, ShortZeroAndNegativeContexts) {
  auto rng = MakeRng();
  PagedProblem prob({6, 2, 32, 64, 64, 4, 16, 200}, rng);
  prob.SetContexts({1, 0, -5, INT32_MIN, 2, 130});
  EXPECT_GE(prob.RunAndCheck(), 1);
}

// Odd max_blocks (7), page ids shuffled over a larger pool (23), padded table rows, and a
// context past max_blocks · block_size (clamped: -inf beyond 448).
TEST(IndexerLogitsPaged, OddBlockTables) {
  auto rng = MakeRng();
  PagedProblem prob({4, 1, 32, 128, 64, 7, 23, 512, 3}, rng);
  prob.SetContexts({448, 500, 321, 77});
  EXPECT_GE(prob.RunAndCheck(), 1);
}

// Every leading stride padded by an odd amount (kv_cache rows by 5 bytes: the scales of each
// block stay at their bs·D offset, unaligned); the padding must stay untouched.
TEST(IndexerLogitsPaged, PaddedStrides) {
  auto rng = MakeRng();
  PagedProblem prob({3, 2, 32, 128, 64, 5, 15, 300, 5}, rng);
  prob.SetContexts({300, 129, 64});
  EXPECT_GE(prob.RunAndCheck(), 1);
}

// N smaller than the context: rows are clamped to N columns.
TEST(IndexerLogitsPaged, ContextLongerThanColumns) {
  auto rng = MakeRng();
  PagedProblem prob({2, 2, 32, 64, 64, 8, 16, 100}, rng);
  prob.SetContexts({300, 101});
  EXPECT_GE(prob.RunAndCheck(), 1);
}

// Zero requests or zero columns: valid, nothing to write.
TEST(IndexerLogitsPaged, ZeroBatchOrColumns) {
  auto rng = MakeRng();
  for (const PagedShape& shape :
       {PagedShape{0, 1, 32, 64, 64, 4, 4, 100}, PagedShape{2, 1, 32, 64, 64, 4, 4, 0}}) {
    PagedProblem prob(shape, rng);
    prob.SetContexts(std::vector<int64_t>(shape.batch, 100));
    EXPECT_GE(prob.RunAndCheck(), 1);
  }
}

class HeadShapeTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(HeadShapeTest, MatchesReference) {
  const auto [heads, dim] = GetParam();
  auto rng = MakeRng();
  PagedProblem prob({2, 2, heads, dim, 64, 4, 9, 256}, rng);
  prob.SetContexts({Uniform(rng, 2, 256), Uniform(rng, 2, 256)});
  EXPECT_GE(prob.RunAndCheck(), 1);
}

INSTANTIATE_TEST_SUITE_P(IndexerLogitsPaged, HeadShapeTest,
                         ::testing::Values(std::make_tuple(32, 128), std::make_tuple(64, 128),
                                           std::make_tuple(128, 64), std::make_tuple(7, 48),
                                           std::make_tuple(1, 16)),
                         [](const auto& info) {
                           return "H" + std::to_string(std::get<0>(info.param)) + "_D" +
                                  std::to_string(std::get<1>(info.param));
                         });

class ModelShapeTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

// The model's D 128 and block size 64 (the Hopper kernel's shape) at next_n × H, H 7 and 100 padded
// there: contexts 0, 1, 63, 130 and past max_blocks · 64 (1536 of 1600 columns), ragged.
TEST_P(ModelShapeTest, MatchesReference) {
  const auto [next_n, heads] = GetParam();
  auto rng = MakeRng();
  PagedProblem prob({6, next_n, heads, 128, 64, 24, 150, 1600}, rng);
  prob.SetContexts({0, 1, 63, 130, 2000, Uniform(rng, 2, 1400)});
  EXPECT_GE(prob.RunAndCheck(), 1);
}

INSTANTIATE_TEST_SUITE_P(IndexerLogitsPaged, ModelShapeTest,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(32, 64, 7, 100, 128)),
                         [](const auto& info) {
                           return "NextN" + std::to_string(std::get<0>(info.param)) + "_H" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The model's shape with every leading stride padded by 16 (alignment kept).
TEST(IndexerLogitsPaged, ModelShapePaddedStrides) {
  auto rng = MakeRng();
  PagedProblem prob({3, 2, 64, 128, 64, 20, 50, 1280, 16}, rng);
  prob.SetContexts({1280, 577, 65});
  EXPECT_GE(prob.RunAndCheck(), 1);
}

class BlockSizeTest : public ::testing::TestWithParam<int64_t> {};

// Block sizes other than the model's 64: one token per block, odd sizes, sizes above a tile.
TEST_P(BlockSizeTest, MatchesReference) {
  const int64_t bs = GetParam();
  auto rng = MakeRng();
  const int64_t cols = 333, max_blocks = (cols + bs - 1) / bs;
  PagedProblem prob({2, 2, 32, 64, bs, max_blocks, 2 * max_blocks + 1, cols}, rng);
  prob.SetContexts({cols, Uniform(rng, 2, cols)});
  EXPECT_GE(prob.RunAndCheck(), 1);
}

INSTANTIATE_TEST_SUITE_P(IndexerLogitsPaged, BlockSizeTest, ::testing::Values(1, 16, 17, 64, 100),
                         [](const auto& info) { return "Block" + std::to_string(info.param); });

// Table entries -1, -7, num_blocks, INT32_MAX, INT32_MIN and 1000 inside the contexts mask
// their 64 positions. The cache (16 blocks = exactly 33 pages) sits between two inaccessible pages,
// so reading a block just below or just past it faults.
TEST(IndexerLogitsPaged, InvalidPageIdsAreMaskedNeverRead) {
  auto rng = MakeRng();
  const PagedShape shape{3, 2, 32, 128, 64, 6, 16, 384};
  PagedProblem prob(shape, rng);
  prob.SetContexts({384, 300, 200});
  const int64_t page = MappedRegion::PageSize();
  const int64_t cache_bytes = shape.num_blocks * PagedProblem::BlockBytes(shape);
  ASSERT_EQ(cache_bytes % page, 0);
  MappedRegion region(static_cast<size_t>(cache_bytes + 2 * page));
  ASSERT_NE(region.data(), nullptr);
  ASSERT_TRUE(region.Protect(0));
  ASSERT_TRUE(region.Protect(1 + cache_bytes / page));
  std::memcpy(region.page(1), prob.kv_cache.raw(), static_cast<size_t>(cache_bytes));
  Params p = prob.params();
  p.kv_cache.data = region.page(1);

  int32_t* table = prob.block_table.data<int32_t>();
  const int64_t ts = prob.block_table.tensor().stride(0);
  table[0 * ts + 1] = -1;
  table[0 * ts + 5] = static_cast<int32_t>(shape.num_blocks);
  table[1 * ts + 0] = INT32_MAX;
  table[1 * ts + 4] = INT32_MIN;
  table[2 * ts + 1] = -7;  // with the next: positions 64..191, a whole 96-key tile masked
  table[2 * ts + 2] = 1000;
  EXPECT_GE(prob.RunAndCheck(p), 1);
}

// The CPU implementations only: the harness's device mirror would copy the whole table span,
// protected pages included (the GPU version is in gpu_test.cc).
std::vector<Impl<Params>> CpuImplementations() {
  std::vector<Impl<Params>> cpu;
  for (const auto& impl : Implementations()) {
    if (impl.backend == Backend::kCpu) cpu.push_back(impl);
  }
  return cpu;
}

// Each request's block-table row ends, right after its ceil(L / bs) = 3 used entries, at an
// inaccessible page (max_blocks is 8): reading any later entry faults.
TEST(IndexerLogitsPaged, ReadsBlockTableOnlyBelowContext) {
  auto rng = MakeRng();
  const PagedShape shape{3, 2, 32, 64, 64, 8, 12, 512};
  PagedProblem prob(shape, rng);
  prob.SetContexts({130, 150, 192});  // 3 blocks each
  const int64_t page = MappedRegion::PageSize(), ints_per_page = page / 4, used = 3;
  MappedRegion region(static_cast<size_t>(2 * shape.batch * page));
  ASSERT_NE(region.data(), nullptr);
  // Row b starts `used` entries before the end of page 2b; page 2b + 1 is inaccessible.
  auto* base = reinterpret_cast<int32_t*>(region.page(1)) - used;
  for (int64_t b = 0; b < shape.batch; ++b) {
    std::memcpy(base + b * 2 * ints_per_page,
                prob.block_table.data<int32_t>() + b * prob.block_table.tensor().stride(0),
                used * 4);
  }
  for (int64_t b = 0; b < shape.batch; ++b) ASSERT_TRUE(region.Protect(2 * b + 1));
  Params p = prob.params();
  p.block_table =
      MakeStridedTensor(base, DType::kI32, {shape.batch, shape.max_blocks}, {2 * ints_per_page, 1});
  EXPECT_GE(prob.RunAndCheck(p, CpuImplementations()), 1);
}

// kv_cache of 520,000 blocks (reserved, not committed: 2.3 GB at D 64, 4.4 GB at D 128, the
// shape of the Hopper kernel, H 64): pages past 2^31 bytes (and past 2^32 at D 128); logits row
// stride 2^32 + 48 elements. 32-bit offsets, signed or not, go wrong. Both precisions.
class OffsetsTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(OffsetsTest, PastTwoTo31Elements) {
  const int64_t dim = GetParam(), heads = dim == 128 ? 64 : 32;
  auto rng = MakeRng();
  const PagedShape shape{1, 2, heads, dim, 64, 4, 520000, 256};
  const int64_t block_bytes = PagedProblem::BlockBytes(shape), n = shape.cols;
  const int64_t ld = (int64_t{1} << 32) + 48;
  // The Problem's own cache is small; only its q, weights and table are used.
  PagedProblem prob({1, 2, heads, dim, 64, 4, 1, n}, rng);
  MappedRegion cache(static_cast<size_t>(shape.num_blocks * block_bytes));
  MappedRegion out(static_cast<size_t>((ld + n) * 4));
  if (cache.data() == nullptr || out.data() == nullptr) {  // strict overcommit (mode 2)
    GTEST_SKIP() << "this machine refuses to reserve 21 GB of address space";
  }
  // 254300 · 8448 > 2^31 and 510000 · 8448 > 2^32 (D 128); 510000 · 4352 > 2^31 (D 64).
  const int32_t pages[4] = {519999, 3, 254300, 510000};
  for (int32_t pg : pages) FillCacheBlock(cache.data() + pg * block_bytes, 64, dim, rng);
  prob.SetContexts({250});
  std::memcpy(prob.block_table.data<int32_t>(), pages, sizeof pages);

  Params p = prob.params();
  p.kv_cache = MakeTensor(cache.data(), DType::kU8, {shape.num_blocks, block_bytes});
  p.logits = MakeStridedTensor(out.data(), DType::kF32, {2, n}, {ld, 1});
  ASSERT_TRUE(Validate(p).ok()) << Validate(p);
  const RefLogits ref = Reference(p);
  auto poison = [&] {  // only the two rows: PoisonNaN would commit the whole span
    testing::HostTensor one = testing::HostTensor::Dense(DType::kF32, {1});
    testing::PoisonNaN(one);
    for (int64_t r = 0; r < 2; ++r)
      std::fill_n(p.logits.ptr<float>() + r * ld, n, one.data<float>()[0]);
  };
  for (const Precision precision : testing::kPrecisions) {
    p.precision = precision;
    poison();
    const int runs = testing::RunEachImpl(Implementations(), p, {}, [&](const std::string& impl) {
      testing::ExpectLogits(p.logits, ref, testing::ToleranceFor(heads, dim, precision),
                            impl + " (" + PrecisionName(precision) + ")",
                            /*padding_poisoned=*/false);
      poison();
    });
    EXPECT_GE(runs, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(IndexerLogitsPaged, OffsetsTest, ::testing::Values(64, 128),
                         [](const auto& info) { return "D" + std::to_string(info.param); });

// Count: FLOPs over the visible pairs; bytes with keys read once per request.
TEST(IndexerLogitsPaged, CountsVisiblePairs) {
  auto rng = MakeRng();
  PagedProblem prob({3, 2, 64, 128, 64, 4, 12, 256}, rng);
  prob.SetContexts({100, 1, 300});  // rows see 99, 100 | 0, 1 | 256 (clamped), 256
  const WorkCount w = Count(prob.params());
  EXPECT_EQ(w.flops, 2.0 * 64 * 128 * (99 + 100 + 0 + 1 + 256 + 256));
  const double keys = 100 + 1 + 256, table = 2 + 1 + 4;
  EXPECT_EQ(w.bytes, 3 * 2 * 64 * 128 + keys * 132 + 4 * table + 4 * 3 + 4 * 6 * 64 + 4 * 6 * 256);
}

// Run = Validate + Dispatch: names the implementation, refuses bad params before running.
TEST(IndexerLogitsPaged, RunValidatesThenDispatches) {
  auto rng = MakeRng();
  PagedProblem prob({2, 1, 32, 64, 64, 2, 4, 100}, rng);
  prob.SetContexts({100, 50});
  ExecContext ctx;
  ctx.pool = testing::TestPool();
  std::string impl;
  ASSERT_TRUE(indexer_logits_paged::Run(prob.params(), ctx, &impl).ok());
  EXPECT_EQ(impl, "cpu");
  Params bad = prob.params();
  bad.block_size = 0;
  testing::PoisonNaN(prob.logits);
  const absl::Status status = indexer_logits_paged::Run(bad, ctx, &impl);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(testing::IsPoisonF32(prob.logits.data<float>()[0])) << "ran despite bad params";
}

}  // namespace
}  // namespace attnd::kernels::indexer_logits_paged
