#include "tests/kernels/sparse_mla/case.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/common/gpu/runtime.h"
#include "kernels/sparse_mla/gpu/launch.h"
#endif

namespace attnd::testing {

using kernels::DType;
using kernels::sparse_mla::kDimV;
using kernels::sparse_mla::kFp8DimQk;
using kernels::sparse_mla::kFp8RopeOffset;
using kernels::sparse_mla::kFp8RowBytes;
using kernels::sparse_mla::kFp8ScaleCols;
using kernels::sparse_mla::kFp8ScaleOffset;
using kernels::sparse_mla::Params;

std::string KvFormatName(KvFormat f) {
  return f == KvFormat::kFp8 ? "Fp8" : f == KvFormat::kFp8PerTensor ? "Fp8PerTensor" : "Bf16";
}

namespace {
// The per-tensor cache's scale for a spec (case.h SparseMlaSpec::kv_scale).
float PerTensorScale(const SparseMlaSpec& spec) {
  if (spec.kv_scale != 0) return spec.kv_scale;
  return spec.pow2_scales ? 0.03125f : 0.0371f;
}
}  // namespace

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
  if (spec_.kv_format == KvFormat::kFp8) spec_.d_qk = kFp8DimQk;
  if (spec_.kv_format == KvFormat::kFp8PerTensor) spec_.kv_scale = PerTensorScale(spec_);
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
  if (spec_.kv_format == KvFormat::kFp8) spec_.d_qk = kFp8DimQk;
  if (spec_.kv_format == KvFormat::kFp8PerTensor) spec_.kv_scale = PerTensorScale(spec_);
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

  // kv: S + 2 guard rows, guards NaN, viewed from row kKvGuardRows. FP8: the bytes past 656 in
  // a wider row hold NaN codes (never read).
  const bool fp8 = sp.kv_format == KvFormat::kFp8;
  const bool per_tensor = sp.kv_format == KvFormat::kFp8PerTensor;
  const int64_t row_width = fp8 ? kFp8RowBytes : sp.d_qk;
  const int64_t row_stride = std::max(sp.kv_row_stride, row_width);
  const int64_t storage_rows = sp.s + 2 * kKvGuardRows;
  kv_storage_ = HostTensor::RowStrided(fp8 || per_tensor ? DType::kU8 : DType::kBF16,
                                       {storage_rows, row_width}, row_stride);
  if (per_tensor) {
    // The frontend's writer: a bf16 row (latent, then rope at d_qk 576) quantised with the one
    // scale; the bytes past d_qk in a wider row hold NaN codes (never read).
    std::fill(kv_storage_.raw(), kv_storage_.raw() + kv_storage_.bytes(), uint8_t{0x7f});
    std::vector<kernels::bf16_t> source(static_cast<size_t>(sp.d_qk));
    for (int64_t r = 0; r < storage_rows; ++r) {
      FillMlaSourceRow(source.data(), sp.d_qk, sp.kv_scale, rng);
      QuantizeMlaRowPerTensor(source.data(), sp.d_qk, sp.kv_scale,
                              kv_storage_.data<uint8_t>() + r * row_stride);
    }
  } else if (fp8) {
    std::fill(kv_storage_.raw(), kv_storage_.raw() + kv_storage_.bytes(), uint8_t{0x7f});
    for (int64_t r = 0; r < storage_rows; ++r) {
      FillFp8Row(kv_storage_.data<uint8_t>() + r * row_stride, rng, sp.pow2_scales);
    }
  } else {
    FillNormal(kv_storage_, rng, 1.0);
  }
  kv_ = kv_storage_.tensor();
  kv_.shape[0] = sp.s;
  kv_.data = static_cast<char*>(kv_storage_.tensor().data) +
             kKvGuardRows * row_stride * kernels::DTypeSize(kv_.dtype);
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
  if (sp.with_lse) {
    lse_ = sp.lse_head_major ? StridedF32({sp.t, sp.h}, {1, sp.t + sp.lse_pad})
                             : StridedF32({sp.t, sp.h}, {sp.h + sp.lse_pad, 1});
  }
}

void SparseMlaCase::SetKvRow(int64_t row, float value) {
  if (spec_.kv_format == KvFormat::kFp8PerTensor) {
    uint8_t* p = static_cast<uint8_t*>(kv_.data) + row * kv_.strides[0];
    std::fill(p, p + spec_.d_qk, kernels::FloatToFp8E4M3(value / spec_.kv_scale));
    return;
  }
  if (spec_.kv_format == KvFormat::kFp8) {
    uint8_t* p = static_cast<uint8_t*>(kv_.data) + row * kv_.strides[0];
    std::fill(p, p + kDimV, kernels::FloatToFp8E4M3(value));
    const float scale = std::isnan(value) ? value : 1.0f;
    for (int64_t j = 0; j < kDimV / kFp8ScaleCols; ++j) {
      std::memcpy(p + kFp8ScaleOffset + 4 * j, &scale, sizeof scale);
    }
    const kernels::bf16_t b = kernels::FloatToBf16(value);
    for (int64_t d = 0; d < kFp8DimQk - kDimV; ++d) std::memcpy(p + kFp8RopeOffset + 2 * d, &b, 2);
    return;
  }
  kernels::bf16_t* p = static_cast<kernels::bf16_t*>(kv_.data) + row * kv_.strides[0];
  std::fill(p, p + spec_.d_qk, kernels::FloatToBf16(value));
}

