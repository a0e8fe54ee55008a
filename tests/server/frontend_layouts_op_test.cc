// The request glue of two frontend layouts (docs/CONTRACTS.md "topk" and
// "indexer_logits_paged"): TopKRequest.index_base reaches the kernel (ROW_START writes positions
// from each window start; an unknown value is INVALID_ARGUMENT naming index_base; the launch key
// tells the bases apart), and IndexerLogitsPagedRequest.context_lens of shape [B, next_n] runs
// per token; TopKRequest's request-of-a-row forms and block_stride. Inline tensors, the CPU
// kernels; outputs compared with a direct kernel call.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/common/fp8.h"
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"
#include "kernels/topk/topk.h"
#include "server/ops/op_handler.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/server/daemon_fixture.h"

namespace attnd::server::ops {
namespace {

using attnd::testing::HostTensor;
using kernels::DType;

using attnd::server::testing::InlineTensor;

class FrontendLayoutsOpTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::unique_ptr<PreparedCall>> Prepare(OpId op,
                                                        const google::protobuf::Message& request,
                                                        google::protobuf::Message* response) {
    PrepareOptions options;
    options.max_inline_bytes = 1 << 30;
    return table_.Find(op)->Prepare(request, response, options);
  }
  absl::Status Run(PreparedCall& call) {
    kernels::ExecContext ctx;
    ctx.pool = attnd::testing::TestPool();
    std::string impl;
    return call.Run(ctx, call.HostData(), &impl);
  }

  OpTable table_;
};

TEST_F(FrontendLayoutsOpTest, TopKIndexBase) {
  std::mt19937_64 rng = attnd::testing::MakeRng();
  const int64_t m = 4, n = 500, k = 32;
  HostTensor logits = HostTensor::Dense(DType::kF32, {m, n});
  HostTensor ks = HostTensor::Dense(DType::kI32, {m});
  HostTensor ke = HostTensor::Dense(DType::kI32, {m});
  attnd::testing::FillNormal(logits, rng, 1.0);
  const int32_t begins[m] = {0, 100, 250, 490}, ends[m] = {500, 400, 260, 500};
  for (int64_t r = 0; r < m; ++r) {
    ks.data<int32_t>()[r] = begins[r];
    ke.data<int32_t>()[r] = ends[r];
  }
  v1::TopKRequest request;
  *request.mutable_logits() = InlineTensor(logits, v1::DTYPE_F32);
  *request.mutable_ks() = InlineTensor(ks, v1::DTYPE_I32);
  *request.mutable_ke() = InlineTensor(ke, v1::DTYPE_I32);
  request.set_k(k);

  // The absolute form (unset), then ROW_START: entries differ by the row's ks, -1 stays.
  v1::TopKResponse absolute_response, relative_response;
  auto absolute = Prepare(OpId::kTopK, request, &absolute_response);
  ASSERT_TRUE(absolute.ok()) << absolute.status();
  ASSERT_TRUE(Run(**absolute).ok());
  v1::TopKRequest relative_request = request;
  relative_request.set_index_base(v1::TopKRequest::INDEX_BASE_ROW_START);
  auto relative = Prepare(OpId::kTopK, relative_request, &relative_response);
  ASSERT_TRUE(relative.ok()) << relative.status();
  EXPECT_NE((*relative)->LaunchKey(), (*absolute)->LaunchKey());
  ASSERT_TRUE(Run(**relative).ok());
  const std::string& a = absolute_response.indices().inline_data();
  const std::string& b = relative_response.indices().inline_data();
  ASSERT_EQ(a.size(), static_cast<size_t>(m * k * 4));
  ASSERT_EQ(b.size(), a.size());
  int64_t padded = 0;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      int32_t x, y;
      std::memcpy(&x, a.data() + 4 * (r * k + j), 4);
      std::memcpy(&y, b.data() + 4 * (r * k + j), 4);
      if (x == -1) {
        EXPECT_EQ(y, -1) << "row " << r << " entry " << j;
        ++padded;
      } else {
        EXPECT_EQ(y, x - begins[r]) << "row " << r << " entry " << j;
      }
    }
  }
  EXPECT_EQ(padded, 2 * (k - 10)) << "rows 2 and 3 have 10 columns each";

  // The kernel called directly writes the same bytes.
  HostTensor indices = HostTensor::Dense(DType::kI32, {m, k});
  kernels::topk::Params p;
  p.logits = logits.tensor();
  p.ks = ks.tensor();
  p.ke = ke.tensor();
  p.k = k;
  p.indices = indices.tensor();
  p.index_base = kernels::topk::IndexBase::kRowStart;
  kernels::ExecContext ctx;
  ctx.pool = attnd::testing::TestPool();
  ASSERT_TRUE(kernels::topk::Run(p, ctx).ok());
  EXPECT_EQ(std::memcmp(indices.raw(), b.data(), b.size()), 0);

  // An index base outside the enum.
  for (int bad : {3, 7, -1}) {
    v1::TopKRequest wrong = request;
    wrong.set_index_base(static_cast<v1::TopKRequest::IndexBase>(bad));
    v1::TopKResponse response;
    auto call = Prepare(OpId::kTopK, wrong, &response);
    ASSERT_FALSE(call.ok()) << bad;
    EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(call.status().message(), "index_base")) << call.status();
  }
}

