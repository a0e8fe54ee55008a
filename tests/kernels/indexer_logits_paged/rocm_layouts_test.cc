// indexer_logits_paged on the key caches ROCm frontends hold, each built the frontend's way
// (frontend_caches.h) and checked against the fp64 reference with NaN-poisoned outputs on every
// implementation (the GPU ones too in a GPU build): vLLM's SHUFFLE cache (16-token × 16-byte
// tiles) at block sizes 16..128, AITER's own writer of it, vLLM's NORMAL cache at block size 1 and
// SGLang's HIP cache at page size 1 (both the blocks layout at block size 1).
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/harness/harness.h"
#include "tests/kernels/indexer_logits_paged/frontend_caches.h"
#include "tests/kernels/indexer_logits_paged/paged_problem.h"

namespace attnd::kernels::indexer_logits_paged {
namespace {

using testing::MakeRng;

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// A PagedProblem whose cache the frontend wrote, called with the layout `layout`.
struct FrontendProblem {
  FrontendProblem(const PagedShape& s, Frontend frontend, CacheLayout layout_in,
                  std::mt19937_64& rng)
      : prob(s, rng), layout(layout_in) {
    FillFrontendCache(prob.kv_cache, s.block_size, s.dim, frontend, rng);
  }
  Params params() {
    Params p = prob.params();
    p.kv_cache_layout = layout;
    return p;
  }
  int RunAndCheck() { return prob.RunAndCheck(params()); }

  PagedProblem prob;
  CacheLayout layout;
};

constexpr CacheLayout kShuffle = CacheLayout::kIndexerAiterShuffle16;
constexpr CacheLayout kBlocks = CacheLayout::kIndexerFp8Blocks;

class ShuffleTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

// The model's shape (H 64, D 128) on vLLM's SHUFFLE cache: contexts inside, at and past a
// 16-token tile and a block, next_n 1 and 2, block sizes 16, 32, 64 (vLLM's) and 128.
TEST_P(ShuffleTest, VllmCacheMatchesReference) {
  const auto [block_size, next_n] = GetParam();
  auto rng = MakeRng();
  const int64_t cols = 600;
  FrontendProblem fp({6, next_n, 64, 128, block_size, cols / block_size + 1, 60, cols},
                     Frontend::kVllmRocm, kShuffle, rng);
  fp.prob.SetContexts({1, 16, 17, block_size + 1, Uniform(rng, 2, cols), cols});
  EXPECT_GE(fp.RunAndCheck(), 1);
}

INSTANTIATE_TEST_SUITE_P(IndexerLogitsPagedRocmLayouts, ShuffleTest,
                         ::testing::Combine(::testing::Values(16, 32, 64, 128),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return "Block" + std::to_string(std::get<0>(info.param)) + "_NextN" +
                                  std::to_string(std::get<1>(info.param));
                         });

// AITER's HIP writer lays out exactly the bytes vLLM's Triton writer does (same keys, same slot
// order), and its cache reads back right.
TEST(IndexerLogitsPagedRocmLayouts, AiterWriterMatchesVllmWriter) {
  const uint64_t seed = MakeRng()();
  const PagedShape shape{2, 1, 32, 128, 64, 4, 9, 256};
  std::mt19937_64 rng_a(seed), rng_b(seed);
  FrontendProblem vllm(shape, Frontend::kVllmRocm, kShuffle, rng_a);
  FrontendProblem aiter(shape, Frontend::kAiter, kShuffle, rng_b);
  ASSERT_EQ(vllm.prob.kv_cache.bytes(), aiter.prob.kv_cache.bytes());
  EXPECT_EQ(std::memcmp(vllm.prob.kv_cache.raw(), aiter.prob.kv_cache.raw(),
                        static_cast<size_t>(vllm.prob.kv_cache.bytes())),
            0);
  aiter.prob.SetContexts({256, Uniform(rng_b, 1, 256)});
  EXPECT_GE(aiter.RunAndCheck(), 1);
}

// Odd head counts and other head dims: D 16 (one tile column), 64 and 256; H 1, 7, 33, 128.
TEST(IndexerLogitsPagedRocmLayouts, ShuffleHeadShapes) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 16}, {7, 64}, {33, 256}, {128, 64}};
  for (const auto& [heads, dim] : shapes) {
    SCOPED_TRACE("H " + std::to_string(heads) + " D " + std::to_string(dim));
    auto rng = MakeRng();
    FrontendProblem fp({2, 3, heads, dim, 32, 10, 24, 300}, Frontend::kVllmRocm, kShuffle, rng);
    fp.prob.SetContexts({Uniform(rng, 3, 300), Uniform(rng, 3, 300)});
    EXPECT_GE(fp.RunAndCheck(), 1);
  }
}

// Per-token lengths [B, next_n] in any order (varlen verification) on the shuffled cache.
TEST(IndexerLogitsPagedRocmLayouts, ShufflePerTokenLengths) {
  auto rng = MakeRng();
  FrontendProblem fp({3, 3, 64, 128, 64, 6, 30, 384}, Frontend::kVllmRocm, kShuffle, rng);
  fp.prob.SetTokenLengths({{129, 130, 131}, {64, 0, 17}, {1, 384, 200}}, /*row_pad=*/2);
  EXPECT_GE(fp.RunAndCheck(), 1);
}

