#include "tests/kernels/mla_decode/decode_case.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"
#include "tests/harness/fp8_kv.h"

namespace attnd::kernels::mla_decode {
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

}  // namespace

DecodeTensors::DecodeTensors(const DecodeCase& c, std::mt19937_64& rng) {
  const int64_t batch = static_cast<int64_t>(c.seqlens.size());
  int64_t max_pages = c.max_pages;
  if (max_pages < 0) {
    max_pages = 1;
    for (int32_t len : c.seqlens) {
      max_pages = std::max<int64_t>(max_pages, (std::max(len, 0) + c.page_size - 1) / c.page_size);
    }
  }
  const int64_t num_pages = batch * max_pages + c.spare_pages;

  q_ = Padded(DType::kBF16, {batch, c.s_q, c.heads, c.d_qk}, c.padded_strides);
  testing::FillNormal(q_, rng, 1.0);

  // The cache view sits between two guard pages of NaN: reading ids -1 or num_pages poisons.
  const bool fp8 = c.fp8_kv_scale != 0;
  kv_ = Padded(fp8 ? DType::kU8 : DType::kBF16, {num_pages + 2, c.page_size, c.d_qk},
               c.padded_strides);
  Tensor& kv = kv_.tensor();
  if (fp8) {
    // NaN codes everywhere (guard pages, row padding), then each token row the frontend's way.
    std::fill(kv_.raw(), kv_.raw() + kv_.bytes(), uint8_t{0x7f});
    std::vector<bf16_t> source(static_cast<size_t>(c.d_qk));
    for (int64_t pg = 1; pg <= num_pages; ++pg) {
      for (int64_t slot = 0; slot < c.page_size; ++slot) {
        testing::FillMlaSourceRow(source.data(), c.d_qk, c.fp8_kv_scale, rng);
        testing::QuantizeMlaRowPerTensor(
            source.data(), c.d_qk, c.fp8_kv_scale,
            kv.ptr<uint8_t>() + pg * kv.strides[0] + slot * kv.strides[1]);
      }
    }
  } else {
    testing::FillNormal(kv_, rng, 1.0);
    for (int64_t guard : {int64_t{0}, num_pages + 1}) {
      bf16_t* page = kv.ptr<bf16_t>() + guard * kv.strides[0];
      std::fill(page, page + kv.strides[0], FloatToBf16(std::nanf("")));
    }
  }
  Tensor kv_view = kv;
  kv_view.data = static_cast<char*>(kv.data) + kv.strides[0] * DTypeSize(kv.dtype);
  kv_view.shape[0] = num_pages;

  // Every request gets distinct pages in a random order; ids of unused table slots are random
  // valid pages too (they lie past the request's length and must not matter).
  table_ = Padded(DType::kI32, {batch, max_pages}, c.padded_strides);
  std::vector<int32_t> ids(static_cast<size_t>(num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const Tensor& tt = table_.tensor();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < max_pages; ++j) {
      tt.ptr<int32_t>()[b * tt.strides[0] + j * tt.strides[1]] = ids[b * max_pages + j];
    }
  }
  for (size_t n = 0; n < c.invalid_pages.size(); ++n) {
    const auto [b, j] = c.invalid_pages[n];
    tt.ptr<int32_t>()[b * tt.strides[0] + j * tt.strides[1]] =
        c.invalid_ids[n % c.invalid_ids.size()];
  }

  seqlens_ = HostTensor::Dense(DType::kI32, {batch});  // 1-D: its only dim is contiguous
  for (int64_t b = 0; b < batch; ++b) seqlens_.data<int32_t>()[b] = c.seqlens[b];
  if (c.nan_past_length && !fp8) {
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t pos = std::max<int64_t>(c.seqlens[b], 0); pos < max_pages * c.page_size; ++pos) {
        const int32_t id =
            tt.ptr<int32_t>()[b * tt.strides[0] + (pos / c.page_size) * tt.strides[1]];
        if (id < 0 || id >= num_pages) continue;
        bf16_t* row =
            kv_view.ptr<bf16_t>() + id * kv.strides[0] + (pos % c.page_size) * kv.strides[1];
        std::fill(row, row + c.d_qk, FloatToBf16(std::nanf("")));
      }
    }
  }

  out_ = Padded(DType::kBF16, {batch, c.s_q, c.heads, kDv}, c.padded_strides);
  if (c.with_lse && c.lse_head_major) {
    // Storage [B, H, s_q + pad], viewed as [B, s_q, H].
    const int64_t row = c.s_q + c.lse_pad;
    lse_ = HostTensor::Dense(DType::kF32, {batch, c.heads, row});
    Tensor& v = lse_.tensor();
    v.shape[1] = c.s_q;
    v.shape[2] = c.heads;
    v.strides[0] = c.heads * row;
    v.strides[1] = 1;
    v.strides[2] = row;
  } else if (c.with_lse) {
    lse_ = Padded(DType::kF32, {batch, c.s_q, c.heads}, c.padded_strides);
  }

  params_.q = q_.tensor();
  params_.kv_cache = kv_view;
  params_.block_table = table_.tensor();
  params_.cache_seqlens = seqlens_.tensor();
  params_.out = out_.tensor();
  if (c.with_lse) params_.lse = lse_.tensor();
  params_.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d_qk)));
  params_.kv_scale = c.fp8_kv_scale;
  params_.causal = c.causal;
}

void ExpectLseGapsPoisoned(const HostTensor& lse, const std::string& what) {
  const Tensor& v = lse.tensor();
  const int64_t span = SpanElements(v);
  std::vector<bool> addressed(static_cast<size_t>(span), false);
  for (int64_t b = 0; b < v.shape[0]; ++b) {
    for (int64_t i = 0; i < v.shape[1]; ++i) {
      for (int64_t h = 0; h < v.shape[2]; ++h) {
        addressed[b * v.strides[0] + i * v.strides[1] + h * v.strides[2]] = true;
      }
    }
  }
  int64_t bad = 0;
  for (int64_t i = 0; i < span; ++i) {
    if (!addressed[i] && !testing::IsPoisonF32(lse.data<float>()[i])) {
      if (bad++ < 4) ADD_FAILURE() << what << " lse: gap element " << i << " was written";
    }
  }
  EXPECT_EQ(bad, 0) << what << " lse: elements between the view's rows were overwritten";
}

HostTensor DecodeTensors::RoundedKvAsBf16() const {
  const Tensor& kv = params_.kv_cache;
  const int64_t pages = kv.dim(0), page_size = kv.dim(1), d = kv.dim(2);
  HostTensor out = HostTensor::Dense(DType::kBF16, {pages, page_size, d});
  for (int64_t pg = 0; pg < pages; ++pg) {
    for (int64_t slot = 0; slot < page_size; ++slot) {
      const uint8_t* row =
          static_cast<const uint8_t*>(kv.data) + pg * kv.stride(0) + slot * kv.stride(1);
      bf16_t* dst = out.data<bf16_t>() + (pg * page_size + slot) * d;
      for (int64_t col = 0; col < d; ++col) {
        dst[col] = FloatToBf16(Fp8E4M3ToFloat(row[col]) * params_.kv_scale);
      }
    }
  }
  return out;
}

std::vector<testing::HostTensor*> DecodeTensors::outputs() {
  std::vector<testing::HostTensor*> v = {&out_};
  if (lse_.tensor().present()) v.push_back(&lse_);
  return v;
}

}  // namespace attnd::kernels::mla_decode