TEST_F(FrontendLayoutsOpTest, IndexerLogitsPagedPerTokenLengths) {
  std::mt19937_64 rng = attnd::testing::MakeRng();
  const int64_t batch = 2, next_n = 3, heads = 32, dim = 64, block = 16, max_blocks = 4;
  const int64_t num_blocks = 8, block_bytes = block * (dim + 4), cols = max_blocks * block;
  HostTensor q = HostTensor::Dense(DType::kFp8E4M3, {batch, next_n, heads, dim});
  HostTensor cache = HostTensor::Dense(DType::kU8, {num_blocks, block_bytes});
  HostTensor table = HostTensor::Dense(DType::kI32, {batch, max_blocks});
  HostTensor lens = HostTensor::Dense(DType::kI32, {batch, next_n});
  HostTensor weights = HostTensor::Dense(DType::kF32, {batch * next_n, heads});
  attnd::testing::FillNormal(q, rng, 1.0);
  attnd::testing::FillNormal(weights, rng, 1.0);
  std::normal_distribution<float> key(0.0f, 1.0f);
  for (int64_t b = 0; b < num_blocks; ++b) {
    uint8_t* row = cache.data<uint8_t>() + b * block_bytes;
    for (int64_t i = 0; i < block * dim; ++i) row[i] = kernels::FloatToFp8E4M3(key(rng));
    for (int64_t t = 0; t < block; ++t) {
      const float s = 0.05f;
      std::memcpy(row + block * dim + 4 * t, &s, 4);
    }
  }
  const int32_t ids[batch * max_blocks] = {5, 1, 7, 0, 2, 6, 3, 4};
  std::memcpy(table.raw(), ids, sizeof ids);
  const int32_t token_lens[batch * next_n] = {64, 3, 0, 17, 18, 70};  // any order, clamped
  std::memcpy(lens.raw(), token_lens, sizeof token_lens);

  v1::IndexerLogitsPagedRequest request;
  *request.mutable_q() = InlineTensor(q, v1::DTYPE_FP8_E4M3);
  *request.mutable_kv_cache() = InlineTensor(cache, v1::DTYPE_U8);
  *request.mutable_block_table() = InlineTensor(table, v1::DTYPE_I32);
  *request.mutable_context_lens() = InlineTensor(lens, v1::DTYPE_I32);
  *request.mutable_weights() = InlineTensor(weights, v1::DTYPE_F32);
  request.set_block_size(block);
  v1::IndexerLogitsPagedResponse response;
  auto call = Prepare(OpId::kIndexerLogitsPaged, request, &response);
  ASSERT_TRUE(call.ok()) << call.status();
  ASSERT_TRUE(Run(**call).ok());
  const kernels::WorkCount count = (*call)->Count();
  EXPECT_EQ(count.flops, 2.0 * heads * dim * (64 + 3 + 0 + 17 + 18 + 64));

  HostTensor logits = HostTensor::Dense(DType::kF32, {batch * next_n, cols});
  kernels::indexer_logits_paged::Params p;
  p.q = q.tensor();
  p.kv_cache = cache.tensor();
  p.block_size = block;
  p.block_table = table.tensor();
  p.context_lens = lens.tensor();
  p.weights = weights.tensor();
  p.logits = logits.tensor();
  kernels::ExecContext ctx;
  ctx.pool = attnd::testing::TestPool();
  ASSERT_TRUE(kernels::indexer_logits_paged::Run(p, ctx).ok());
  const std::string& got = response.logits().inline_data();
  ASSERT_EQ(got.size(), static_cast<size_t>(batch * next_n * cols * 4));
  EXPECT_EQ(std::memcmp(logits.raw(), got.data(), got.size()), 0);
  float row2[4];  // token 2 of request 0 has length 0: -inf throughout
  std::memcpy(row2, got.data() + 4 * (2 * cols), sizeof row2);
  EXPECT_TRUE(std::isinf(row2[0]) && row2[0] < 0);

  // A [B, next_n + 1] context_lens is refused, naming the tensor.
  HostTensor wide = HostTensor::Dense(DType::kI32, {batch, next_n + 1});
  *request.mutable_context_lens() = InlineTensor(wide, v1::DTYPE_I32);
  v1::IndexerLogitsPagedResponse refused;
  auto bad = Prepare(OpId::kIndexerLogitsPaged, request, &refused);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "context_lens")) << bad.status();
}

