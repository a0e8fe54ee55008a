// Named cache layouts (docs/CONTRACTS.md "Named layouts") through the op handlers: for each op
// with a cache tensor (sparse_mla, mla_decode, indexer_logits_paged, dsa_attention), an
// unspecified layout and the right named one run and give the same bytes, and a contradicting
// layout, a layout of another op and a value outside the enum are INVALID_ARGUMENT naming the
// layout field. The "required" rule (a layout that shares its dtype and width with another)
// through CheckCacheLayout with a table of its own, as no op has such a pair yet. GetInfo lists
// each op's layouts.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/op_traits.h"
#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/common/cache_layout.h"
#include "kernels/common/fp8.h"
#include "kernels/common/status_details.h"
#include "server/ops/op_handler.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/server/daemon_fixture.h"

namespace attnd::server::ops {
namespace {

using attnd::testing::HostTensor;
using kernels::DType;

using attnd::server::testing::InlineTensor;

HostTensor Bf16(std::mt19937_64& rng, std::initializer_list<int64_t> shape) {
  HostTensor t = HostTensor::Dense(DType::kBF16, shape);
  attnd::testing::FillNormal(t, rng, 1.0);
  return t;
}

HostTensor Fp8(std::mt19937_64& rng, std::initializer_list<int64_t> shape) {
  HostTensor t = HostTensor::Dense(DType::kFp8E4M3, shape);
  attnd::testing::FillNormal(t, rng, 1.0);
  return t;
}

HostTensor I32(std::initializer_list<int64_t> shape, const std::vector<int32_t>& values) {
  HostTensor t = HostTensor::Dense(DType::kI32, shape);
  std::memcpy(t.raw(), values.data(), values.size() * 4);
  return t;
}

// An FP8 MLA cache of `rows` 656-byte rows (kernels/sparse_mla/params.h): random codes (no NaN),
// positive scales, random bf16 rope.
HostTensor Fp8Cache(std::mt19937_64& rng, int64_t rows) {
  HostTensor t = HostTensor::Dense(DType::kU8, {rows, 656});
  std::normal_distribution<float> value(0.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = t.data<uint8_t>() + r * 656;
    for (int c = 0; c < 512; ++c) row[c] = kernels::FloatToFp8E4M3(value(rng));
    for (int j = 0; j < 4; ++j) {
      const float s = 0.02f * (j + 1);
      std::memcpy(row + 512 + 4 * j, &s, 4);
    }
    for (int c = 0; c < 64; ++c) {
      const uint16_t b = kernels::FloatToBf16(value(rng));
      std::memcpy(row + 528 + 2 * c, &b, 2);
    }
  }
  return t;
}

// A per-tensor FP8 MLA cache (docs/CONTRACTS.md "Per-tensor FP8 KV cache"): `shape`'s rows of
// e4m3 codes of N(0, 1) / `scale`, saturated as vLLM's writer does (kernels/common/fp8.h).
HostTensor PerTensorCache(std::mt19937_64& rng, const std::vector<int64_t>& shape, float scale) {
  HostTensor t = HostTensor::Dense(DType::kU8, shape);
  std::normal_distribution<float> value(0.0f, 1.0f);
  for (int64_t i = 0; i < t.bytes(); ++i) t.raw()[i] = kernels::FloatToFp8E4M3(value(rng) / scale);
  return t;
}

class LayoutsTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::unique_ptr<PreparedCall>> Prepare(OpId op,
                                                        const google::protobuf::Message& request,
                                                        google::protobuf::Message* response) {
    PrepareOptions options;
    options.max_inline_bytes = 1 << 30;
    return table_.Find(op)->Prepare(request, response, options);
  }

  // Prepares and runs `request`; the response's `out_field` bytes.
  template <class Response, class Request>
  std::string RunOk(OpId op, const Request& request, const std::string& out_field) {
    Response response;
    auto call = Prepare(op, request, &response);
    EXPECT_TRUE(call.ok()) << call.status();
    if (!call.ok()) return {};
    kernels::ExecContext ctx;
    ctx.pool = attnd::testing::TestPool();
    std::string impl;
    const absl::Status st = (*call)->Run(ctx, (*call)->HostData(), &impl);
    EXPECT_TRUE(st.ok()) << st;
    const v1::Tensor* out = FindTensor(response, out_field);
    EXPECT_NE(out, nullptr);
    return out == nullptr ? std::string() : out->inline_data();
  }

