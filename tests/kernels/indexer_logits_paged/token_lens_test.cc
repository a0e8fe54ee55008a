// Per-token context lengths, context_lens i32 [B, next_n] (docs/CONTRACTS.md
// "indexer_logits_paged"): every implementation against the fp64 reference on fresh random data
// (the GPU ones where a device is present), lengths 0, at and past the block table's capacity,
// negative, in any order along next_n, strided rows; the same bytes as the 1-D form where both
// say the same; Count; and lengths built the way a decode frontend builds them for next_n > 1.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/indexer_logits_paged/cpu.h"
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"
#include "tests/harness/harness.h"
#include "tests/kernels/indexer_logits_paged/paged_problem.h"

namespace attnd::kernels::indexer_logits_paged {
namespace {

using testing::MakeRng;

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

class TokenLengthsTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

// Random per-token lengths (any order) for next_n 1, 2, 4, 5 at the model's shape (the tensor-core
// path on CUDA: H 32/64, D 128, block 64) and on the portable path (H 7).
TEST_P(TokenLengthsTest, MatchesReference) {
  const auto [next_n, heads] = GetParam();
  auto rng = MakeRng();
  const int64_t max_blocks = 6, block = 64, capacity = max_blocks * block;  // 384 positions
  PagedProblem prob({4, next_n, heads, 128, block, max_blocks, 30, 400}, rng);
  std::vector<std::vector<int64_t>> lengths(4, std::vector<int64_t>(next_n));
  for (auto& row : lengths) {
    for (auto& len : row) len = Uniform(rng, 0, capacity);
  }
  lengths[0][0] = capacity;      // exactly the table's capacity
  lengths[1][next_n - 1] = 0;    // a token that sees nothing
  lengths[2][0] = capacity + 7;  // past it: clamped
  lengths[3][next_n / 2] = -3;   // negative: counts as 0
  prob.SetTokenLengths(lengths, /*row_pad=*/next_n == 4 ? 3 : 0);
  EXPECT_GE(prob.RunAndCheck(), 1);
}

INSTANTIATE_TEST_SUITE_P(IndexerLogitsPaged, TokenLengthsTest,
                         ::testing::Combine(::testing::Values(1, 2, 4, 5),
                                            ::testing::Values(7, 32, 64)),
                         [](const auto& info) {
                           return "NextN" + std::to_string(std::get<0>(info.param)) + "_H" +
                                  std::to_string(std::get<1>(info.param));
                         });

// One request (B 1), next_n 4, lengths falling, rising and empty in the middle; N below the
// table's capacity (rows clamp to N), and INT32_MIN / INT32_MAX.
TEST(IndexerLogitsPagedTokenLengths, OneRequestAnyOrder) {
  auto rng = MakeRng();
  for (const std::vector<int64_t>& row :
       {std::vector<int64_t>{300, 1, 0, 299}, std::vector<int64_t>{0, 0, 0, 0},
        std::vector<int64_t>{INT32_MAX, INT32_MIN, 64, 65}}) {
    PagedProblem prob({1, 4, 64, 128, 64, 8, 12, 290}, rng);
    prob.SetTokenLengths({row});
    EXPECT_GE(prob.RunAndCheck(), 1);
  }
}

// Block sizes other than the model's 64, and a block table whose capacity ends inside a block.
TEST(IndexerLogitsPagedTokenLengths, BlockSizes) {
  auto rng = MakeRng();
  for (int64_t block : {1, 16, 17}) {
    SCOPED_TRACE(::testing::Message() << "block_size " << block);
    const int64_t max_blocks = 200 / block + 1, capacity = max_blocks * block;
    PagedProblem prob({3, 2, 32, 64, block, max_blocks, max_blocks * 3 + 2, 260}, rng);
    prob.SetTokenLengths({{capacity, capacity - 1}, {1, 0}, {Uniform(rng, 0, 200), 150}});
    EXPECT_GE(prob.RunAndCheck(), 1);
  }
}

// Per-token lengths that say what a [B] context says give the same bytes as the [B] form.
TEST(IndexerLogitsPagedTokenLengths, SameAsRequestLengths) {
  auto rng = MakeRng();
  const int64_t next_n = 3;
  PagedProblem prob({3, next_n, 32, 128, 64, 5, 20, 320}, rng);
  const std::vector<int64_t> contexts = {320, 2, 77};
  prob.SetContexts(contexts);
  ExecContext cpu;
  cpu.pool = testing::TestPool();
  testing::PoisonNaN(prob.logits);
  ASSERT_TRUE(RunCpu(prob.params(), cpu).ok());
  const std::vector<uint8_t> want(prob.logits.raw(), prob.logits.raw() + prob.logits.bytes());
  std::vector<std::vector<int64_t>> lengths;
  for (int64_t c : contexts) {
    lengths.push_back({});
    for (int64_t j = 0; j < next_n; ++j) lengths.back().push_back(c - next_n + j + 1);
  }
  prob.SetTokenLengths(lengths, /*row_pad=*/2, /*assign_pages=*/false);
  EXPECT_GE(prob.RunAndCheck(), 1);
  testing::PoisonNaN(prob.logits);
  ASSERT_TRUE(RunCpu(prob.params(), cpu).ok());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), prob.logits.raw()));
}