// TopKRequest.req_id_per_row / cu_seqlens_q / block_stride reach the kernel: a vLLM-style mixed
// batch (req_id_per_token) and the same batch as SGLang's cu_seqlens_q write the same slots as a
// direct kernel call, and each slot is table[b][n / page] * block_stride + n % page; two request
// forms at once are INVALID_ARGUMENT naming both fields.
TEST_F(FrontendLayoutsOpTest, TopKRequestMapAndBlockStride) {
  std::mt19937_64 rng = attnd::testing::MakeRng();
  const int64_t m = 5, n = 300, k = 16, page = 16, stride = 2 * page, requests = 3;
  const int64_t max_blocks = (n + page - 1) / page;
  // Request 0: one decode token; request 1: a prefill chunk of 3; request 2: one decode token.
  const int32_t ids[m] = {0, 1, 1, 1, 2};
  const int32_t cu[requests + 1] = {0, 1, 4, 5};
  const int32_t lens[m] = {300, 98, 99, 100, 7};
  HostTensor logits = HostTensor::Dense(DType::kF32, {m, n});
  HostTensor lengths = HostTensor::Dense(DType::kI32, {m});
  HostTensor req_ids = HostTensor::Dense(DType::kI32, {m});
  HostTensor cu_seqlens = HostTensor::Dense(DType::kI32, {requests + 1});
  HostTensor table = HostTensor::Dense(DType::kI32, {requests, max_blocks});
  attnd::testing::FillNormal(logits, rng, 1.0);
  std::uniform_int_distribution<int32_t> block(0, 1000);
  for (int64_t i = 0; i < requests * max_blocks; ++i) table.data<int32_t>()[i] = block(rng);
  for (int64_t r = 0; r < m; ++r) {
    lengths.data<int32_t>()[r] = lens[r];
    req_ids.data<int32_t>()[r] = ids[r];
  }
  for (int64_t b = 0; b <= requests; ++b) cu_seqlens.data<int32_t>()[b] = cu[b];

  v1::TopKRequest request;
  *request.mutable_logits() = InlineTensor(logits, v1::DTYPE_F32);
  *request.mutable_lengths() = InlineTensor(lengths, v1::DTYPE_I32);
  *request.mutable_block_table() = InlineTensor(table, v1::DTYPE_I32);
  request.set_k(k);
  request.set_page_size(page);
  request.set_block_stride(stride);
  *request.mutable_values() = v1::Tensor{};

  HostTensor indices = HostTensor::Dense(DType::kI32, {m, k});
  HostTensor values = HostTensor::Dense(DType::kF32, {m, k});
  kernels::topk::Params p;
  p.logits = logits.tensor();
  p.lengths = lengths.tensor();
  p.k = k;
  p.block_table = table.tensor();
  p.page_size = page;
  p.block_stride = stride;
  p.req_id_per_row = req_ids.tensor();
  p.indices = indices.tensor();
  p.values = values.tensor();
  kernels::ExecContext ctx;
  ctx.pool = attnd::testing::TestPool();
  ASSERT_TRUE(kernels::topk::Run(p, ctx).ok());

  for (bool by_cu : {false, true}) {
    SCOPED_TRACE(by_cu ? "cu_seqlens_q" : "req_id_per_row");
    v1::TopKRequest mapped = request;
    if (by_cu) {
      *mapped.mutable_cu_seqlens_q() = InlineTensor(cu_seqlens, v1::DTYPE_I32);
    } else {
      *mapped.mutable_req_id_per_row() = InlineTensor(req_ids, v1::DTYPE_I32);
    }
    v1::TopKResponse response;
    auto call = Prepare(OpId::kTopK, mapped, &response);
    ASSERT_TRUE(call.ok()) << call.status();
    ASSERT_TRUE(Run(**call).ok());
    const std::string& got = response.indices().inline_data();
    ASSERT_EQ(got.size(), static_cast<size_t>(m * k * 4));
    EXPECT_EQ(std::memcmp(indices.raw(), got.data(), got.size()), 0);
    // Each slot from its value's column: the column whose logit equals the value.
    const std::string& vals = response.values().inline_data();
    ASSERT_EQ(vals.size(), got.size());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        int32_t slot;
        float v;
        std::memcpy(&slot, got.data() + 4 * (r * k + j), 4);
        std::memcpy(&v, vals.data() + 4 * (r * k + j), 4);
        if (j >= lens[r]) {  // fewer columns than k: -1 padding
          EXPECT_EQ(slot, -1) << "row " << r << " entry " << j;
          continue;
        }
        int64_t col = -1;
        for (int64_t c = 0; c < lens[r]; ++c) {
          if (logits.data<float>()[r * n + c] == v) col = c;
        }
        ASSERT_GE(col, 0) << "row " << r << " entry " << j;
        const int64_t want =
            int64_t{table.data<int32_t>()[ids[r] * max_blocks + col / page]} * stride + col % page;
        EXPECT_EQ(slot, want) << "row " << r << " entry " << j;
      }
    }
  }

  // Two forms of the request of a row.
  v1::TopKRequest both = request;
  *both.mutable_req_id_per_row() = InlineTensor(req_ids, v1::DTYPE_I32);
  *both.mutable_cu_seqlens_q() = InlineTensor(cu_seqlens, v1::DTYPE_I32);
  v1::TopKRequest with_rows = request;
  *with_rows.mutable_req_id_per_row() = InlineTensor(req_ids, v1::DTYPE_I32);
  with_rows.set_rows_per_request(5);
  for (const auto& [bad, first, second] :
       {std::tuple{both, "req_id_per_row", "cu_seqlens_q"},
        std::tuple{with_rows, "rows_per_request", "req_id_per_row"}}) {
    v1::TopKResponse response;
    auto call = Prepare(OpId::kTopK, bad, &response);
    ASSERT_FALSE(call.ok());
    EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(call.status().message(), first)) << call.status();
    EXPECT_TRUE(absl::StrContains(call.status().message(), second)) << call.status();
  }
  // A block stride below the page.
  v1::TopKRequest narrow = request;
  narrow.set_block_stride(page - 1);
  v1::TopKResponse response;
  auto call = Prepare(OpId::kTopK, narrow, &response);
  ASSERT_FALSE(call.ok());
  EXPECT_TRUE(absl::StrContains(call.status().message(), "block_stride")) << call.status();
}

}  // namespace
}  // namespace attnd::server::ops