  // Prepare refuses `request` with INVALID_ARGUMENT whose bad field is `field` and whose message
  // holds each of `words`.
  template <class Response, class Request>
  void ExpectRefused(OpId op, const Request& request, const std::string& field,
                     const std::vector<std::string>& words) {
    Response response;
    auto call = Prepare(op, request, &response);
    ASSERT_FALSE(call.ok());
    EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument) << call.status();
    EXPECT_EQ(kernels::BadField(call.status()).value_or(""), field) << call.status();
    EXPECT_TRUE(absl::StartsWith(call.status().message(), field + ": ")) << call.status();
    for (const std::string& w : words) {
      EXPECT_TRUE(absl::StrContains(call.status().message(), w)) << w << " in " << call.status();
    }
  }

  OpTable table_;
  std::mt19937_64 rng_ = attnd::testing::MakeRng();
};

v1::SparseMlaRequest SparseMlaCase(std::mt19937_64& rng, const HostTensor& kv, v1::DType kv_type,
                                   int64_t d_qk) {
  const int64_t t = 3, h = 8, s = kv.tensor().shape[0];
  std::vector<int32_t> idx;
  for (int64_t i = 0; i < t * 5; ++i) idx.push_back(static_cast<int32_t>((7 * i + 3) % s));
  idx[4] = -1;  // masked
  v1::SparseMlaRequest r;
  HostTensor q = d_qk == 576 ? Bf16(rng, {t, h, 576}) : Bf16(rng, {t, h, 512});
  *r.mutable_q() = InlineTensor(q, v1::DTYPE_BF16);
  *r.mutable_kv() = InlineTensor(kv, kv_type);
  *r.mutable_indices() = InlineTensor(I32({t, 5}, idx), v1::DTYPE_I32);
  r.set_sm_scale(1.0f / std::sqrt(static_cast<float>(d_qk)));
  return r;
}