// Count: FLOPs over each token's own length; keys and table entries over the longest token.
TEST(IndexerLogitsPagedTokenLengths, Counts) {
  auto rng = MakeRng();
  PagedProblem prob({2, 3, 64, 128, 64, 4, 12, 256}, rng);
  prob.SetTokenLengths({{100, 7, 0}, {300, -1, 65}});  // 100 7 0 | 256 (clamped) 0 65
  const WorkCount w = Count(prob.params());
  EXPECT_EQ(w.flops, 2.0 * 64 * 128 * (100 + 7 + 0 + 256 + 0 + 65));
  const double keys = 100 + 256, table = 2 + 4;
  EXPECT_EQ(w.bytes, 2 * 3 * 64 * 128 + keys * 132 + 4 * table + 4 * 6 + 4 * 6 * 64 + 4 * 6 * 256);
}

// ---- Built as a decode frontend builds them (vLLM's DeepSeek-V3.2 indexer decode with MTP,
// v0.11-era layout, from our reading of it; no code taken): the decode batch holds B requests of
// next_n new tokens each (the last accepted token plus the drafts), and for DeepGEMM's paged MQA
// logits the request's length seq_len (the new tokens included) becomes per-token lengths
// seq_len - next_n + 1 + j, j in [0, next_n). Under varlen verification a request with only q
// real tokens (q < next_n) is padded to next_n; its real tokens see seq_len - q + 1 + j and the
// padding rows are given length 0 here (the frontend may give them anything: every value is
// memory-safe, and the padding rows' logits are never used).
TEST(IndexerLogitsPagedTokenLengths, FrontendMtpDecodeBatch) {
  auto rng = MakeRng();
  const int64_t next_n = 4, block = 64, max_blocks = 40;
  const std::vector<int64_t> seq_lens = {4, 65, 1000, 2560, 130};
  const std::vector<int64_t> real_tokens = {4, 4, 2, 4, 1};  // varlen verification
  PagedProblem prob({static_cast<int64_t>(seq_lens.size()), next_n, 64, 128, block, max_blocks, 200,
                     max_blocks * block},
                    rng);
  std::vector<std::vector<int64_t>> lengths;
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    lengths.push_back({});
    for (int64_t j = 0; j < next_n; ++j) {
      lengths.back().push_back(j < real_tokens[b] ? seq_lens[b] - real_tokens[b] + 1 + j : 0);
    }
  }
  prob.SetTokenLengths(lengths);
  EXPECT_GE(prob.RunAndCheck(), 1);
  // The rows the frontend reads: token j of request b has exactly its causal prefix finite.
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    for (int64_t j = 0; j < next_n; ++j) {
      const int64_t row = static_cast<int64_t>(b) * next_n + j;
      const float* out = prob.logits.data<float>() + row * prob.logits.tensor().stride(0);
      const int64_t want = lengths[b][j];
      int64_t finite = 0;
      for (int64_t n = 0; n < prob.shape.cols; ++n) finite += std::isfinite(out[n]) ? 1 : 0;
      EXPECT_EQ(finite, want) << "request " << b << " token " << j;
      if (want > 0) {
        EXPECT_TRUE(std::isfinite(out[want - 1])) << "request " << b;
      }
      if (want < prob.shape.cols) {
        EXPECT_TRUE(std::isinf(out[want])) << "request " << b;
      }
    }
  }
}

}  // namespace
}  // namespace attnd::kernels::indexer_logits_paged
