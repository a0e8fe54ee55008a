// The fused "to KV slots" form of top-k: chosen columns mapped through a block table, invalid
// page ids giving -1, and several rows sharing one request's table row.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "tests/harness/harness.h"
#include "tests/kernels/topk/topk_case.h"

namespace attnd::kernels::topk {
namespace {

using testing::MakeRng;

// Distinct page ids per request row, drawn from [0, 4 * max_blocks).
void FillPermutedTable(TopKCase& c, std::mt19937_64& rng) {
  const int64_t requests = c.p.block_table.dim(0);
  const int64_t max_blocks = c.p.block_table.dim(1);
  std::vector<int32_t> ids(static_cast<size_t>(4 * max_blocks));
  for (int64_t q = 0; q < requests; ++q) {
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int64_t b = 0; b < max_blocks; ++b) c.Block(q, b) = ids[static_cast<size_t>(b)];
  }
}

TEST(TopKKvSlots, Mapping) {
  auto rng = MakeRng();
  for (int64_t page : {1, 48, 64}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << page);
    const int64_t m = 6, n = 4096 + 50, k = 256;
    TopKCase c(m, n, k, WindowForm::kKsKe, /*with_values=*/true);
    FillDistinct(c, rng);
    std::uniform_int_distribution<int64_t> pos(-10, n + 10);
    for (int64_t r = 0; r < m; ++r) {
      const int64_t a = pos(rng), b = pos(rng);
      c.SetWindow(r, std::min(a, b), std::max(a, b));
    }
    c.SetWindow(0, 0, n);
    c.SetWindow(1, 10, 10 + k / 2);  // shorter than k: -1 padding after the slots
    c.AddBlockTable((n + page - 1) / page, page, /*rows_per_request=*/1);
    FillPermutedTable(c, rng);
    RunAndCheck(c);
  }
}

TEST(TopKKvSlots, InvalidPageIds) {
  auto rng = MakeRng();
  const int64_t m = 4, n = 4096, k = 512, page = 64;
  TopKCase c(m, n, k, WindowForm::kLengths, /*with_values=*/true);
  FillDistinct(c, rng);
  c.SetFullWindows();
  // 40 pages cover columns [0, 2560): chosen columns past them map to -1 (never read the table
  // out of bounds).
  c.AddBlockTable(/*max_blocks=*/40, page, /*rows_per_request=*/1);
  FillPermutedTable(c, rng);
  for (int64_t q = 0; q < m; ++q) {
    c.Block(q, 3) = -1;
    c.Block(q, 7) = -5;
    c.Block(q, 11) = std::numeric_limits<int32_t>::min();
    c.Block(q, 13) = std::numeric_limits<int32_t>::max() / 64 + 10;  // slot past INT32_MAX
  }
  // Row 3's best values sit in the unmapped pages: they are still chosen, and come out as -1.
  for (int64_t j = 3 * page; j < 4 * page; ++j) c.Logit(3, j) = 1e6f + static_cast<float>(j);
  for (int64_t j = 3000; j < 3100; ++j) c.Logit(3, j) = 2e6f + static_cast<float>(j);
  RunAndCheck(c);
}

TEST(TopKKvSlots, RowsPerRequestTwo) {
  auto rng = MakeRng();
  for (int64_t page : {16, 64}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << page);
    const int64_t requests = 4, m = 2 * requests, k = 128;
    const int64_t n = 3000;
    TopKCase c(m, n, k, WindowForm::kLengths, /*with_values=*/true);
    FillDistinct(c, rng);
    // Decode with next_n = 2: token j of request q sees context_len - 2 + j + 1 columns.
    const int64_t context[requests] = {1, 100, 1999, 3000};
    for (int64_t q = 0; q < requests; ++q) {
      c.SetWindow(2 * q, 0, context[q] - 1);
      c.SetWindow(2 * q + 1, 0, context[q]);
    }
    // The last page is only partly covered by the longest window.
    c.AddBlockTable((n + page - 1) / page, page, /*rows_per_request=*/2);
    FillPermutedTable(c, rng);
    RunAndCheck(c);
  }
}

}  // namespace
}  // namespace attnd::kernels::topk