TEST_F(LayoutsTest, SparseMla) {
  const HostTensor bf16_576 = Bf16(rng_, {20, 576});
  const HostTensor bf16_512 = Bf16(rng_, {20, 512});
  const HostTensor fp8 = Fp8Cache(rng_, 20);
  const HostTensor pt_576 = PerTensorCache(rng_, {20, 576}, 0.125f);
  const HostTensor pt_512 = PerTensorCache(rng_, {20, 512}, 0.125f);
  struct Case {
    const HostTensor* kv;
    v1::DType dtype;
    int64_t d_qk;
    v1::CacheLayout right, wrong;
    const char* tensor_words;
    float kv_scale = 0;
  };
  const Case cases[] = {
      {&bf16_576, v1::DTYPE_BF16, 576, v1::CACHE_LAYOUT_BF16_576, v1::CACHE_LAYOUT_FLASHMLA_FP8_656,
       "kv is bf16 with last dim 576"},
      {&bf16_512, v1::DTYPE_BF16, 512, v1::CACHE_LAYOUT_BF16_512, v1::CACHE_LAYOUT_BF16_576,
       "kv is bf16 with last dim 512"},
      {&fp8, v1::DTYPE_U8, 576, v1::CACHE_LAYOUT_FLASHMLA_FP8_656, v1::CACHE_LAYOUT_BF16_576,
       "kv is u8 with last dim 656"},
      {&pt_576, v1::DTYPE_U8, 576, v1::CACHE_LAYOUT_FP8_576_PER_TENSOR,
       v1::CACHE_LAYOUT_FLASHMLA_FP8_656, "kv is u8 with last dim 576", 0.125f},
      {&pt_512, v1::DTYPE_U8, 512, v1::CACHE_LAYOUT_FP8_512_PER_TENSOR,
       v1::CACHE_LAYOUT_FP8_576_PER_TENSOR, "kv is u8 with last dim 512", 0.125f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(v1::CacheLayout_Name(c.right));
    v1::SparseMlaRequest r = SparseMlaCase(rng_, *c.kv, c.dtype, c.d_qk);
    r.set_kv_scale(c.kv_scale);
    const std::string unspecified = RunOk<v1::SparseMlaResponse>(OpId::kSparseMla, r, "out");
    r.set_kv_layout(c.right);
    const std::string named = RunOk<v1::SparseMlaResponse>(OpId::kSparseMla, r, "out");
    ASSERT_FALSE(unspecified.empty());
    EXPECT_EQ(named, unspecified);
    // Contradicting: both the layout asked for and what kv is, and the layout kv has.
    r.set_kv_layout(c.wrong);
    ExpectRefused<v1::SparseMlaResponse>(
        OpId::kSparseMla, r, "kv_layout",
        {v1::CacheLayout_Name(c.wrong), c.tensor_words,
         std::string("the shape of ") + v1::CacheLayout_Name(c.right)});
  }
  v1::SparseMlaRequest r = SparseMlaCase(rng_, bf16_576, v1::DTYPE_BF16, 576);
  r.set_kv_layout(v1::CACHE_LAYOUT_INDEXER_FP8_BLOCKS);  // not a layout of kv
  ExpectRefused<v1::SparseMlaResponse>(
      OpId::kSparseMla, r, "kv_layout",
      {"CACHE_LAYOUT_INDEXER_FP8_BLOCKS, not a layout kv may have", "CACHE_LAYOUT_BF16_576"});
  for (int bad : {99, 100, -1}) {  // proto3 enums are open: a value outside it arrives as is
    r.set_kv_layout(static_cast<v1::CacheLayout>(bad));
    ExpectRefused<v1::SparseMlaResponse>(OpId::kSparseMla, r, "kv_layout",
                                         {std::to_string(bad), "not a CacheLayout"});
  }
}

TEST_F(LayoutsTest, MlaDecode) {
  for (const int64_t d_qk : {576, 512}) {
    SCOPED_TRACE(d_qk);
    const int64_t b = 2, s_q = 1, h = 4, pages = 4, page = 8;
    v1::MlaDecodeRequest r;
    *r.mutable_q() = InlineTensor(
        d_qk == 576 ? Bf16(rng_, {b, s_q, h, 576}) : Bf16(rng_, {b, s_q, h, 512}), v1::DTYPE_BF16);
    *r.mutable_kv_cache() =
        InlineTensor(d_qk == 576 ? Bf16(rng_, {pages, page, 576}) : Bf16(rng_, {pages, page, 512}),
                     v1::DTYPE_BF16);
    *r.mutable_block_table() = InlineTensor(I32({b, 2}, {2, 0, 3, 1}), v1::DTYPE_I32);
    *r.mutable_cache_seqlens() = InlineTensor(I32({b}, {11, 16}), v1::DTYPE_I32);
    r.set_sm_scale(0.05f);
    r.set_causal(true);
    const std::string unspecified = RunOk<v1::MlaDecodeResponse>(OpId::kMlaDecode, r, "out");
    const v1::CacheLayout right =
        d_qk == 576 ? v1::CACHE_LAYOUT_BF16_576 : v1::CACHE_LAYOUT_BF16_512;
    const v1::CacheLayout wrong =
        d_qk == 576 ? v1::CACHE_LAYOUT_BF16_512 : v1::CACHE_LAYOUT_BF16_576;
    r.set_kv_cache_layout(right);
    const std::string named = RunOk<v1::MlaDecodeResponse>(OpId::kMlaDecode, r, "out");
    ASSERT_FALSE(unspecified.empty());
    EXPECT_EQ(named, unspecified);
    r.set_kv_cache_layout(wrong);
    ExpectRefused<v1::MlaDecodeResponse>(
        OpId::kMlaDecode, r, "kv_cache_layout",
        {v1::CacheLayout_Name(wrong), "kv_cache is bf16 with last dim " + std::to_string(d_qk)});
    r.set_kv_cache_layout(v1::CACHE_LAYOUT_FLASHMLA_FP8_656);  // mla_decode reads bf16 only
    ExpectRefused<v1::MlaDecodeResponse>(OpId::kMlaDecode, r, "kv_cache_layout",
                                         {"not a layout kv_cache may have"});
    r.set_kv_cache_layout(static_cast<v1::CacheLayout>(1000));
    ExpectRefused<v1::MlaDecodeResponse>(OpId::kMlaDecode, r, "kv_cache_layout",
                                         {"1000", "not a CacheLayout"});

    // The per-tensor FP8 cache of the same shape, with its scale: unset and named run alike;
    // a bf16 layout named on it, a missing or negative scale are refused.
    const float scale = 0.0625f;
    *r.mutable_kv_cache() =
        InlineTensor(PerTensorCache(rng_, {pages, page, d_qk}, scale), v1::DTYPE_U8);
    r.set_kv_scale(scale);
    r.clear_kv_cache_layout();
    const std::string fp8_unspecified = RunOk<v1::MlaDecodeResponse>(OpId::kMlaDecode, r, "out");
    const v1::CacheLayout fp8_right =
        d_qk == 576 ? v1::CACHE_LAYOUT_FP8_576_PER_TENSOR : v1::CACHE_LAYOUT_FP8_512_PER_TENSOR;
    r.set_kv_cache_layout(fp8_right);
    const std::string fp8_named = RunOk<v1::MlaDecodeResponse>(OpId::kMlaDecode, r, "out");
    ASSERT_FALSE(fp8_unspecified.empty());
    EXPECT_EQ(fp8_named, fp8_unspecified);
    r.set_kv_cache_layout(right);
    ExpectRefused<v1::MlaDecodeResponse>(
        OpId::kMlaDecode, r, "kv_cache_layout",
        {v1::CacheLayout_Name(right), "kv_cache is u8 with last dim " + std::to_string(d_qk),
         std::string("the shape of ") + v1::CacheLayout_Name(fp8_right)});
    r.clear_kv_cache_layout();
    r.set_kv_scale(0);
    ExpectRefused<v1::MlaDecodeResponse>(OpId::kMlaDecode, r, "kv_scale", {"missing"});
    r.set_kv_scale(-1);
    ExpectRefused<v1::MlaDecodeResponse>(OpId::kMlaDecode, r, "kv_scale", {"want finite and > 0"});
  }
}

TEST_F(LayoutsTest, IndexerLogitsPaged) {
  const int64_t batch = 2, next_n = 1, heads = 4, dim = 16, block = 4, blocks = 4;
  const int64_t block_bytes = block * (dim + 4);
  HostTensor cache = HostTensor::Dense(DType::kU8, {blocks, block_bytes});
  std::normal_distribution<float> key(0.0f, 1.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* row = cache.data<uint8_t>() + b * block_bytes;
    for (int64_t i = 0; i < block * dim; ++i) row[i] = kernels::FloatToFp8E4M3(key(rng_));
    for (int64_t t = 0; t < block; ++t) {
      const float s = 0.1f + 0.01f * static_cast<float>(t);
      std::memcpy(row + block * dim + 4 * t, &s, 4);
    }
  }
  HostTensor weights = HostTensor::Dense(DType::kF32, {batch * next_n, heads});
  attnd::testing::FillNormal(weights, rng_, 1.0);
  v1::IndexerLogitsPagedRequest r;
  *r.mutable_q() = InlineTensor(Fp8(rng_, {batch, next_n, heads, dim}), v1::DTYPE_FP8_E4M3);
  *r.mutable_kv_cache() = InlineTensor(cache, v1::DTYPE_U8);
  *r.mutable_block_table() = InlineTensor(I32({batch, 2}, {3, 1, 0, 2}), v1::DTYPE_I32);
  *r.mutable_context_lens() = InlineTensor(I32({batch}, {7, 5}), v1::DTYPE_I32);
  *r.mutable_weights() = InlineTensor(weights, v1::DTYPE_F32);
  r.set_block_size(block);
  const std::string unspecified =
      RunOk<v1::IndexerLogitsPagedResponse>(OpId::kIndexerLogitsPaged, r, "logits");
  r.set_kv_cache_layout(v1::CACHE_LAYOUT_INDEXER_FP8_BLOCKS);
  const std::string named =
      RunOk<v1::IndexerLogitsPagedResponse>(OpId::kIndexerLogitsPaged, r, "logits");
  ASSERT_FALSE(unspecified.empty());
  EXPECT_EQ(named, unspecified);
  r.set_kv_cache_layout(v1::CACHE_LAYOUT_FLASHMLA_FP8_656);  // the MLA cache, not the indexer's
  ExpectRefused<v1::IndexerLogitsPagedResponse>(
      OpId::kIndexerLogitsPaged, r, "kv_cache_layout",
      {"CACHE_LAYOUT_FLASHMLA_FP8_656", "not a layout kv_cache may have",
       "CACHE_LAYOUT_INDEXER_FP8_BLOCKS"});
  r.set_kv_cache_layout(static_cast<v1::CacheLayout>(99));
  ExpectRefused<v1::IndexerLogitsPagedResponse>(OpId::kIndexerLogitsPaged, r, "kv_cache_layout",
                                                {"is 99", "not a CacheLayout"});
  // A named layout whose dtype the cache contradicts: the f32 view of the same bytes.
  r.set_kv_cache_layout(v1::CACHE_LAYOUT_INDEXER_FP8_BLOCKS);
  r.mutable_kv_cache()->set_dtype(v1::DTYPE_F32);
  r.mutable_kv_cache()->set_shape(1, block_bytes / 4);
  ExpectRefused<v1::IndexerLogitsPagedResponse>(
      OpId::kIndexerLogitsPaged, r, "kv_cache_layout",
      {"CACHE_LAYOUT_INDEXER_FP8_BLOCKS (u8)", "kv_cache is f32"});
}

// AITER's shuffled indexer cache (16-token × 16-byte tiles) must be named: the same keys laid out
// shuffled and named give the blocks layout's logits bit for bit; a block size that is not a
// multiple of 16 is refused naming block_size.
TEST_F(LayoutsTest, IndexerLogitsPagedAiterShuffle) {
  const int64_t batch = 2, heads = 4, dim = 32, block = 16, blocks = 3;
  const int64_t block_bytes = block * (dim + 4);
  HostTensor cache = HostTensor::Dense(DType::kU8, {blocks, block_bytes});
  HostTensor shuffled = HostTensor::Dense(DType::kU8, {blocks, block_bytes});
  std::normal_distribution<float> key(0.0f, 1.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* row = cache.data<uint8_t>() + b * block_bytes;
    uint8_t* tiles = shuffled.data<uint8_t>() + b * block_bytes;
    for (int64_t t = 0; t < block; ++t) {
      for (int64_t d = 0; d < dim; ++d) {
        row[t * dim + d] = kernels::FloatToFp8E4M3(key(rng_));
        tiles[(t / 16) * 16 * dim + (d / 16) * 256 + (t % 16) * 16 + d % 16] = row[t * dim + d];
      }
      const float s = 0.1f + 0.01f * static_cast<float>(t);
      std::memcpy(row + block * dim + 4 * t, &s, 4);
      std::memcpy(tiles + block * dim + 4 * t, &s, 4);
    }
  }
  HostTensor weights = HostTensor::Dense(DType::kF32, {batch, heads});
  attnd::testing::FillNormal(weights, rng_, 1.0);
  v1::IndexerLogitsPagedRequest r;
  *r.mutable_q() = InlineTensor(Fp8(rng_, {batch, 1, heads, dim}), v1::DTYPE_FP8_E4M3);
  *r.mutable_kv_cache() = InlineTensor(cache, v1::DTYPE_U8);
  *r.mutable_block_table() = InlineTensor(I32({batch, 2}, {2, 0, 1, 2}), v1::DTYPE_I32);
  *r.mutable_context_lens() = InlineTensor(I32({batch}, {29, 17}), v1::DTYPE_I32);
  *r.mutable_weights() = InlineTensor(weights, v1::DTYPE_F32);
  r.set_block_size(block);
  const std::string blocks_logits =
      RunOk<v1::IndexerLogitsPagedResponse>(OpId::kIndexerLogitsPaged, r, "logits");
  *r.mutable_kv_cache() = InlineTensor(shuffled, v1::DTYPE_U8);
  r.set_kv_cache_layout(v1::CACHE_LAYOUT_INDEXER_AITER_SHUFFLE_16);
  const std::string shuffle_logits =
      RunOk<v1::IndexerLogitsPagedResponse>(OpId::kIndexerLogitsPaged, r, "logits");
  ASSERT_FALSE(blocks_logits.empty());
  EXPECT_EQ(shuffle_logits, blocks_logits);
  r.set_kv_cache_layout(v1::CACHE_LAYOUT_UNSPECIFIED);  // read as the blocks layout: other logits
  EXPECT_NE(RunOk<v1::IndexerLogitsPagedResponse>(OpId::kIndexerLogitsPaged, r, "logits"),
            blocks_logits);
  r.set_kv_cache_layout(v1::CACHE_LAYOUT_INDEXER_AITER_SHUFFLE_16);
  r.set_block_size(8);
  *r.mutable_kv_cache() =
      InlineTensor(HostTensor::Dense(DType::kU8, {blocks, 8 * (dim + 4)}), v1::DTYPE_U8);
  ExpectRefused<v1::IndexerLogitsPagedResponse>(
      OpId::kIndexerLogitsPaged, r, "block_size",
      {"is 8", "multiple of 16", "CACHE_LAYOUT_INDEXER_AITER_SHUFFLE_16"});
}

TEST_F(LayoutsTest, DsaAttention) {
  const int64_t t = 3, n = 12, hi = 4, di = 16, h = 8;
  HostTensor scale = HostTensor::Dense(DType::kF32, {n});
  attnd::testing::FillUniform(scale, rng_, 0.5, 1.5);
  HostTensor weights = HostTensor::Dense(DType::kF32, {t, hi});
  attnd::testing::FillNormal(weights, rng_, 1.0);
  v1::DsaAttentionRequest r;
  *r.mutable_index_q() = InlineTensor(Fp8(rng_, {t, hi, di}), v1::DTYPE_FP8_E4M3);
  *r.mutable_index_k() = InlineTensor(Fp8(rng_, {n, di}), v1::DTYPE_FP8_E4M3);
  *r.mutable_index_k_scale() = InlineTensor(scale, v1::DTYPE_F32);
  *r.mutable_index_weights() = InlineTensor(weights, v1::DTYPE_F32);
  *r.mutable_ks() = InlineTensor(I32({t}, {0, 0, 2}), v1::DTYPE_I32);
  *r.mutable_ke() = InlineTensor(I32({t}, {10, 11, 12}), v1::DTYPE_I32);
  r.set_topk(4);
  *r.mutable_q() = InlineTensor(Bf16(rng_, {t, h, 576}), v1::DTYPE_BF16);
  r.set_sm_scale(0.04f);
  for (const bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "bf16");
    r.clear_kv_layout();
    *r.mutable_kv() = fp8 ? InlineTensor(Fp8Cache(rng_, n), v1::DTYPE_U8)
                          : InlineTensor(Bf16(rng_, {n, 576}), v1::DTYPE_BF16);
    const std::string unspecified = RunOk<v1::DsaAttentionResponse>(OpId::kDsaAttention, r, "out");
    r.set_kv_layout(fp8 ? v1::CACHE_LAYOUT_FLASHMLA_FP8_656 : v1::CACHE_LAYOUT_BF16_576);
    const std::string named = RunOk<v1::DsaAttentionResponse>(OpId::kDsaAttention, r, "out");
    ASSERT_FALSE(unspecified.empty());
    EXPECT_EQ(named, unspecified);
    const v1::CacheLayout wrong =
        fp8 ? v1::CACHE_LAYOUT_BF16_576 : v1::CACHE_LAYOUT_FLASHMLA_FP8_656;
    r.set_kv_layout(wrong);
    ExpectRefused<v1::DsaAttentionResponse>(
        OpId::kDsaAttention, r, "kv_layout",
        {v1::CacheLayout_Name(wrong), fp8 ? "kv is u8 with last dim 656" : "kv is bf16"});
  }
  r.set_kv_layout(static_cast<v1::CacheLayout>(42));
  ExpectRefused<v1::DsaAttentionResponse>(OpId::kDsaAttention, r, "kv_layout",
                                          {"is 42", "not a CacheLayout"});
}

