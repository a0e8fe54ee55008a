// Validate(): every malformed input is INVALID_ARGUMENT naming the tensor or scalar (one table
// row per mutation of a valid call), and Count()'s logical bytes.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/topk/topk.h"
#include "tests/harness/harness.h"
#include "tests/kernels/topk/topk_case.h"

namespace attnd::kernels::topk {
namespace {

constexpr int64_t kM = 8, kN = 300, kK = 16;

struct Mutation {
  const char* name;
  const char* names;  // the tensor or scalar the message must name
  std::function<void(Params&)> mutate;
};

void SetShape(Tensor& t, std::initializer_list<int64_t> shape) {
  t = MakeTensor(t.data, t.dtype, shape);
}

const std::vector<Mutation>& Mutations() {
  static const auto* table = new std::vector<Mutation>{
      {"logits missing", "logits", [](Params& p) { p.logits = Tensor{}; }},
      {"logits dtype", "logits", [](Params& p) { p.logits.dtype = DType::kBF16; }},
      {"logits rank 1", "logits", [](Params& p) { SetShape(p.logits, {kM * kN}); }},
      {"logits rank 3", "logits",
       [](Params& p) {
         SetShape(p.logits, {kM, 2, kN / 2});
       }},
      {"logits negative dim 1", "logits", [](Params& p) { p.logits.shape[1] = -3; }},
      {"logits negative dim 0", "logits", [](Params& p) { p.logits.shape[0] = -1; }},
      {"logits row stride below N", "logits", [](Params& p) { p.logits.strides[0] = kN - 1; }},
      {"logits last dim strided", "logits", [](Params& p) { p.logits.strides[1] = 2; }},
      {"logits null data", "logits", [](Params& p) { p.logits.data = nullptr; }},
      {"logits N past INT32_MAX", "logits",
       [](Params& p) {
         p.logits = MakeTensor(p.logits.data, DType::kF32, {1, int64_t{1} << 31});
       }},
      {"index_base 7", "index_base", [](Params& p) { p.index_base = static_cast<IndexBase>(7); }},
      {"index_base -1", "index_base", [](Params& p) { p.index_base = static_cast<IndexBase>(-1); }},
      {"k zero", "k", [](Params& p) { p.k = 0; }},
      {"k negative", "k", [](Params& p) { p.k = -2048; }},
      {"k above 4096", "k", [](Params& p) { p.k = kMaxK + 1; }},
      {"no window", "ks/ke or lengths", [](Params& p) { p.ks = p.ke = Tensor{}; }},
      {"ks missing", "ks", [](Params& p) { p.ks = Tensor{}; }},
      {"ke missing", "ke", [](Params& p) { p.ke = Tensor{}; }},
      {"lengths with ks/ke", "lengths", [](Params& p) { p.lengths = p.ks; }},
      {"ks dtype", "ks", [](Params& p) { p.ks.dtype = DType::kF32; }},
      {"ks dim 0", "ks", [](Params& p) { p.ks.shape[0] = kM - 1; }},
      {"ks rank 2", "ks",
       [](Params& p) {
         SetShape(p.ks, {kM, 1});
       }},
      {"ke dtype", "ke", [](Params& p) { p.ke.dtype = DType::kU8; }},
      {"ke dim 0", "ke", [](Params& p) { p.ke.shape[0] = kM + 1; }},
      {"ke strided", "ke", [](Params& p) { p.ke.strides[0] = 2; }},
      {"lengths dtype", "lengths",
       [](Params& p) {
         p.lengths = p.ks;
         p.ks = p.ke = Tensor{};
         p.lengths.dtype = DType::kF32;
       }},
      {"lengths dim 0", "lengths",
       [](Params& p) {
         p.lengths = p.ks;
         p.ks = p.ke = Tensor{};
         p.lengths.shape[0] = 3;
       }},
      {"lengths null data", "lengths",
       [](Params& p) {
         p.lengths = p.ks;
         p.ks = p.ke = Tensor{};
         p.lengths.data = nullptr;
       }},
      {"indices missing", "indices", [](Params& p) { p.indices = Tensor{}; }},
      {"indices dtype", "indices", [](Params& p) { p.indices.dtype = DType::kF32; }},
      {"indices dim 0", "indices", [](Params& p) { p.indices.shape[0] = kM - 1; }},
      {"indices dim 1", "indices", [](Params& p) { p.indices.shape[1] = kK - 1; }},
      {"indices rank 3", "indices",
       [](Params& p) {
         SetShape(p.indices, {kM, kK, 1});
       }},
      {"indices row stride below k", "indices", [](Params& p) { p.indices.strides[0] = kK - 1; }},
      {"indices last dim strided", "indices", [](Params& p) { p.indices.strides[1] = 3; }},
      {"values dtype", "values", [](Params& p) { p.values.dtype = DType::kI32; }},
      {"values dim 1", "values", [](Params& p) { p.values.shape[1] = kK + 1; }},
      {"values rank 1", "values", [](Params& p) { SetShape(p.values, {kM * kK}); }},
      {"values negative stride", "values", [](Params& p) { p.values.strides[0] = -kK; }},
      {"page_size without block_table", "page_size", [](Params& p) { p.page_size = 64; }},
      {"rows_per_request zero", "rows_per_request", [](Params& p) { p.rows_per_request = 0; }},
      {"rows_per_request negative", "rows_per_request", [](Params& p) { p.rows_per_request = -2; }},
  };
  return *table;
}

// Mutations of a valid call with a block table ([kM / 2, 8], page 64, two rows per request).
const std::vector<Mutation>& TableMutations() {
  static const auto* table = new std::vector<Mutation>{
      {"block_table dtype", "block_table", [](Params& p) { p.block_table.dtype = DType::kF32; }},
      {"block_table rank 1", "block_table",
       [](Params& p) { SetShape(p.block_table, {kM / 2 * 8}); }},
      {"block_table dim 0", "block_table", [](Params& p) { p.block_table.shape[0] = kM / 2 + 1; }},
      {"block_table negative dim 1", "block_table", [](Params& p) { p.block_table.shape[1] = -1; }},
      {"block_table null data", "block_table", [](Params& p) { p.block_table.data = nullptr; }},
      {"rows_per_request not dividing M", "block_table", [](Params& p) { p.rows_per_request = 3; }},
      {"rows_per_request overflowing", "block_table",
       [](Params& p) { p.rows_per_request = int64_t{1} << 62; }},
      {"rows_per_request zero with table", "rows_per_request",
       [](Params& p) { p.rows_per_request = 0; }},
      {"page_size zero", "page_size", [](Params& p) { p.page_size = 0; }},
      {"page_size negative", "page_size", [](Params& p) { p.page_size = -64; }},
      {"page_size past INT32_MAX", "page_size", [](Params& p) { p.page_size = int64_t{1} << 31; }},
  };
  return *table;
}

void ExpectAllRejected(TopKCase& c, const std::vector<Mutation>& table) {
  ASSERT_TRUE(Validate(c.p).ok()) << Validate(c.p);
  for (const Mutation& m : table) {
    SCOPED_TRACE(m.name);
    Params p = c.p;
    m.mutate(p);
    const absl::Status s = Validate(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(std::string(s.message()).rfind(m.names, 0), 0u)
        << "message '" << s.message() << "' does not start with '" << m.names << "'";
    // Run() refuses the same call before touching any data.
    ExecContext ctx;
    EXPECT_EQ(Run(p, ctx).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(TopKValidate, RejectsEveryMalformedInput) {
  TopKCase c(kM, kN, kK, WindowForm::kKsKe, /*with_values=*/true);
  ExpectAllRejected(c, Mutations());
}

TEST(TopKValidate, RejectsEveryMalformedBlockTable) {
  TopKCase c(kM, kN, kK, WindowForm::kLengths, /*with_values=*/false);
  c.AddBlockTable(/*max_blocks=*/8, /*page_size=*/64, /*rows_per_request=*/2);
  ExpectAllRejected(c, TableMutations());
}

TEST(TopKValidate, AcceptsEdgeShapes) {
  TopKCase empty_rows(0, 0, 1, WindowForm::kKsKe, /*with_values=*/true);
  EXPECT_TRUE(Validate(empty_rows.p).ok()) << Validate(empty_rows.p);
  TopKCase max_k(2, 10, kMaxK, WindowForm::kLengths, /*with_values=*/false, /*logits_ld=*/16,
                 /*out_ld=*/kMaxK + 8);
  EXPECT_TRUE(Validate(max_k.p).ok()) << Validate(max_k.p);
  max_k.AddBlockTable(/*max_blocks=*/0, /*page_size=*/1, /*rows_per_request=*/1);
  EXPECT_TRUE(Validate(max_k.p).ok()) << Validate(max_k.p);
}

TEST(TopKCount, LogicalBytes) {
  TopKCase c(4, 1000, 64, WindowForm::kKsKe, /*with_values=*/true);
  c.SetWindow(0, 0, 1000);    // 1000 valid
  c.SetWindow(1, -5, 10);     // 10
  c.SetWindow(2, 500, 400);   // 0
  c.SetWindow(3, 990, 5000);  // 10
  WorkCount w = Count(c.p);
  EXPECT_EQ(w.flops, 0.0);
  const double outputs = 2 * 4.0 * 4 * 64;
  EXPECT_EQ(w.bytes, 4.0 * 1020 + 8.0 * 4 + outputs);
  // Two rows per request, page 64: request 0 spans pages 0..15, request 1 page 15.
  c.AddBlockTable(/*max_blocks=*/16, /*page_size=*/64, /*rows_per_request=*/2);
  w = Count(c.p);
  EXPECT_EQ(w.bytes, 4.0 * 1020 + 8.0 * 4 + outputs + 4.0 * (16 + 1));
}

}  // namespace
}  // namespace attnd::kernels::topk
