#include "tests/kernels/sparse_mla/case.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/common/bf16.h"

namespace attnd::testing {

using kernels::DType;
using kernels::sparse_mla::Params;

std::vector<std::vector<int32_t>> RandomSlots(const SparseMlaSpec& spec, std::mt19937_64& rng) {
  const int32_t s = static_cast<int32_t>(spec.s);
  const int32_t invalid[] = {
      -1, -2, s, s + 1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  std::uniform_int_distribution<int32_t> valid(0, std::max(0, s - 1));
  std::uniform_int_distribution<int> pick(0, 5);
  std::bernoulli_distribution masked(spec.masked_fraction);
  std::vector<std::vector<int32_t>> slots(spec.t, std::vector<int32_t>(spec.k));
  for (auto& row : slots) {
    for (auto& x : row) x = (s == 0 || masked(rng)) ? invalid[pick(rng)] : valid(rng);
  }
  return slots;
}

SparseMlaCase::SparseMlaCase(const SparseMlaSpec& spec, std::mt19937_64& rng) : spec_(spec) {
  std::vector<int32_t> lengths;
  if (spec.with_topk_length) {
    std::uniform_int_distribution<int32_t> len(-2, static_cast<int32_t>(spec.k) + 2);
    for (int64_t t = 0; t < spec.t; ++t) lengths.push_back(len(rng));
  }
  Build(rng, RandomSlots(spec, rng), lengths);
}

SparseMlaCase::SparseMlaCase(const SparseMlaSpec& spec, std::mt19937_64& rng,
                             const std::vector<std::vector<int32_t>>& slots,
                             const std::vector<int32_t>& topk_length)
    : spec_(spec) {
  spec_.with_topk_length = !topk_length.empty();
  Build(rng, slots, topk_length);
}

void SparseMlaCase::Build(std::mt19937_64& rng, const std::vector<std::vector<int32_t>>& slots,
                          const std::vector<int32_t>& topk_length) {
  const SparseMlaSpec& sp = spec_;
  // q: dense storage with padded head rows, viewed as [T, H, d_qk].
  q_ = HostTensor::Dense(DType::kBF16, {sp.t, sp.h, sp.d_qk + sp.q_pad});
  FillNormal(q_, rng, 1.0);
  q_.tensor().shape[2] = sp.d_qk;

  // kv: S + 2 guard rows, guards NaN, viewed from row kKvGuardRows.
  const int64_t row_stride = std::max(sp.kv_row_stride, sp.d_qk);
  kv_storage_ =
      HostTensor::RowStrided(DType::kBF16, {sp.s + 2 * kKvGuardRows, sp.d_qk}, row_stride);
  FillNormal(kv_storage_, rng, 1.0);
  kv_ = kv_storage_.tensor();
  kv_.shape[0] = sp.s;
  kv_.data = kv_storage_.data<kernels::bf16_t>() + kKvGuardRows * row_stride;
  for (int64_t g = 1; g <= kKvGuardRows; ++g) {
    SetKvRow(-g, std::numeric_limits<float>::quiet_NaN());
    SetKvRow(sp.s - 1 + g, std::numeric_limits<float>::quiet_NaN());
  }

  // Table form.
  table_ = HostTensor::RowStrided(DType::kI32, {sp.t, sp.k}, sp.k + sp.indices_row_pad);
  FillUniformInt(table_, rng, -5, 5);  // padding holds junk the op must not read as slots
  int32_t* table = table_.data<int32_t>();
  for (int64_t t = 0; t < sp.t; ++t) {
    for (int64_t i = 0; i < sp.k; ++i) table[table_.Offset({t, i})] = slots[t][i];
  }
  if (sp.with_topk_length) {
    topk_length_ = HostTensor::Dense(DType::kI32, {sp.t});
    std::copy(topk_length.begin(), topk_length.end(), topk_length_.data<int32_t>());
  }

  // CSR form of the same selection.
  std::vector<int32_t> flat;
  indptr_ = HostTensor::Dense(DType::kI32, {sp.t + 1});
  int32_t* indptr = indptr_.data<int32_t>();
  indptr[0] = 0;
  for (int64_t t = 0; t < sp.t; ++t) {
    int64_t len = sp.k;
    if (sp.with_topk_length) len = std::clamp<int64_t>(topk_length[t], 0, sp.k);
    flat.insert(flat.end(), slots[t].begin(), slots[t].begin() + len);
    indptr[t + 1] = static_cast<int32_t>(flat.size());
  }
  csr_indices_ = HostTensor::Dense(DType::kI32, {static_cast<int64_t>(flat.size())});
  std::copy(flat.begin(), flat.end(), csr_indices_.data<int32_t>());

  out_ = HostTensor::Dense(DType::kBF16, {sp.t, sp.h, kernels::sparse_mla::kDimV});
  if (sp.with_lse) lse_ = HostTensor::Dense(DType::kF32, {sp.t, sp.h});
}

void SparseMlaCase::SetKvRow(int64_t row, float value) {
  kernels::bf16_t* p = static_cast<kernels::bf16_t*>(kv_.data) + row * kv_.strides[0];
  std::fill(p, p + spec_.d_qk, kernels::FloatToBf16(value));
}

Params SparseMlaCase::MakeParams(bool csr) {
  kernels::sparse_mla::Params p;
  p.q = q_.tensor();
  p.kv = kv_;
  if (csr) {
    p.indices = csr_indices_.tensor();
    p.indptr = indptr_.tensor();
  } else {
    p.indices = table_.tensor();
    if (spec_.with_topk_length) p.topk_length = topk_length_.tensor();
  }
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec_.d_qk)));
  p.out = out_.tensor();
  if (spec_.with_lse) p.lse = lse_.tensor();
  return p;
}

std::vector<HostTensor*> SparseMlaCase::Outputs() {
  std::vector<HostTensor*> outs = {&out_};
  if (spec_.with_lse) outs.push_back(&lse_);
  return outs;
}

}  // namespace attnd::testing
