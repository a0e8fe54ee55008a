// IndexBase::kRowStart (docs/CONTRACTS.md "topk", "Index base"): chosen columns written, or
// mapped through the block table, as positions from each row's window start. Every
// implementation of the op list runs each case (the GPU ones where a device is present), checked
// against the fp64 reference; the last tests build a prefill chunk the way a frontend does and
// consume the output as it does.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/topk/cpu.h"
#include "kernels/topk/topk.h"
#include "tests/harness/harness.h"
#include "tests/kernels/topk/topk_case.h"

namespace attnd::kernels::topk {
namespace {

using testing::MakeRng;

constexpr float kOutside = 1e30f;  // outside every window: an implementation that reads it picks it

// Distinct page ids per request row, drawn from [0, 4 * max_blocks).
void FillPermutedTable(TopKCase& c, std::mt19937_64& rng) {
  const int64_t max_blocks = c.p.block_table.dim(1);
  std::vector<int32_t> ids(static_cast<size_t>(4 * max_blocks));
  for (int64_t q = 0; q < c.p.block_table.dim(0); ++q) {
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int64_t b = 0; b < max_blocks; ++b) c.Block(q, b) = ids[static_cast<size_t>(b)];
  }
}

TEST(TopKIndexBase, RowStartWindows) {
  auto rng = MakeRng();
  for (int64_t k : {1, 64, 2048}) {
    SCOPED_TRACE(::testing::Message() << "k " << k);
    const int64_t m = 12, n = 3 * k + 3000;
    TopKCase c(m, n, k, WindowForm::kKsKe, /*with_values=*/k != 64);
    testing::FillNormal(c.logits, rng, 1.0);
    std::uniform_int_distribution<int64_t> pos(-10, n + 10);
    for (int64_t r = 0; r < m; ++r) {
      const int64_t a = pos(rng), b = pos(rng);
      c.SetWindow(r, std::min(a, b), std::max(a, b));
    }
    c.SetWindow(0, 0, n);               // start 0: both bases agree
    c.SetWindow(1, n - 5, n);           // shorter than k (k > 5): -1 padding stays -1
    c.SetWindow(2, -7, 100);            // negative ks: the window (and the origin) starts at 0
    c.SetWindow(3, n + 3, n + 10);      // past the end: empty
    c.SetWindow(4, 500, 500);           // empty
    c.SetWindow(5, 17, 17 + k);         // exactly k candidates
    c.SetWindow(6, n - 1 - k, n + 40);  // past-end ke: clamped to N
    c.FillOutsideWindows(kOutside);
    c.p.index_base = IndexBase::kRowStart;
    RunAndCheck(c);
  }
}

TEST(TopKIndexBase, RowStartWithSpecialValues) {
  auto rng = MakeRng();
  const int64_t m = 4, n = 5000, k = 256;
  TopKCase c(m, n, k, WindowForm::kKsKe, /*with_values=*/true);
  testing::FillNormal(c.logits, rng, 1.0);
  for (int64_t r = 0; r < m; ++r) c.SetWindow(r, 1000 * r + 3, 1000 * r + 3 + 700 + 100 * r);
  c.FillOutsideWindows(kOutside);
  // NaN and -inf are never chosen; ties at the threshold; fewer selectable than k in row 3.
  for (int64_t j = 0; j < 300; ++j) c.Logit(1, 1003 + j) = 2.5f;
  for (int64_t j = 3003; j < 3003 + 1000; ++j) {
    c.Logit(3, j) = j % 3 == 0 ? std::numeric_limits<float>::quiet_NaN()
                               : -std::numeric_limits<float>::infinity();
  }
  c.Logit(3, 3500) = 1.0f;
  c.p.index_base = IndexBase::kRowStart;
  RunAndCheck(c);
}

// With lengths the window starts at 0: both bases write the same bytes.
TEST(TopKIndexBase, LengthsSameInBothBases) {
  auto rng = MakeRng();
  const int64_t m = 5, n = 3000, k = 128;
  TopKCase c(m, n, k, WindowForm::kLengths, /*with_values=*/true);
  testing::FillNormal(c.logits, rng, 1.0);
  const int64_t lengths[m] = {n, 0, k / 2, -4, n + 9};
  for (int64_t r = 0; r < m; ++r) c.SetWindow(r, 0, lengths[r]);
  c.p.index_base = IndexBase::kRowStart;
  RunAndCheck(c);
  ExecContext cpu;
  cpu.pool = testing::TestPool();
  ASSERT_TRUE(RunCpu(c.p, cpu).ok());
  const std::vector<int32_t> relative(c.indices.data<int32_t>(), c.indices.data<int32_t>() + m * k);
  c.p.index_base = IndexBase::kAbsolute;
  ASSERT_TRUE(RunCpu(c.p, cpu).ok());
  EXPECT_EQ(relative,
            std::vector<int32_t>(c.indices.data<int32_t>(), c.indices.data<int32_t>() + m * k));
}

// The block table maps the position from the window start, not the column.
TEST(TopKIndexBase, RowStartThroughBlockTable) {
  auto rng = MakeRng();
  for (int64_t page : {1, 48, 64}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << page);
    const int64_t m = 8, n = 6000, k = 256;
    TopKCase c(m, n, k, WindowForm::kKsKe, /*with_values=*/page != 48);
    FillDistinct(c, rng);  // a unique top-k: the mapped check compares sets of slots
    const int64_t begins[m] = {0, 1000, 1000, 2500, 2500, 2500 + 7, 5990, -3};
    const int64_t ends[m] = {n, 1000 + 3000, 1000 + 100, 6000, 2600, 4000, n + 100, 200};
    for (int64_t r = 0; r < m; ++r) c.SetWindow(r, begins[r], ends[r]);
    c.FillOutsideWindows(kOutside);
    // 50 positions' worth of pages short of the longest window: those map to -1.
    const int64_t max_blocks = (3000 - 50 + page - 1) / page;
    c.AddBlockTable(max_blocks, page, /*rows_per_request=*/2);
    FillPermutedTable(c, rng);
    c.Block(1, 0) = -1;  // request 1's first page is unmapped
    c.p.index_base = IndexBase::kRowStart;
    RunAndCheck(c);
  }
}

