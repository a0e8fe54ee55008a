#include "tests/kernels/dsa/dsa_case.h"

#include <algorithm>
#include <cmath>

#include "kernels/sparse_mla/params.h"
#include "tests/harness/fp8_kv.h"

namespace attnd::testing {

using kernels::DType;

DsaCase::DsaCase(const DsaSpec& spec, std::mt19937_64& rng) : spec_(spec) {
  const int64_t t = spec.t, n = spec.prefix + spec.t;
  index_q_ = HostTensor::Dense(DType::kFp8E4M3, {t, spec.index_heads, spec.index_dim});
  index_k_ = HostTensor::Dense(DType::kFp8E4M3, {n, spec.index_dim});
  index_k_scale_ = HostTensor::Dense(DType::kF32, {n});
  index_weights_ = HostTensor::Dense(DType::kF32, {t, spec.index_heads});
  FillNormal(index_q_, rng, 1.0);
  FillNormal(index_k_, rng, 1.0);
  FillUniform(index_k_scale_, rng, 0.01, 0.1);
  FillNormal(index_weights_, rng, 1.0);
  ks_ = HostTensor::Dense(DType::kI32, {t});
  ke_ = HostTensor::Dense(DType::kI32, {t});
  for (int64_t i = 0; i < t; ++i) SetWindow(i, 0, static_cast<int32_t>(spec.prefix + i + 1));

  q_ = HostTensor::RowStrided(DType::kBF16, {t, spec.heads, spec.d_qk},
                              spec.heads * spec.d_qk + spec.pad);
  FillNormal(q_, rng, 1.0);
  if (spec.per_tensor_kv) {
    // The frontend's writer: each bf16 row quantised with the one scale; row padding NaN codes.
    const int64_t row = spec.d_qk + spec.pad;
    kv_ = HostTensor::RowStrided(DType::kU8, {n, spec.d_qk}, row);
    std::fill(kv_.raw(), kv_.raw() + kv_.bytes(), uint8_t{0x7f});
    std::vector<kernels::bf16_t> source(static_cast<size_t>(spec.d_qk));
    for (int64_t r = 0; r < n; ++r) {
      FillMlaSourceRow(source.data(), spec.d_qk, spec.kv_scale, rng);
      QuantizeMlaRowPerTensor(source.data(), spec.d_qk, spec.kv_scale,
                              kv_.data<uint8_t>() + r * row);
    }
  } else if (spec.fp8_kv) {
    const int64_t row = kernels::sparse_mla::kFp8RowBytes + 4 * spec.pad;  // stride % 4 == 0
    kv_ = HostTensor::RowStrided(DType::kU8, {n, kernels::sparse_mla::kFp8RowBytes}, row);
    for (int64_t r = 0; r < n; ++r) {
      FillFp8Row(kv_.data<uint8_t>() + r * row, rng, /*pow2_scales=*/true);
    }
  } else {
    kv_ = HostTensor::RowStrided(DType::kBF16, {n, spec.d_qk}, spec.d_qk + spec.pad);
    FillNormal(kv_, rng, 1.0);
  }
  if (spec.with_logits) logits_ = HostTensor::RowStrided(DType::kF32, {t, n}, n + spec.pad);
  out_ = HostTensor::Dense(DType::kBF16, {t, spec.heads, kernels::sparse_mla::kDimV});
  if (spec.with_lse) lse_ = HostTensor::Dense(DType::kF32, {t, spec.heads});
  if (spec.with_indices) indices_ = HostTensor::Dense(DType::kI32, {t, spec.topk});
}

void DsaCase::SetWindow(int64_t t, int32_t ks, int32_t ke) {
  ks_.data<int32_t>()[t] = ks;
  ke_.data<int32_t>()[t] = ke;
}

kernels::dsa::Params DsaCase::MakeParams() {
  kernels::dsa::Params p;
  p.index_q = index_q_.tensor();
  p.index_k = index_k_.tensor();
  p.index_k_scale = index_k_scale_.tensor();
  p.index_weights = index_weights_.tensor();
  p.ks = ks_.tensor();
  p.ke = ke_.tensor();
  p.topk = spec_.topk;
  p.q = q_.tensor();
  p.kv = kv_.tensor();
  if (spec_.per_tensor_kv) {
    p.kv_scale = spec_.kv_scale;
    p.kv_layout = spec_.d_qk == 576 ? kernels::CacheLayout::kFp8_576PerTensor
                                    : kernels::CacheLayout::kFp8_512PerTensor;
  }
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec_.d_qk)));
  if (spec_.with_logits) p.logits = logits_.tensor();
  p.out = out_.tensor();
  if (spec_.with_lse) p.lse = lse_.tensor();
  if (spec_.with_indices) p.indices = indices_.tensor();
  return p;
}

std::vector<HostTensor*> DsaCase::Outputs() {
  std::vector<HostTensor*> outs = {&out_};
  if (spec_.with_lse) outs.push_back(&lse_);
  if (spec_.with_indices) outs.push_back(&indices_);
  if (spec_.with_logits) outs.push_back(&logits_);
  return outs;
}

}  // namespace attnd::testing