// Every leading stride padded by an odd amount: vLLM's writer addresses blocks by the tensor's
// row stride, the scales stay at block_size·D from the row start (unaligned), padding poisoned.
TEST(IndexerLogitsPagedRocmLayouts, ShufflePaddedStrides) {
  auto rng = MakeRng();
  FrontendProblem fp({3, 2, 32, 128, 64, 7, 25, 420, 5}, Frontend::kVllmRocm, kShuffle, rng);
  fp.prob.SetContexts({420, 129, 64});
  EXPECT_GE(fp.RunAndCheck(), 1);
}

// Page ids outside [0, num_blocks) mask their positions (-inf), as with the blocks layout.
TEST(IndexerLogitsPagedRocmLayouts, ShuffleInvalidPageIdsAreMasked) {
  auto rng = MakeRng();
  FrontendProblem fp({2, 1, 64, 128, 64, 6, 20, 384}, Frontend::kVllmRocm, kShuffle, rng);
  fp.prob.SetContexts({384, 300});
  int32_t* table = fp.prob.block_table.data<int32_t>();
  const int64_t ts = fp.prob.block_table.tensor().stride(0);
  table[1] = -1;
  table[ts + 2] = 20;  // == num_blocks
  table[ts + 4] = INT32_MAX;
  EXPECT_GE(fp.RunAndCheck(), 1);
}

// The layout decides where the bytes are: a shuffled cache read as the blocks layout gives other
// logits (so a frontend that leaves the layout unnamed gets wrong results, not an error: the
// two layouts share dtype and shape, which is why the shuffled one must be named).
TEST(IndexerLogitsPagedRocmLayouts, ShuffleReadAsBlocksDiffers) {
  auto rng = MakeRng();
  FrontendProblem fp({1, 1, 32, 128, 64, 2, 4, 128}, Frontend::kVllmRocm, kShuffle, rng);
  fp.prob.SetContexts({128});
  Params shuffled = fp.params();
  Params blocks = shuffled;
  blocks.kv_cache_layout = CacheLayout::kUnspecified;
  ASSERT_TRUE(Validate(blocks).ok());
  const RefLogits a = Reference(shuffled), b = Reference(blocks);
  int64_t differ = 0;
  for (size_t i = 0; i < a.value.size(); ++i) differ += a.value[i] != b.value[i] ? 1 : 0;
  EXPECT_GT(differ, 100);  // slot 0 of each 16-token group shares its first 16 bytes only
}

class Block1Test
    : public ::testing::TestWithParam<std::tuple<Frontend, CacheLayout, int64_t /*next_n*/>> {};

// Block (page) size 1: vLLM's NORMAL cache and SGLang's HIP cache are the blocks layout at block
// size 1 (D key bytes, then the f32 scale), read with the layout named or unspecified.
TEST_P(Block1Test, MatchesReference) {
  const auto [frontend, layout, next_n] = GetParam();
  auto rng = MakeRng();
  FrontendProblem fp({3, next_n, 64, 128, 1, 260, 800, 260}, frontend, layout, rng);
  fp.prob.SetContexts({1, Uniform(rng, 2, 260), 260});
  EXPECT_GE(fp.RunAndCheck(), 1);
}

INSTANTIATE_TEST_SUITE_P(IndexerLogitsPagedRocmLayouts, Block1Test,
                         ::testing::Combine(::testing::Values(Frontend::kVllmRocm,
                                                              Frontend::kSglangHip),
                                            ::testing::Values(kBlocks, CacheLayout::kUnspecified),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == Frontend::kVllmRocm
                                                  ? "VllmNormal"
                                                  : "SglangHip") +
                                  (std::get<1>(info.param) == kBlocks ? "_Named" : "_Unspecified") +
                                  "_NextN" + std::to_string(std::get<2>(info.param));
                         });

// At block size 1 vLLM's NORMAL writer and SGLang's writer store the same bytes for the same key
// and scale format: one layout (INDEXER_FP8_BLOCKS), not two.
TEST(IndexerLogitsPagedRocmLayouts, NormalAndSglangBlock1AreByteIdentical) {
  auto rng = MakeRng();
  const int64_t dim = 128, blocks = 8;
  auto a = testing::HostTensor::RowStrided(DType::kU8, {blocks, dim + 4}, dim + 4 + 3);
  auto b = testing::HostTensor::RowStrided(DType::kU8, {blocks, dim + 4}, dim + 4 + 3);
  std::memset(a.raw(), 0xff, static_cast<size_t>(a.bytes()));
  std::memset(b.raw(), 0xff, static_cast<size_t>(b.bytes()));
  const VllmRocmIndexerWriter vllm(a, 1, dim);
  const SglangIndexerWriter sglang(b, 1, dim);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> key(dim);
  for (const int64_t slot : {5, 0, 7, 2, 1, 6, 3, 4}) {
    for (float& v : key) v = normal(rng);
    const bool ue8m0 = slot % 2 == 0;
    vllm.Write(slot, key.data(), ue8m0);
    sglang.Write(slot, key.data(), ue8m0);
  }
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.bytes())), 0);
}

}  // namespace
}  // namespace attnd::kernels::indexer_logits_paged