// ---- A prefill chunk built as a frontend builds it (vLLM 0.11's DeepSeek-V3.2 sparse indexer,
// from our reading of it; no code taken): the indexer keys of every request in the chunk are
// gathered one request after the other, so request i's keys occupy columns
// [key_start[i], key_start[i] + seq_len[i]); its query token t (position
// seq_len - query_len + t in the request) has the causal window ks = key_start[i],
// ke = key_start[i] + position + 1. The frontend wants top-k positions inside each request
// (it subtracted ks itself), then turns a position p into the KV slot
// block_table[req_id_per_token[t], p / 64] * 64 + p % 64, -1 staying -1.
struct Chunk {
  std::vector<int64_t> seq_len, query_len, key_start;
  std::vector<int64_t> req_of_token, position_of_token;
  int64_t tokens = 0, keys = 0;
};

Chunk MakeChunk(const std::vector<int64_t>& seq_len, const std::vector<int64_t>& query_len) {
  Chunk c;
  c.seq_len = seq_len;
  c.query_len = query_len;
  for (size_t i = 0; i < seq_len.size(); ++i) {
    c.key_start.push_back(c.keys);
    c.keys += seq_len[i];
    for (int64_t t = 0; t < query_len[i]; ++t) {
      c.req_of_token.push_back(static_cast<int64_t>(i));
      c.position_of_token.push_back(seq_len[i] - query_len[i] + t);
    }
  }
  c.tokens = static_cast<int64_t>(c.req_of_token.size());
  return c;
}

constexpr int64_t kPage = 64;

// The frontend's conversion of a position inside request `req` to a KV slot.
int64_t FrontendSlot(const std::vector<std::vector<int32_t>>& table, int64_t req, int64_t pos) {
  if (pos < 0) return -1;
  const auto& row = table[static_cast<size_t>(req)];
  if (pos / kPage >= static_cast<int64_t>(row.size())) return -1;
  const int64_t block = row[static_cast<size_t>(pos / kPage)];
  return block < 0 ? -1 : block * kPage + pos % kPage;
}

