// The KV-slot mapping with the request of each row given per row (vLLM's req_id_per_token) or by
// cu_seqlens_q (SGLang's extend), a block stride larger than the page (other layers' pages
// interleaved in the pool) and token tables (page size 1); hostile ids and cu_seqlens_q give -1,
// never a read outside the tensors. Every implementation against the fp64 reference
// (docs/CONTRACTS.md "topk").
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/topk/topk.h"
#include "tests/harness/harness.h"
#include "tests/kernels/topk/topk_case.h"

namespace attnd::kernels::topk {
namespace {

using testing::MakeRng;

constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();

// Distinct page ids per request row, drawn from [0, 4 * max_blocks), as in a shared pool.
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

// Distinct finite logits, then a few NaN and -inf per row (never chosen; the finite top-k stays
// unique, as the mapped check needs).
void FillDistinctWithNonSelectable(TopKCase& c, std::mt19937_64& rng) {
  FillDistinct(c, rng);
  std::uniform_int_distribution<int64_t> col(0, c.cols() - 1);
  for (int64_t r = 0; r < c.rows(); ++r) {
    for (int i = 0; i < 3; ++i) c.Logit(r, col(rng)) = std::nanf("");
    for (int i = 0; i < 3; ++i) c.Logit(r, col(rng)) = -std::numeric_limits<float>::infinity();
  }
}

// A mixed batch as a vLLM-style scheduler packs it: decodes (1 query token) first, then prefills
// (chunks of several tokens). seq_lens are the tokens in the KV cache after this step.
struct Batch {
  std::vector<int64_t> query_lens;
  std::vector<int64_t> seq_lens;
  int64_t rows() const { return std::accumulate(query_lens.begin(), query_lens.end(), int64_t{0}); }
  int64_t max_seq() const { return *std::max_element(seq_lens.begin(), seq_lens.end()); }
};

// vLLM's req_id_per_token: request i repeated query_lens[i] times (repeat_interleave of arange).
std::vector<int32_t> ReqIdPerToken(const Batch& b) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < b.query_lens.size(); ++i) {
    ids.insert(ids.end(), static_cast<size_t>(b.query_lens[i]), static_cast<int32_t>(i));
  }
  return ids;
}

// SGLang's extend cu_seqlens_q: 0, then the running sum of the extend lengths.
std::vector<int32_t> CuSeqlens(const Batch& b) {
  std::vector<int32_t> cu = {0};
  for (int64_t q : b.query_lens) cu.push_back(cu.back() + static_cast<int32_t>(q));
  return cu;
}

// Causal windows: token j of request i (its query_lens[i] tokens being the last of seq_lens[i])
// sees the first seq_lens[i] - query_lens[i] + j + 1 positions. With ks/ke the request's
// positions start at column `offset` of a packed logits row (prefill form, read under
// kRowStart); with lengths they start at column 0 (decode form).
void SetCausalWindows(TopKCase& c, const Batch& b, bool packed) {
  int64_t row = 0, offset = 0;
  for (size_t i = 0; i < b.query_lens.size(); ++i) {
    for (int64_t j = 0; j < b.query_lens[i]; ++j, ++row) {
      const int64_t len = b.seq_lens[i] - b.query_lens[i] + j + 1;
      c.SetWindow(row, packed ? offset : 0, (packed ? offset : 0) + len);
    }
    offset += b.seq_lens[i];
  }
}

void RunFrontendBatch(const Batch& b, int64_t page, int64_t block_stride, bool by_cu, bool packed,
                      std::mt19937_64& rng) {
  SCOPED_TRACE(::testing::Message() << "page " << page << " block_stride " << block_stride
                                    << (by_cu ? " cu_seqlens_q" : " req_id_per_row")
                                    << (packed ? " packed ks/ke, kRowStart" : " lengths"));
  const int64_t m = b.rows(), k = 64;
  const int64_t n =
      packed ? std::accumulate(b.seq_lens.begin(), b.seq_lens.end(), int64_t{0}) : b.max_seq();
  TopKCase c(m, n, k, packed ? WindowForm::kKsKe : WindowForm::kLengths, /*with_values=*/true);
  FillDistinctWithNonSelectable(c, rng);
  SetCausalWindows(c, b, packed);
  if (packed) c.p.index_base = IndexBase::kRowStart;
  const int64_t requests = static_cast<int64_t>(b.query_lens.size());
  c.AddRequestTable(requests, (b.max_seq() + page - 1) / page, page, block_stride,
                    by_cu ? std::vector<int32_t>{} : ReqIdPerToken(b),
                    by_cu ? CuSeqlens(b) : std::vector<int32_t>{});
  FillPermutedTable(c, rng);
  RunAndCheck(c);
}