// The required rule, which no op reaches yet (every pair of today's layouts differs in dtype or
// width): a table with two u8 layouts of any width, one inferred and one that must be named, and
// one with two inferred layouts of the same shape.
TEST(CheckCacheLayout, RequiredWhereDtypeAndShapeDoNotDecide) {
  uint8_t bytes[2 * 656] = {};
  const kernels::Tensor kv = kernels::MakeTensor(bytes, DType::kU8, {2, 656});
  using kernels::CacheLayout;
  using kernels::CacheLayoutUse;
  const CacheLayoutUse old_default[] = {{CacheLayout::kIndexerFp8Blocks, true},
                                        {CacheLayout::kFlashMlaFp8_656, false}};
  // Unspecified: the inferred one; named: either.
  EXPECT_TRUE(
      kernels::CheckCacheLayout("x_layout", "x", CacheLayout::kUnspecified, kv, old_default).ok());
  EXPECT_TRUE(
      kernels::CheckCacheLayout("x_layout", "x", CacheLayout::kFlashMlaFp8_656, kv, old_default)
          .ok());
  // Only a layout that must be named fits: unspecified is refused.
  const CacheLayoutUse named_only[] = {{CacheLayout::kFlashMlaFp8_656, false}};
  absl::Status s =
      kernels::CheckCacheLayout("x_layout", "x", CacheLayout::kUnspecified, kv, named_only);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kernels::BadField(s).value_or(""), "x_layout");
  EXPECT_TRUE(absl::StrContains(s.message(), "x_layout: required")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "CACHE_LAYOUT_FLASHMLA_FP8_656")) << s;
  // Two inferred layouts fit: unspecified is refused naming both.
  const CacheLayoutUse ambiguous[] = {{CacheLayout::kIndexerFp8Blocks, true},
                                      {CacheLayout::kFlashMlaFp8_656, true}};
  s = kernels::CheckCacheLayout("x_layout", "x", CacheLayout::kUnspecified, kv, ambiguous);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(
      s.message(), "CACHE_LAYOUT_INDEXER_FP8_BLOCKS and CACHE_LAYOUT_FLASHMLA_FP8_656"))
      << s;
  // An unspecified layout that fits nothing is left to the op's own shape checks.
  const kernels::Tensor odd = kernels::MakeTensor(bytes, DType::kBF16, {2, 100});
  EXPECT_TRUE(
      kernels::CheckCacheLayout("x_layout", "x", CacheLayout::kUnspecified, odd, ambiguous).ok());
}