Params SparseMlaCase::MakeParams(bool csr) {
  kernels::sparse_mla::Params p;
  p.q = q_.tensor();
  p.kv = kv_;
  if (spec_.kv_format == KvFormat::kFp8PerTensor) p.kv_scale = spec_.kv_scale;
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

void ExpectOutputs(SparseMlaCase& c, const kernels::sparse_mla::Params& p,
                   const kernels::sparse_mla::Reference& ref, const std::string& what) {
  ExpectAttentionOut(ToDoubles(c.out()), ref.out, ref.out_abs, p.precision, kOutTol, what + " out");
  if (p.lse.present()) {
    ExpectClose(ToDoubles(c.lse()), ref.lse, kLseTol, what + " lse");
    ExpectLseGapsPoisoned(c.lse(), what);
  }
}

HostTensor StridedF32(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t span = 1;
  for (size_t d = 0; d < shape.size(); ++d) span += shape[d] == 0 ? 0 : (shape[d] - 1) * strides[d];
  HostTensor h = HostTensor::Dense(DType::kF32, {span});
  kernels::Tensor& v = h.tensor();
  v.rank = static_cast<int>(shape.size());
  for (int d = 0; d < v.rank; ++d) {
    v.shape[d] = shape[d];
    v.strides[d] = strides[d];
  }
  return h;
}

void ExpectLseGapsPoisoned(const HostTensor& lse, const std::string& what) {
  const kernels::Tensor& v = lse.tensor();
  const int64_t span = kernels::SpanElements(v);
  std::vector<bool> addressed(static_cast<size_t>(span), false);
  std::vector<int64_t> idx(v.rank, 0);
  for (int64_t n = 0; n < v.numel(); ++n) {
    int64_t off = 0;
    for (int d = 0; d < v.rank; ++d) off += idx[d] * v.strides[d];
    addressed[off] = true;
    for (int d = v.rank - 1; d >= 0; --d) {
      if (++idx[d] < v.shape[d]) break;
      idx[d] = 0;
    }
  }
  int64_t bad = 0;
  for (int64_t i = 0; i < span; ++i) {
    if (!addressed[i] && !IsPoisonF32(lse.data<float>()[i])) {
      if (bad++ < 4) ADD_FAILURE() << what << " lse: gap element " << i << " was written";
    }
  }
  EXPECT_EQ(bad, 0) << what << " lse: elements between the view's rows were overwritten";
}

absl::Status RunOnGpuWithKvGuards(const kernels::Impl<kernels::sparse_mla::Params>& impl,
                                  const kernels::sparse_mla::Params& p) {
  using kernels::sparse_mla::Params;
  const int64_t guard_bytes = kKvGuardRows * p.kv.stride(0) * kernels::DTypeSize(p.kv.dtype);
  Params widened = p;
  widened.kv.data = static_cast<char*>(p.kv.data) - guard_bytes;
  widened.kv.shape[0] = p.kv.dim(0) + 2 * kKvGuardRows;
  kernels::Impl<Params> narrowed = impl;
  narrowed.run = [impl, guard_bytes](const Params& d, const kernels::ExecContext& ctx) {
    Params inner = d;
    inner.kv.data = static_cast<char*>(d.kv.data) + guard_bytes;
    inner.kv.shape[0] = d.kv.dim(0) - 2 * kKvGuardRows;
    return impl.run(inner, ctx);
  };
  return RunOnGpu(narrowed, widened);
}

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
std::vector<std::pair<kernels::Precision, int>> PrecisionsAndSplits(
    std::initializer_list<int> splits) {
  std::vector<std::pair<kernels::Precision, int>> pairs;
  for (const kernels::Precision precision : kPrecisions) {
    for (int s : splits) pairs.emplace_back(precision, s);
  }
  return pairs;
}

absl::Status RunWithSplitsOnGpu(const SplitLauncher& launch, const kernels::sparse_mla::Params& p,
                                int splits) {
  using kernels::sparse_mla::Params;
  kernels::Impl<Params> impl(
      "forced", GpuBackend(), nullptr,
      [launch, splits](const Params& d, const kernels::ExecContext& ctx) -> absl::Status {
        GPU_RETURN_IF_ERROR(launch(d, splits, ctx.workspace, static_cast<gpu::Stream>(ctx.stream)));
        return absl::OkStatus();
      },
      [splits](const Params& h) {
        return kernels::sparse_mla::gpu::SplitWorkspaceBytes(h, splits);
      });
  return RunOnGpuWithKvGuards(impl, p);
}
#endif

}  // namespace attnd::testing