TEST(TopKRequestMap, VllmReqIdPerTokenMixedBatch) {
  auto rng = MakeRng();
  // Three decodes, then two prefill chunks (one longer than k, one shorter).
  const Batch b{{1, 1, 1, 37, 90}, {500, 1, 130, 37, 300}};
  for (int64_t page : {1, 16, 64}) {
    for (int64_t stride : {int64_t{0}, 2 * page}) {
      RunFrontendBatch(b, page, stride, /*by_cu=*/false, /*packed=*/false, rng);
      RunFrontendBatch(b, page, stride, /*by_cu=*/false, /*packed=*/true, rng);
    }
  }
}

TEST(TopKRequestMap, SglangCuSeqlensExtend) {
  auto rng = MakeRng();
  // Extend lengths with an empty request (0 new tokens) in the middle and at the end.
  const Batch b{{5, 0, 1, 70, 3, 0}, {40, 12, 1, 200, 3, 9}};
  for (int64_t page : {1, 16, 64}) {
    for (int64_t stride : {int64_t{0}, 2 * page}) {
      RunFrontendBatch(b, page, stride, /*by_cu=*/true, /*packed=*/false, rng);
      RunFrontendBatch(b, page, stride, /*by_cu=*/true, /*packed=*/true, rng);
    }
  }
}

TEST(TopKRequestMap, OneRequest) {
  auto rng = MakeRng();
  const Batch b{{7}, {300}};
  for (bool by_cu : {false, true}) {
    RunFrontendBatch(b, 1, 0, by_cu, /*packed=*/false, rng);
    RunFrontendBatch(b, 64, 128, by_cu, /*packed=*/true, rng);
  }
}

// No rows at all (every request empty) and rows with empty windows: nothing chosen, -1 padding.
TEST(TopKRequestMap, EmptyRequestsAndWindows) {
  auto rng = MakeRng();
  {
    TopKCase c(/*m=*/0, /*n=*/100, /*k=*/8, WindowForm::kLengths, /*with_values=*/true);
    c.AddRequestTable(3, 4, 16, 32, {}, {0, 0, 0, 0});
    FillPermutedTable(c, rng);
    RunAndCheck(c);
  }
  {
    TopKCase c(/*m=*/4, /*n=*/100, /*k=*/8, WindowForm::kLengths, /*with_values=*/true);
    FillDistinct(c, rng);
    for (int64_t r = 0; r < 4; ++r) c.SetWindow(r, 0, r == 2 ? 50 : 0);
    c.AddRequestTable(2, 7, 16, 32, {1, 0, 1, 0}, {});
    FillPermutedTable(c, rng);
    RunAndCheck(c);
  }
}

// Runs the case and checks, beyond the reference, that every row in `dead_rows` is all -1.
void RunExpectDeadRows(TopKCase& c, const std::vector<int64_t>& dead_rows) {
  RunAndCheck(c);
  for (int64_t r : dead_rows) {
    for (int64_t j = 0; j < c.p.k; ++j) {
      ASSERT_EQ(c.indices.data<int32_t>()[c.indices.Offset({r, j})], -1) << "row " << r;
    }
  }
}

TEST(TopKRequestMap, HostileRequestIdsGiveMinusOne) {
  auto rng = MakeRng();
  const int64_t m = 8, n = 700, k = 32, requests = 3;
  for (int64_t page : {1, 64}) {
    TopKCase c(m, n, k, WindowForm::kLengths, /*with_values=*/true);
    FillDistinctWithNonSelectable(c, rng);
    c.SetFullWindows();
    c.AddRequestTable(requests, (n + page - 1) / page, page, 3 * page,
                      {0, -1, 2, 3, kI32Max, kI32Min, 1, 1000}, {});
    FillPermutedTable(c, rng);
    RunExpectDeadRows(c, {1, 3, 4, 5, 7});
  }
}

