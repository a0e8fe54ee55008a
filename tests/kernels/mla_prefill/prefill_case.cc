#include "tests/kernels/mla_prefill/prefill_case.h"

#include <cmath>

#include "kernels/common/bf16.h"

namespace attnd::kernels::mla_prefill {
namespace {

using testing::HostTensor;

// A dense allocation of `shape` (+pad on every dim when padded) viewed with the real shape.
HostTensor Padded(DType dtype, std::vector<int64_t> shape, bool padded) {
  std::vector<int64_t> alloc = shape;
  if (padded) {
    for (size_t i = 0; i < alloc.size(); ++i) alloc[i] += (i + 1 == alloc.size()) ? 8 : 1;
  }
  HostTensor t = HostTensor::Dense(dtype, alloc);
  for (size_t i = 0; i < shape.size(); ++i) t.tensor().shape[i] = shape[i];
  return t;
}

void FillRowsNaN(HostTensor& t, int64_t first_row) {
  const Tensor& v = t.tensor();
  for (int64_t r = first_row; r < v.shape[0]; ++r) {
    bf16_t* row = v.ptr<bf16_t>() + r * v.strides[0];
    for (int64_t i = 0; i < v.strides[0]; ++i) row[i] = FloatToBf16(std::nanf(""));
  }
}

}  // namespace

PrefillTensors::PrefillTensors(const PrefillCase& c, std::mt19937_64& rng) {
  const int64_t batch = static_cast<int64_t>(c.lens.size());
  cu_q_ = HostTensor::Dense(DType::kI32, {batch + 1});
  cu_k_ = HostTensor::Dense(DType::kI32, {batch + 1});
  int32_t tq = 0, tk = 0;
  for (int64_t b = 0; b <= batch; ++b) {
    cu_q_.data<int32_t>()[b] = tq;
    cu_k_.data<int32_t>()[b] = tk;
    if (b < batch) {
      tq += c.lens[b].first;
      tk += c.lens[b].second;
    }
  }
  const int64_t total_q = tq + c.extra_q_rows, total_k = tk + c.extra_k_rows;
  q_ = Padded(DType::kBF16, {total_q, c.heads, c.d_qk}, c.padded_strides);
  k_ = Padded(DType::kBF16, {total_k, c.heads_kv, c.d_qk}, c.padded_strides);
  v_ = Padded(DType::kBF16, {total_k, c.heads_kv, c.d_v}, c.padded_strides);
  testing::FillNormal(q_, rng, 1.0);
  testing::FillNormal(k_, rng, 1.0);
  testing::FillNormal(v_, rng, 1.0);
  FillRowsNaN(k_, tk);
  FillRowsNaN(v_, tk);
  out_ = Padded(DType::kBF16, {total_q, c.heads, c.d_v}, c.padded_strides);
  if (c.with_lse) lse_ = Padded(DType::kF32, {total_q, c.heads}, c.padded_strides);

  params_.q = q_.tensor();
  params_.k = k_.tensor();
  params_.v = v_.tensor();
  params_.cu_seqlens_q = cu_q_.tensor();
  params_.cu_seqlens_k = cu_k_.tensor();
  params_.out = out_.tensor();
  if (c.with_lse) params_.lse = lse_.tensor();
  params_.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d_qk)));
  params_.causal = c.causal;
}

std::vector<testing::HostTensor*> PrefillTensors::outputs() {
  std::vector<testing::HostTensor*> v = {&out_};
  if (lse_.tensor().present()) v.push_back(&lse_);
  return v;
}

}  // namespace attnd::kernels::mla_prefill
