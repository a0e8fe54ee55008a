// Owned host tensors for tests and benchmarks: dense or with padded leading strides, random
// fills per dtype, NaN poisoning, and float views for comparisons.
//   HostTensor q = HostTensor::Dense(DType::kBF16, {t, h, 576});
//   FillNormal(q, rng, 1.0);
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <random>
#include <vector>

#include "kernels/common/tensor.h"

namespace attnd::testing {

using kernels::DType;
using kernels::Tensor;

class HostTensor {
 public:
  HostTensor() = default;
  static HostTensor Dense(DType dtype, std::initializer_list<int64_t> shape);
  static HostTensor Dense(DType dtype, const std::vector<int64_t>& shape);
  // Leading dimension 0's stride is padded to `row_stride` elements (>= dense); the rest dense.
  static HostTensor RowStrided(DType dtype, std::initializer_list<int64_t> shape,
                               int64_t row_stride);

  Tensor& tensor() { return view_; }
  const Tensor& tensor() const { return view_; }
  template <class T>
  T* data() const {
    return static_cast<T*>(view_.data);
  }
  int64_t span_elements() const { return kernels::SpanElements(view_); }
  int64_t bytes() const { return static_cast<int64_t>(storage_.size()); }
  uint8_t* raw() const { return storage_.empty() ? nullptr : storage_.data(); }

  // Element at logical multi-index, converted to double (dtype-aware).
  double At(std::initializer_list<int64_t> index) const;
  int64_t Offset(std::initializer_list<int64_t> index) const;  // in elements

 private:
  static HostTensor Allocate(DType dtype, const int64_t* shape, int rank, int64_t row_stride);
  mutable std::vector<uint8_t> storage_;
  Tensor view_;
};

// Fills every element in the span (padding included) with values from N(0, stddev) (float
// types; fp8 after scaling into range) or U[lo, hi] for integers.
void FillNormal(HostTensor& t, std::mt19937_64& rng, double stddev);
void FillUniform(HostTensor& t, std::mt19937_64& rng, double lo, double hi);
void FillUniformInt(HostTensor& t, std::mt19937_64& rng, int64_t lo, int64_t hi);
// Every byte of the span: f32/bf16 get a quiet-NaN pattern, fp8 0x7f, integers 0x7f7f7f7f.
void PoisonNaN(HostTensor& t);
bool IsPoisonF32(float v);  // exactly the f32 poison pattern PoisonNaN writes

// Element-wise conversion of any float dtype to double (dense, logical shape).
std::vector<double> ToDoubles(const HostTensor& t);

}  // namespace attnd::testing