TEST(TopKRequestMap, HostileCuSeqlensGiveMinusOne) {
  auto rng = MakeRng();
  const int64_t m = 10, n = 500, k = 16, requests = 4;
  struct Hostile {
    std::vector<int32_t> cu;
    std::vector<int64_t> dead;  // rows certainly without a request
  };
  const std::vector<Hostile> cases = {
      {{0, 3, 3, 6, 8}, {8, 9}},             // rows past cu[B]
      {{2, 4, 6, 8, 10}, {0, 1}},            // rows before cu[0]
      {{0, 9, 3, 12, 10}, {}},               // non-monotone: -1 or a request by the search
      {{kI32Max, kI32Min, 5, -1, 2}, {}},    // extremes
      {{-5, -3, kI32Min, kI32Max, -1}, {}},  // negative entries
      {{10, 8, 6, 4, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},  // decreasing: no interval holds a row
  };
  for (const Hostile& h : cases) {
    TopKCase c(m, n, k, WindowForm::kLengths, /*with_values=*/true);
    FillDistinct(c, rng);
    c.SetFullWindows();
    c.AddRequestTable(requests, (n + 15) / 16, 16, 0, {}, h.cu);
    FillPermutedTable(c, rng);
    RunExpectDeadRows(c, h.dead);
  }
}

// The CPU host helper and the contract's search agree with a linear scan on monotone data, and
// on any data return -1 or a b with cu[b] <= row < cu[b + 1].
TEST(TopKRequestMap, RowRequestSearch) {
  auto rng = MakeRng();
  std::uniform_int_distribution<int32_t> len(0, 4), any(-3, 25);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t requests = 1 + trial % 9;
    std::vector<int32_t> cu(static_cast<size_t>(requests + 1));
    const bool monotone = trial % 2 == 0;
    cu[0] = monotone ? len(rng) % 2 : any(rng);
    for (int64_t b = 1; b <= requests; ++b) cu[b] = monotone ? cu[b - 1] + len(rng) : any(rng);
    TopKCase c(/*m=*/30, /*n=*/8, /*k=*/1, WindowForm::kLengths, /*with_values=*/false);
    c.AddRequestTable(requests, 1, 1, 0, {}, cu);
    for (int64_t r = 0; r < 30; ++r) {
      const int64_t got = RowRequest(c.p, r);
      if (got >= 0) {
        ASSERT_LT(got, requests);
        ASSERT_TRUE(cu[got] <= r && r < cu[got + 1]) << "row " << r << " request " << got;
      }
      if (monotone) {
        int64_t want = -1;
        for (int64_t b = 0; b < requests; ++b) {
          if (cu[b] <= r && r < cu[b + 1]) want = b;
        }
        ASSERT_EQ(got, want) << "row " << r;
      }
    }
  }
}

TEST(TopKRequestMap, ValidateNamesTheFields) {
  TopKCase c(/*m=*/4, /*n=*/64, /*k=*/4, WindowForm::kLengths, /*with_values=*/false);
  c.SetFullWindows();
  c.AddRequestTable(2, 4, 16, 0, {0, 0, 1, 1}, {0, 2, 4});
  auto expect_invalid = [&](const char* what, const char* want_a, const char* want_b) {
    const absl::Status s = Validate(c.p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what << ": " << s;
    EXPECT_NE(s.message().find(want_a), std::string::npos) << what << ": " << s;
    EXPECT_NE(s.message().find(want_b), std::string::npos) << what << ": " << s;
  };
  expect_invalid("both tensors", "req_id_per_row", "cu_seqlens_q");
  const Tensor cu = c.p.cu_seqlens_q;
  c.p.cu_seqlens_q = Tensor{};
  EXPECT_TRUE(Validate(c.p).ok()) << Validate(c.p);
  c.p.rows_per_request = 2;
  expect_invalid("rows_per_request with req_id_per_row", "rows_per_request", "req_id_per_row");
  c.p.rows_per_request = 1;
  const Tensor ids = c.p.req_id_per_row;
  c.p.req_id_per_row = cu;  // [3], want [M] = [4]
  expect_invalid("req_id_per_row shape", "req_id_per_row", "dim");
  c.p.req_id_per_row = Tensor{};
  c.p.cu_seqlens_q = ids;  // [4], want [R + 1] = [3]
  expect_invalid("cu_seqlens_q shape", "cu_seqlens_q", "dim");
  c.p.cu_seqlens_q = cu;
  EXPECT_TRUE(Validate(c.p).ok()) << Validate(c.p);
  c.p.block_stride = 8;  // < page_size 16
  expect_invalid("block_stride below the page", "block_stride", "page_size");
  c.p.block_stride = int64_t{kI32Max} + 1;
  expect_invalid("block_stride past INT32_MAX", "block_stride", "page_size");
  c.p.block_stride = 16;
  EXPECT_TRUE(Validate(c.p).ok()) << Validate(c.p);
  c.p.block_table = Tensor{};
  c.p.page_size = 0;
  c.p.block_stride = 0;
  expect_invalid("cu_seqlens_q without a table", "cu_seqlens_q", "block_table");
  c.p.cu_seqlens_q = Tensor{};
  c.p.block_stride = 32;
  expect_invalid("block_stride without a table", "block_stride", "block_table");
}

// Slots past INT32_MAX through a large block stride give -1 (the stride multiplies the id).
TEST(TopKRequestMap, BlockStrideOverflowGivesMinusOne) {
  auto rng = MakeRng();
  const int64_t m = 2, n = 256, k = 64, page = 16;
  TopKCase c(m, n, k, WindowForm::kLengths, /*with_values=*/true);
  FillDistinct(c, rng);
  c.SetFullWindows();
  c.AddRequestTable(2, n / page, page, int64_t{1} << 24, {1, 0}, {});
  FillPermutedTable(c, rng);  // ids < 64: 63 << 24 fits
  c.Block(0, 0) = 200;        // 200 << 24 > INT32_MAX: -1
  c.Block(1, 3) = 127;        // (127 << 24) + 15 < INT32_MAX: the last slots that fit
  RunAndCheck(c);
}

}  // namespace
}  // namespace attnd::kernels::topk