// Token t's expected top-k positions inside its request, from its own causal window of the
// logits (fp64, by value descending; the rows hold distinct values).
std::vector<int64_t> ExpectedPositions(TopKCase& c, const Chunk& chunk, int64_t t, int64_t k) {
  const int64_t req = chunk.req_of_token[static_cast<size_t>(t)];
  const int64_t visible = chunk.position_of_token[static_cast<size_t>(t)] + 1;
  std::vector<std::pair<double, int64_t>> cand;
  for (int64_t p = 0; p < visible; ++p) {
    cand.emplace_back(c.Logit(t, chunk.key_start[static_cast<size_t>(req)] + p), p);
  }
  std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<int64_t> out;
  for (int64_t i = 0; i < std::min<int64_t>(k, static_cast<int64_t>(cand.size())); ++i) {
    out.push_back(cand[static_cast<size_t>(i)].second);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::vector<int32_t>> MakeTables(const Chunk& chunk, std::mt19937_64& rng) {
  std::vector<std::vector<int32_t>> table;
  int32_t next = 0;
  for (int64_t len : chunk.seq_len) {
    std::vector<int32_t> row(static_cast<size_t>((len + kPage - 1) / kPage));
    for (auto& b : row) b = next++;
    std::shuffle(row.begin(), row.end(), rng);
    table.push_back(row);
  }
  return table;
}

TEST(TopKIndexBase, FrontendPrefillChunk) {
  auto rng = MakeRng();
  const int64_t k = 64;
  // A 1-token request, a request shorter than k, a long prefill, a chunked-prefill continuation.
  const Chunk chunk = MakeChunk({1, 40, 700, 1500}, {1, 40, 20, 6});
  TopKCase c(chunk.tokens, chunk.keys, k, WindowForm::kKsKe, /*with_values=*/true);
  FillDistinct(c, rng);
  for (int64_t t = 0; t < chunk.tokens; ++t) {
    const int64_t start = chunk.key_start[static_cast<size_t>(chunk.req_of_token[t])];
    c.SetWindow(t, start, start + chunk.position_of_token[t] + 1);
  }
  c.FillOutsideWindows(kOutside);  // other requests' keys and the causal future
  c.p.index_base = IndexBase::kRowStart;
  const std::vector<std::vector<int32_t>> table = MakeTables(chunk, rng);
  const int runs = testing::RunEachImpl(
      Implementations(), c.p, {&c.indices, &c.values}, [&](const std::string& impl) {
        for (int64_t t = 0; t < chunk.tokens; ++t) {
          const int64_t req = chunk.req_of_token[t];
          const std::vector<int64_t> want_pos = ExpectedPositions(c, chunk, t, k);
          std::vector<int64_t> got_pos, got_slots, want_slots;
          for (int64_t j = 0; j < k; ++j) {
            const int32_t p = c.indices.data<int32_t>()[c.indices.Offset({t, j})];
            if (j >= static_cast<int64_t>(want_pos.size())) {
              EXPECT_EQ(p, -1) << impl << ": token " << t << " entry " << j;
              continue;
            }
            got_pos.push_back(p);
            got_slots.push_back(FrontendSlot(table, req, p));
          }
          for (int64_t p : want_pos) want_slots.push_back(FrontendSlot(table, req, p));
          std::sort(got_pos.begin(), got_pos.end());
          std::sort(got_slots.begin(), got_slots.end());
          std::sort(want_slots.begin(), want_slots.end());
          EXPECT_EQ(got_pos, want_pos) << impl << ": token " << t;
          EXPECT_EQ(got_slots, want_slots) << impl << ": token " << t;
        }
      });
  EXPECT_GE(runs, 1);
}

// The same conversion fused: requests of equal query length share table rows through
// rows_per_request, and the op's slots equal the frontend's conversion of its positions.
TEST(TopKIndexBase, FrontendPrefillChunkFusedSlots) {
  auto rng = MakeRng();
  const int64_t k = 64, query = 4;
  const Chunk chunk = MakeChunk({4, 63, 64, 65, 1000}, {query, query, query, query, query});
  const std::vector<std::vector<int32_t>> table = MakeTables(chunk, rng);
  int64_t max_blocks = 0;
  for (const auto& row : table) max_blocks = std::max<int64_t>(max_blocks, row.size());

  TopKCase positions(chunk.tokens, chunk.keys, k, WindowForm::kKsKe, /*with_values=*/false);
  TopKCase fused(chunk.tokens, chunk.keys, k, WindowForm::kKsKe, /*with_values=*/true);
  FillDistinct(positions, rng);
  for (int64_t t = 0; t < chunk.tokens; ++t) {
    const int64_t start = chunk.key_start[static_cast<size_t>(chunk.req_of_token[t])];
    for (TopKCase* c : {&positions, &fused}) {
      c->SetWindow(t, start, start + chunk.position_of_token[t] + 1);
    }
  }
  positions.FillOutsideWindows(kOutside);
  for (int64_t t = 0; t < chunk.tokens; ++t) {
    for (int64_t n = 0; n < chunk.keys; ++n) fused.Logit(t, n) = positions.Logit(t, n);
  }
  fused.AddBlockTable(max_blocks, kPage, /*rows_per_request=*/query);
  for (int64_t q = 0; q < static_cast<int64_t>(table.size()); ++q) {
    for (int64_t b = 0; b < max_blocks; ++b) {
      fused.Block(q, b) = b < static_cast<int64_t>(table[q].size()) ? table[q][b] : -1;
    }
  }
  positions.p.index_base = fused.p.index_base = IndexBase::kRowStart;
  ExecContext cpu;
  cpu.pool = testing::TestPool();
  testing::PoisonNaN(positions.indices);
  ASSERT_TRUE(RunCpu(positions.p, cpu).ok());
  RunAndCheck(fused);  // against the fp64 reference (every implementation)
  const int runs = testing::RunEachImpl(
      Implementations(), fused.p, {&fused.indices, &fused.values}, [&](const std::string& impl) {
        for (int64_t t = 0; t < chunk.tokens; ++t) {
          std::vector<int64_t> want, got;
          for (int64_t j = 0; j < k; ++j) {
            const int32_t p = positions.indices.data<int32_t>()[positions.indices.Offset({t, j})];
            want.push_back(FrontendSlot(table, chunk.req_of_token[t], p));
            got.push_back(fused.indices.data<int32_t>()[fused.indices.Offset({t, j})]);
          }
          std::sort(want.begin(), want.end());
          std::sort(got.begin(), got.end());
          EXPECT_EQ(got, want) << impl << ": token " << t;
        }
      });
  EXPECT_GE(runs, 1);
}

}  // namespace
}  // namespace attnd::kernels::topk
