#include "tests/harness/host_tensor.h"

#include <cmath>
#include <cstring>

#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"

namespace attnd::testing {

using kernels::Bf16ToFloat;
using kernels::FloatToBf16;
using kernels::FloatToFp8E4M3;
using kernels::Fp8E4M3ToFloat;

namespace {
constexpr uint32_t kPoisonF32 = 0x7fc0dead;
constexpr uint16_t kPoisonBf16 = 0x7fde;
}  // namespace

HostTensor HostTensor::Allocate(DType dtype, const int64_t* shape, int rank, int64_t row_stride) {
  HostTensor h;
  h.view_ = kernels::MakeTensor(nullptr, dtype, shape, rank);
  if (rank > 0 && row_stride > h.view_.strides[0]) h.view_.strides[0] = row_stride;
  const int64_t span = kernels::SpanElements(h.view_);
  // A few bytes of slack so zero-size tensors still have a distinct, non-null pointer.
  h.storage_.assign(static_cast<size_t>(span * kernels::DTypeSize(dtype)) + 64, 0);
  h.view_.data = h.storage_.data();
  return h;
}

HostTensor HostTensor::Dense(DType dtype, std::initializer_list<int64_t> shape) {
  return Allocate(dtype, shape.begin(), static_cast<int>(shape.size()), 0);
}
HostTensor HostTensor::Dense(DType dtype, const std::vector<int64_t>& shape) {
  return Allocate(dtype, shape.data(), static_cast<int>(shape.size()), 0);
}
HostTensor HostTensor::RowStrided(DType dtype, std::initializer_list<int64_t> shape,
                                  int64_t row_stride) {
  return Allocate(dtype, shape.begin(), static_cast<int>(shape.size()), row_stride);
}

int64_t HostTensor::Offset(std::initializer_list<int64_t> index) const {
  int64_t off = 0;
  int i = 0;
  for (int64_t x : index) off += x * view_.strides[i++];
  return off;
}

namespace {
double LoadAsDouble(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kBF16: return Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kFp8E4M3: return Fp8E4M3ToFloat(static_cast<const uint8_t*>(base)[i]);
    case DType::kI32: return static_cast<const int32_t*>(base)[i];
    case DType::kU8: return static_cast<const uint8_t*>(base)[i];
    case DType::kInvalid: break;
  }
  return std::nan("");
}

void StoreFromDouble(void* base, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = FloatToBf16(static_cast<float>(v)); break;
    case DType::kFp8E4M3:
      static_cast<uint8_t*>(base)[i] = FloatToFp8E4M3(static_cast<float>(v));
      break;
    case DType::kI32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::kU8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
    case DType::kInvalid: break;
  }
}
}  // namespace

double HostTensor::At(std::initializer_list<int64_t> index) const {
  return LoadAsDouble(view_.data, view_.dtype, Offset(index));
}

void FillNormal(HostTensor& t, std::mt19937_64& rng, double stddev) {
  std::normal_distribution<double> dist(0.0, stddev);
  const int64_t n = t.span_elements();
  for (int64_t i = 0; i < n; ++i) StoreFromDouble(t.tensor().data, t.tensor().dtype, i, dist(rng));
}

void FillUniform(HostTensor& t, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  const int64_t n = t.span_elements();
  for (int64_t i = 0; i < n; ++i) StoreFromDouble(t.tensor().data, t.tensor().dtype, i, dist(rng));
}

void FillUniformInt(HostTensor& t, std::mt19937_64& rng, int64_t lo, int64_t hi) {
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  const int64_t n = t.span_elements();
  for (int64_t i = 0; i < n; ++i) {
    StoreFromDouble(t.tensor().data, t.tensor().dtype, i, static_cast<double>(dist(rng)));
  }
}

void PoisonNaN(HostTensor& t) {
  const int64_t n = t.span_elements();
  void* base = t.tensor().data;
  switch (t.tensor().dtype) {
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) std::memcpy(static_cast<float*>(base) + i, &kPoisonF32, 4);
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(base)[i] = kPoisonBf16;
      break;
    case DType::kFp8E4M3:
    case DType::kU8: std::memset(base, 0x7f, static_cast<size_t>(n)); break;
    case DType::kI32:
      for (int64_t i = 0; i < n; ++i) static_cast<int32_t*>(base)[i] = 0x7f7f7f7f;
      break;
    case DType::kInvalid: break;
  }
}

bool IsPoisonF32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u == kPoisonF32;
}

std::vector<double> ToDoubles(const HostTensor& t) {
  const Tensor& v = t.tensor();
  std::vector<double> out(static_cast<size_t>(v.numel()));
  std::vector<int64_t> idx(v.rank, 0);
  for (size_t flat = 0; flat < out.size(); ++flat) {
    int64_t off = 0;
    for (int d = 0; d < v.rank; ++d) off += idx[d] * v.strides[d];
    out[flat] = LoadAsDouble(v.data, v.dtype, off);
    for (int d = v.rank - 1; d >= 0; --d) {
      if (++idx[d] < v.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace attnd::testing