// The C++ client sends the params' layout in the request's field, and leaves it unset (nothing
// on the wire) when unspecified; likewise the per-tensor FP8 cache's kv_scale.
TEST(ClientOpTraits, SendCacheLayouts) {
  using kernels::CacheLayout;
  {
    kernels::sparse_mla::Params p;
    v1::SparseMlaRequest r;
    client::OpTraits<kernels::sparse_mla::Params>::SetScalars(p, &r);
    EXPECT_EQ(r.kv_layout(), v1::CACHE_LAYOUT_UNSPECIFIED);
    EXPECT_FALSE(r.GetReflection()->HasField(r, r.GetDescriptor()->FindFieldByName("kv_layout")));
    p.kv_layout = CacheLayout::kFlashMlaFp8_656;
    client::OpTraits<kernels::sparse_mla::Params>::SetScalars(p, &r);
    EXPECT_EQ(r.kv_layout(), v1::CACHE_LAYOUT_FLASHMLA_FP8_656);
  }
  {
    kernels::dsa::Params p;
    p.kv_layout = CacheLayout::kBf16_512;
    v1::DsaAttentionRequest r;
    client::OpTraits<kernels::dsa::Params>::SetScalars(p, &r);
    EXPECT_EQ(r.kv_layout(), v1::CACHE_LAYOUT_BF16_512);
  }
  {
    kernels::mla_decode::Params p;
    p.kv_cache_layout = CacheLayout::kBf16_576;
    v1::MlaDecodeRequest r;
    client::OpTraits<kernels::mla_decode::Params>::SetScalars(p, &r);
    EXPECT_EQ(r.kv_cache_layout(), v1::CACHE_LAYOUT_BF16_576);
    EXPECT_EQ(r.kv_scale(), 0.0f);
    p.kv_cache_layout = CacheLayout::kFp8_512PerTensor;
    p.kv_scale = 0.375f;
    client::OpTraits<kernels::mla_decode::Params>::SetScalars(p, &r);
    EXPECT_EQ(r.kv_cache_layout(), v1::CACHE_LAYOUT_FP8_512_PER_TENSOR);
    EXPECT_EQ(r.kv_scale(), 0.375f);
  }
  {
    kernels::sparse_mla::Params p;
    p.kv_layout = CacheLayout::kFp8_576PerTensor;
    p.kv_scale = 1.5f;
    v1::SparseMlaRequest r;
    client::OpTraits<kernels::sparse_mla::Params>::SetScalars(p, &r);
    EXPECT_EQ(r.kv_layout(), v1::CACHE_LAYOUT_FP8_576_PER_TENSOR);
    EXPECT_EQ(r.kv_scale(), 1.5f);
  }
  {
    kernels::indexer_logits_paged::Params p;
    p.kv_cache_layout = CacheLayout::kIndexerFp8Blocks;
    v1::IndexerLogitsPagedRequest r;
    client::OpTraits<kernels::indexer_logits_paged::Params>::SetScalars(p, &r);
    EXPECT_EQ(r.kv_cache_layout(), v1::CACHE_LAYOUT_INDEXER_FP8_BLOCKS);
  }
}

}  // namespace
}  // namespace attnd::server::ops

