// Validate rejects every malformed indexer_logits_paged call with INVALID_ARGUMENT naming the
// tensor or scalar: one row per mutation of a valid call.
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/indexer_logits/params.h"
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"
#include "tests/harness/host_tensor.h"

namespace attnd::kernels::indexer_logits_paged {
namespace {

using testing::HostTensor;

constexpr int64_t kB = 3, kNextN = 2, kH = 32, kD = 128, kBlock = 64, kMaxBlocks = 5;
constexpr int64_t kNumBlocks = 9, kN = 300, kBlockBytes = kBlock * (kD + 4);

// q with other heads / head dim and dense strides, so only the size rule can object.
void Reshape(Tensor& q, int64_t heads, int64_t dim) {
  q.shape[2] = heads;
  q.shape[3] = dim;
  q.strides[2] = dim;
  q.strides[1] = heads * dim;
  q.strides[0] = kNextN * heads * dim;
}

struct Mutation {
  const char* name;
  std::function<void(Params&)> apply;
  const char* want_prefix;  // the message starts with the tensor's (or scalar's) name
};

std::vector<Mutation> Mutations() {
  return {
      {"q_missing", [](Params& p) { p.q = Tensor(); }, "q:"},
      {"q_dtype", [](Params& p) { p.q.dtype = DType::kU8; }, "q:"},
      {"q_rank", [](Params& p) { p.q.rank = 3; }, "q:"},
      {"q_negative_batch", [](Params& p) { p.q.shape[0] = -1; }, "q:"},
      {"q_zero_next_n", [](Params& p) { p.q.shape[1] = 0; }, "q: dim 1"},
      {"q_zero_heads", [](Params& p) { Reshape(p.q, 0, kD); }, "q: dim 2"},
      {"q_too_many_heads", [](Params& p) { Reshape(p.q, indexer_logits::kMaxHeads + 1, kD); },
       "q: dim 2"},
      {"q_dim_not_multiple_of_16", [](Params& p) { Reshape(p.q, kH, 120); }, "q: dim 3"},
      {"q_dim_too_large", [](Params& p) { Reshape(p.q, kH, indexer_logits::kMaxHeadDim + 16); },
       "q: dim 3"},
      {"q_last_dim_strided", [](Params& p) { p.q.strides[3] = 2; }, "q:"},
      {"q_null", [](Params& p) { p.q.data = nullptr; }, "q:"},
      {"block_size_zero", [](Params& p) { p.block_size = 0; }, "block_size:"},
      {"block_size_negative", [](Params& p) { p.block_size = -64; }, "block_size:"},
      {"block_size_overflows", [](Params& p) { p.block_size = INT64_MAX / 8; }, "block_size:"},
      {"kv_cache_missing", [](Params& p) { p.kv_cache = Tensor(); }, "kv_cache:"},
      {"kv_cache_dtype", [](Params& p) { p.kv_cache.dtype = DType::kFp8E4M3; }, "kv_cache:"},
      {"kv_cache_rank", [](Params& p) { p.kv_cache.rank = 3; }, "kv_cache:"},
      {"kv_cache_block_bytes", [](Params& p) { p.kv_cache.shape[1] = kBlock * kD; }, "kv_cache:"},
      {"kv_cache_block_size_mismatch", [](Params& p) { p.block_size = 32; }, "kv_cache:"},
      {"kv_cache_negative_blocks", [](Params& p) { p.kv_cache.shape[0] = -2; }, "kv_cache:"},
      {"kv_cache_row_stride_short", [](Params& p) { p.kv_cache.strides[0] = kBlockBytes - 1; },
       "kv_cache:"},
      {"kv_cache_null", [](Params& p) { p.kv_cache.data = nullptr; }, "kv_cache:"},
      // AITER's shuffled layout (16-token key tiles): block_size a multiple of 16, the same
      // width as the blocks layout, u8; an unknown or foreign layout names the layout field.
      {"shuffle_block_size_8",
       [](Params& p) {
         p.kv_cache_layout = CacheLayout::kIndexerAiterShuffle16;
         p.block_size = 8;
         p.kv_cache.shape[1] = 8 * (kD + 4);
       },
       "block_size: is 8, want a multiple of 16 with kv_cache_layout "
       "CACHE_LAYOUT_INDEXER_AITER_SHUFFLE_16"},
      {"shuffle_block_size_1",
       [](Params& p) {
         p.kv_cache_layout = CacheLayout::kIndexerAiterShuffle16;
         p.block_size = 1;
         p.kv_cache.shape[1] = kD + 4;
       },
       "block_size: is 1, want a multiple of 16"},
      {"shuffle_block_size_mismatch",
       [](Params& p) {
         p.kv_cache_layout = CacheLayout::kIndexerAiterShuffle16;
         p.block_size = 32;
       },
       "kv_cache: dim 1"},
      {"shuffle_block_bytes",
       [](Params& p) {
         p.kv_cache_layout = CacheLayout::kIndexerAiterShuffle16;
         p.kv_cache.shape[1] = kBlock * kD;  // keys without their scales
       },
       "kv_cache: dim 1"},
      {"shuffle_dtype",
       [](Params& p) {
         p.kv_cache_layout = CacheLayout::kIndexerAiterShuffle16;
         p.kv_cache.dtype = DType::kFp8E4M3;
       },
       "kv_cache_layout: is CACHE_LAYOUT_INDEXER_AITER_SHUFFLE_16 (u8), but kv_cache is fp8"},
      {"layout_unknown", [](Params& p) { p.kv_cache_layout = static_cast<CacheLayout>(99); },
       "kv_cache_layout: is 99, not a CacheLayout"},
      {"layout_of_mla", [](Params& p) { p.kv_cache_layout = CacheLayout::kFlashMlaFp8_656; },
       "kv_cache_layout: is CACHE_LAYOUT_FLASHMLA_FP8_656, not a layout kv_cache may have"},
      {"block_table_missing", [](Params& p) { p.block_table = Tensor(); }, "block_table:"},
      {"block_table_dtype", [](Params& p) { p.block_table.dtype = DType::kF32; }, "block_table:"},
      {"block_table_batch", [](Params& p) { p.block_table.shape[0] = kB + 1; }, "block_table:"},
      {"block_table_negative_blocks", [](Params& p) { p.block_table.shape[1] = -1; },
       "block_table:"},
      {"block_table_row_stride_short", [](Params& p) { p.block_table.strides[0] = kMaxBlocks - 1; },
       "block_table:"},
      {"context_lens_missing", [](Params& p) { p.context_lens = Tensor(); }, "context_lens:"},
      {"context_lens_dtype", [](Params& p) { p.context_lens.dtype = DType::kF32; },
       "context_lens:"},
      {"context_lens_length", [](Params& p) { p.context_lens.shape[0] = kB - 1; }, "context_lens:"},
      {"context_lens_strided", [](Params& p) { p.context_lens.strides[0] = 2; }, "context_lens:"},
      {"context_lens_rank_3",
       [](Params& p) {
         p.context_lens = MakeTensor(p.context_lens.data, DType::kI32, {kB, kNextN, 1});
       },
       "context_lens: rank is 3"},
      {"context_lens_2d_next_n",
       [](Params& p) {
         p.context_lens = MakeTensor(p.context_lens.data, DType::kI32, {kB, kNextN + 1});
       },
       "context_lens: dim 1"},
      {"context_lens_2d_batch",
       [](Params& p) {
         p.context_lens = MakeTensor(p.context_lens.data, DType::kI32, {kB - 1, kNextN});
       },
       "context_lens: dim 0"},
      {"context_lens_2d_dtype",
       [](Params& p) {
         p.context_lens = MakeTensor(p.context_lens.data, DType::kF32, {kB, kNextN});
       },
       "context_lens:"},
      {"context_lens_2d_last_dim_strided",
       [](Params& p) {
         p.context_lens = MakeTensor(p.context_lens.data, DType::kI32, {kB, kNextN});
         p.context_lens.strides[1] = 2;
         p.context_lens.strides[0] = 2 * kNextN;
       },
       "context_lens:"},
      {"context_lens_2d_row_stride_short",
       [](Params& p) {
         p.context_lens = MakeTensor(p.context_lens.data, DType::kI32, {kB, kNextN});
         p.context_lens.strides[0] = kNextN - 1;
       },
       "context_lens:"},
      {"weights_missing", [](Params& p) { p.weights = Tensor(); }, "weights:"},
      {"weights_dtype", [](Params& p) { p.weights.dtype = DType::kBF16; }, "weights:"},
      {"weights_rows", [](Params& p) { p.weights.shape[0] = kB; }, "weights:"},
      {"weights_heads", [](Params& p) { p.weights.shape[1] = kH + 1; }, "weights:"},
      {"weights_row_stride_short", [](Params& p) { p.weights.strides[0] = kH - 1; }, "weights:"},
      {"logits_missing", [](Params& p) { p.logits = Tensor(); }, "logits:"},
      {"logits_dtype", [](Params& p) { p.logits.dtype = DType::kI32; }, "logits:"},
      {"logits_rank", [](Params& p) { p.logits.rank = 1; }, "logits:"},
      {"logits_rows", [](Params& p) { p.logits.shape[0] = kB * kNextN + 1; }, "logits:"},
      {"logits_negative_cols", [](Params& p) { p.logits.shape[1] = -5; }, "logits:"},
      {"logits_ld_short", [](Params& p) { p.logits.strides[0] = kN - 1; }, "logits:"},
      {"logits_null", [](Params& p) { p.logits.data = nullptr; }, "logits:"},
  };
}

TEST(IndexerLogitsPagedValidate, RejectsEachMalformedInput) {
  HostTensor q = HostTensor::Dense(DType::kFp8E4M3, {kB, kNextN, kH, kD});
  HostTensor kv = HostTensor::RowStrided(DType::kU8, {kNumBlocks, kBlockBytes}, kBlockBytes + 64);
  HostTensor table = HostTensor::RowStrided(DType::kI32, {kB, kMaxBlocks}, kMaxBlocks + 3);
  HostTensor lens = HostTensor::Dense(DType::kI32, {kB});
  HostTensor weights = HostTensor::Dense(DType::kF32, {kB * kNextN, kH});
  HostTensor logits = HostTensor::RowStrided(DType::kF32, {kB * kNextN, kN}, kN + 4);
  Params valid;
  valid.q = q.tensor();
  valid.kv_cache = kv.tensor();
  valid.block_size = kBlock;
  valid.block_table = table.tensor();
  valid.context_lens = lens.tensor();
  valid.weights = weights.tensor();
  valid.logits = logits.tensor();
  ASSERT_TRUE(Validate(valid).ok()) << Validate(valid);
  {  // AITER's shuffled layout, named, at block sizes 64 and 16 (and the blocks layout named)
    Params shuffled = valid;
    shuffled.kv_cache_layout = CacheLayout::kIndexerAiterShuffle16;
    EXPECT_TRUE(Validate(shuffled).ok()) << Validate(shuffled);
    shuffled.block_size = 16;
    shuffled.kv_cache.shape[1] = 16 * (kD + 4);
    EXPECT_TRUE(Validate(shuffled).ok()) << Validate(shuffled);
    Params blocks = valid;
    blocks.kv_cache_layout = CacheLayout::kIndexerFp8Blocks;
    EXPECT_TRUE(Validate(blocks).ok()) << Validate(blocks);
  }
  {  // per-token lengths [B, next_n], dense or with a padded row stride, are valid too
    HostTensor token_lens = HostTensor::RowStrided(DType::kI32, {kB, kNextN}, kNextN + 5);
    Params per_token = valid;
    per_token.context_lens = token_lens.tensor();
    EXPECT_TRUE(Validate(per_token).ok()) << Validate(per_token);
  }
  for (const Mutation& mutation : Mutations()) {
    SCOPED_TRACE(mutation.name);
    Params p = valid;
    mutation.apply(p);
    const absl::Status status = Validate(p);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(absl::StartsWith(status.message(), mutation.want_prefix))
        << status.message() << " should start with " << mutation.want_prefix;
  }
}

}  // namespace
}  // namespace attnd::kernels::indexer_logits_paged
