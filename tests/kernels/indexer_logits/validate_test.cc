// Validate rejects every malformed indexer_logits call with INVALID_ARGUMENT naming the tensor:
// one row per mutation of a valid call.
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "tests/harness/host_tensor.h"

namespace attnd::kernels::indexer_logits {
namespace {

using testing::HostTensor;

constexpr int64_t kM = 5, kN = 40, kH = 32, kD = 64;

// q with other heads / head dim and dense strides, so only the size rule can object.
void Reshape(Tensor& q, int64_t heads, int64_t dim) {
  q.shape[1] = heads;
  q.shape[2] = dim;
  q.strides[1] = dim;
  q.strides[0] = heads * dim;
}

struct Mutation {
  const char* name;
  std::function<void(Params&)> apply;
  const char* want_prefix;  // the message starts with the tensor's name and a colon
};

std::vector<Mutation> Mutations() {
  return {
      {"q_missing", [](Params& p) { p.q = Tensor(); }, "q:"},
      {"q_dtype", [](Params& p) { p.q.dtype = DType::kBF16; }, "q:"},
      {"q_rank", [](Params& p) { p.q.rank = 2; }, "q:"},
      {"q_negative_rows", [](Params& p) { p.q.shape[0] = -1; }, "q:"},
      {"q_zero_heads", [](Params& p) { p.q.shape[1] = 0; }, "q: dim 1"},
      {"q_too_many_heads", [](Params& p) { Reshape(p.q, kMaxHeads + 1, kD); }, "q: dim 1"},
      {"q_dim_not_multiple_of_16", [](Params& p) { Reshape(p.q, kH, 72); }, "q: dim 2"},
      {"q_dim_zero", [](Params& p) { p.q.shape[2] = 0; }, "q: dim 2"},
      {"q_dim_too_large", [](Params& p) { Reshape(p.q, kH, kMaxHeadDim + 16); }, "q: dim 2"},
      {"q_last_dim_strided", [](Params& p) { p.q.strides[2] = 2; }, "q:"},
      {"q_head_stride_overlaps", [](Params& p) { p.q.strides[1] = kD - 1; }, "q:"},
      {"q_negative_stride", [](Params& p) { p.q.strides[0] = -kH * kD; }, "q:"},
      {"q_null", [](Params& p) { p.q.data = nullptr; }, "q:"},
      {"k_missing", [](Params& p) { p.k = Tensor(); }, "k:"},
      {"k_dtype", [](Params& p) { p.k.dtype = DType::kU8; }, "k:"},
      {"k_rank", [](Params& p) { p.k.rank = 3; }, "k:"},
      {"k_dim_mismatch", [](Params& p) { p.k.shape[1] = kD + 16; }, "k:"},
      {"k_negative_rows", [](Params& p) { p.k.shape[0] = -3; }, "k:"},
      {"k_row_stride_short", [](Params& p) { p.k.strides[0] = kD - 1; }, "k:"},
      {"k_stride_overflows", [](Params& p) { p.k.strides[0] = INT64_MAX / 2; }, "k:"},
      {"k_scale_missing", [](Params& p) { p.k_scale = Tensor(); }, "k_scale:"},
      {"k_scale_dtype", [](Params& p) { p.k_scale.dtype = DType::kBF16; }, "k_scale:"},
      {"k_scale_length", [](Params& p) { p.k_scale.shape[0] = kN - 1; }, "k_scale:"},
      {"k_scale_strided", [](Params& p) { p.k_scale.strides[0] = 2; }, "k_scale:"},
      {"weights_missing", [](Params& p) { p.weights = Tensor(); }, "weights:"},
      {"weights_dtype", [](Params& p) { p.weights.dtype = DType::kBF16; }, "weights:"},
      {"weights_rows", [](Params& p) { p.weights.shape[0] = kM + 1; }, "weights:"},
      {"weights_heads", [](Params& p) { p.weights.shape[1] = kH / 2; }, "weights:"},
      {"weights_row_stride_short", [](Params& p) { p.weights.strides[0] = kH - 1; }, "weights:"},
      {"ks_missing", [](Params& p) { p.ks = Tensor(); }, "ks:"},
      {"ks_dtype", [](Params& p) { p.ks.dtype = DType::kF32; }, "ks:"},
      {"ks_length", [](Params& p) { p.ks.shape[0] = kM - 1; }, "ks:"},
      {"ks_rank",
       [](Params& p) {
         p.ks.rank = 2;
         p.ks.shape[1] = 1;
       },
       "ks:"},
      {"ke_missing", [](Params& p) { p.ke = Tensor(); }, "ke:"},
      {"ke_dtype", [](Params& p) { p.ke.dtype = DType::kU8; }, "ke:"},
      {"ke_length", [](Params& p) { p.ke.shape[0] = kM + 1; }, "ke:"},
      {"ke_strided", [](Params& p) { p.ke.strides[0] = 3; }, "ke:"},
      {"logits_missing", [](Params& p) { p.logits = Tensor(); }, "logits:"},
      {"logits_dtype", [](Params& p) { p.logits.dtype = DType::kBF16; }, "logits:"},
      {"logits_rows", [](Params& p) { p.logits.shape[0] = kM - 1; }, "logits:"},
      {"logits_cols", [](Params& p) { p.logits.shape[1] = kN + 1; }, "logits:"},
      {"logits_ld_short", [](Params& p) { p.logits.strides[0] = kN - 1; }, "logits:"},
      {"logits_last_dim_strided", [](Params& p) { p.logits.strides[1] = 2; }, "logits:"},
      {"logits_null", [](Params& p) { p.logits.data = nullptr; }, "logits:"},
      {"precision_out_of_enum", [](Params& p) { p.precision = static_cast<Precision>(2); },
       "precision:"},
  };
}

TEST(IndexerLogitsValidate, RejectsEachMalformedInput) {
  HostTensor q = HostTensor::Dense(DType::kFp8E4M3, {kM, kH, kD});
  HostTensor k = HostTensor::RowStrided(DType::kFp8E4M3, {kN, kD}, kD + 16);
  HostTensor k_scale = HostTensor::Dense(DType::kF32, {kN});
  HostTensor weights = HostTensor::Dense(DType::kF32, {kM, kH});
  HostTensor ks = HostTensor::Dense(DType::kI32, {kM});
  HostTensor ke = HostTensor::Dense(DType::kI32, {kM});
  HostTensor logits = HostTensor::RowStrided(DType::kF32, {kM, kN}, kN + 8);
  Params valid;
  valid.q = q.tensor();
  valid.k = k.tensor();
  valid.k_scale = k_scale.tensor();
  valid.weights = weights.tensor();
  valid.ks = ks.tensor();
  valid.ke = ke.tensor();
  valid.logits = logits.tensor();
  ASSERT_TRUE(Validate(valid).ok()) << Validate(valid);
  EXPECT_EQ(valid.precision, Precision::kHigh);  // DESIGN.md §2's exact contract by default
  Params fast = valid;
  fast.precision = Precision::kFast;
  EXPECT_TRUE(Validate(fast).ok()) << Validate(fast);
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

// Sizes zero are valid (nothing to do), as are H 1 and 128 and D 16 and 1024.
TEST(IndexerLogitsValidate, AcceptsEdgeSizes) {
  for (const auto& [m, n, h, d] : std::vector<std::array<int64_t, 4>>{
           {0, 10, 32, 64}, {4, 0, 32, 64}, {1, 1, 1, 16}, {2, 3, kMaxHeads, kMaxHeadDim}}) {
    HostTensor q = HostTensor::Dense(DType::kFp8E4M3, {m, h, d});
    HostTensor k = HostTensor::Dense(DType::kFp8E4M3, {n, d});
    HostTensor k_scale = HostTensor::Dense(DType::kF32, {n});
    HostTensor weights = HostTensor::Dense(DType::kF32, {m, h});
    HostTensor ks = HostTensor::Dense(DType::kI32, {m});
    HostTensor ke = HostTensor::Dense(DType::kI32, {m});
    HostTensor logits = HostTensor::Dense(DType::kF32, {m, n});
    Params p;
    p.q = q.tensor();
    p.k = k.tensor();
    p.k_scale = k_scale.tensor();
    p.weights = weights.tensor();
    p.ks = ks.tensor();
    p.ke = ke.tensor();
    p.logits = logits.tensor();
    EXPECT_TRUE(Validate(p).ok()) << m << "x" << n << " H" << h << " D" << d << ": " << Validate(p);
  }
}

}  // namespace
}  // namespace attnd::kernels::indexer_logits