namespace attnd::server::testing {
namespace {

// GetInfo lists, per op, the layout field, its tensor, the layouts accepted and those an
// unspecified layout is inferred as; ops without a cache tensor list none.
TEST_F(DaemonTest, GetInfoListsCacheLayouts) {
  grpc::ClientContext ctx;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub_->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok());
  struct Want {
    std::string field, tensor;
    std::vector<int> accepted;
    std::vector<int> inferred = {};  // empty: every accepted layout is inferred
  };
  // sparse_mla's and dsa_attention's kv (both take kv_scale for the per-tensor FP8 caches).
  const std::vector<int> sparse = {
      v1::CACHE_LAYOUT_BF16_576, v1::CACHE_LAYOUT_BF16_512, v1::CACHE_LAYOUT_FLASHMLA_FP8_656,
      v1::CACHE_LAYOUT_FP8_576_PER_TENSOR, v1::CACHE_LAYOUT_FP8_512_PER_TENSOR};
  const std::vector<int> indexer = {v1::CACHE_LAYOUT_INDEXER_FP8_BLOCKS,
                                    v1::CACHE_LAYOUT_INDEXER_AITER_SHUFFLE_16};
  const std::vector<int> indexer_inferred = {v1::CACHE_LAYOUT_INDEXER_FP8_BLOCKS};
  // Per op, its layout fields in order (dsa_attention: kv, and index_cache of the paged form).
  const std::map<std::string, std::vector<Want>> want = {
      {"sparse_mla", {{"kv_layout", "kv", sparse}}},
      {"dsa_attention",
       {{"kv_layout", "kv", sparse},
        {"index_cache_layout", "index_cache", indexer, indexer_inferred}}},
      {"mla_decode",
       {{"kv_cache_layout",
         "kv_cache",
         {v1::CACHE_LAYOUT_BF16_576, v1::CACHE_LAYOUT_BF16_512, v1::CACHE_LAYOUT_FP8_576_PER_TENSOR,
          v1::CACHE_LAYOUT_FP8_512_PER_TENSOR}}}},
      // The shuffled indexer layout must be named.
      {"indexer_logits_paged", {{"kv_cache_layout", "kv_cache", indexer, indexer_inferred}}},
  };
  int seen = 0;
  for (const v1::OpInfo& op : info.ops()) {
    SCOPED_TRACE(op.name());
    auto it = want.find(op.name());
    if (it == want.end()) {
      EXPECT_EQ(op.cache_layouts_size(), 0);
      continue;
    }
    ++seen;
    ASSERT_EQ(op.cache_layouts_size(), static_cast<int>(it->second.size()));
    for (int i = 0; i < op.cache_layouts_size(); ++i) {
      const v1::CacheLayoutInfo& l = op.cache_layouts(i);
      const Want& w = it->second[static_cast<size_t>(i)];
      EXPECT_EQ(l.field(), w.field);
      EXPECT_EQ(l.tensor(), w.tensor);
      EXPECT_EQ(std::vector<int>(l.accepted().begin(), l.accepted().end()), w.accepted);
      // Layouts told apart by dtype and width are inferred; one sharing them must be named.
      const std::vector<int>& inferred = w.inferred.empty() ? w.accepted : w.inferred;
      EXPECT_EQ(std::vector<int>(l.inferred().begin(), l.inferred().end()), inferred);
    }
  }
  EXPECT_EQ(seen, 4);
}

}  // namespace
}  // namespace attnd::server::testing
