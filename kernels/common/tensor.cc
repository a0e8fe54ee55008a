#include "kernels/common/tensor.h"

#include "absl/strings/str_cat.h"
#include "kernels/common/status_details.h"

namespace attnd::kernels {

bool MulOverflow(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }
bool AddOverflow(int64_t a, int64_t b, int64_t* out) { return __builtin_add_overflow(a, b, out); }

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

Tensor MakeTensor(void* data, DType dtype, const int64_t* shape, int rank) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.rank = rank;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i] > 0 ? shape[i] : 1;
  }
  return t;
}

Tensor MakeTensor(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return MakeTensor(data, dtype, shape.begin(), static_cast<int>(shape.size()));
}

Tensor MakeStridedTensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                         std::initializer_list<int64_t> strides) {
  Tensor t = MakeTensor(data, dtype, shape);
  int i = 0;
  for (int64_t s : strides) t.strides[i++] = s;
  return t;
}

int64_t SpanElements(const Tensor& t) {
  int64_t span = 1;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) return 0;
    span += (t.shape[i] - 1) * t.strides[i];
  }
  return span;
}

absl::Status SpanBytes(const Tensor& t, int64_t* bytes) {
  int64_t span = 1;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) {
      *bytes = 0;
      return absl::OkStatus();
    }
    int64_t term;
    if (MulOverflow(t.shape[i] - 1, t.strides[i], &term) || AddOverflow(span, term, &span)) {
      return absl::InvalidArgumentError("tensor span overflows int64");
    }
  }
  if (MulOverflow(span, DTypeSize(t.dtype), bytes)) {
    return absl::InvalidArgumentError("tensor byte span overflows int64");
  }
  return absl::OkStatus();
}

namespace {

// Presence, dtype, rank and each dimension: the part of CheckTensor and CheckStridedTensor that
// does not look at strides.
absl::Status CheckShape(const Tensor& t, absl::string_view name, DType dtype,
                        std::initializer_list<int64_t> shape) {
  if (!t.present()) return InvalidField(name, absl::StrCat(name, ": missing"));
  if (t.dtype != dtype) {
    return InvalidField(
        TensorDtypeField(name),
        absl::StrCat(name, ": dtype is ", DTypeName(t.dtype), ", want ", DTypeName(dtype)));
  }
  const int want_rank = static_cast<int>(shape.size());
  if (t.rank != want_rank) {
    return InvalidField(absl::StrCat(name, ".shape"),
                        absl::StrCat(name, ": rank is ", t.rank, ", want ", want_rank));
  }
  int i = 0;
  for (int64_t want : shape) {
    if (t.shape[i] < 0) {
      return InvalidField(TensorDimField(name, i),
                          absl::StrCat(name, ": dim ", i, " is ", t.shape[i], ", want >= 0"));
    }
    if (want != kAnyDim && t.shape[i] != want) {
      return InvalidField(TensorDimField(name, i),
                          absl::StrCat(name, ": dim ", i, " is ", t.shape[i], ", want ", want));
    }
    ++i;
  }
  return absl::OkStatus();
}

// The byte span fits in int64 and a tensor with elements has a pointer.
absl::Status CheckSpanAndData(const Tensor& t, absl::string_view name) {
  int64_t bytes;
  if (!SpanBytes(t, &bytes).ok()) {
    return InvalidField(name, absl::StrCat(name, ": byte size overflows int64"));
  }
  if (bytes > 0 && t.data == nullptr) {
    return InvalidField(name, absl::StrCat(name, ": data pointer is null"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTensor(const Tensor& t, absl::string_view name, DType dtype,
                         std::initializer_list<int64_t> shape) {
  if (absl::Status s = CheckShape(t, name, dtype, shape); !s.ok()) return s;
  if (t.rank > 0 && t.shape[t.rank - 1] > 1 && t.strides[t.rank - 1] != 1) {
    return InvalidField(TensorStrideField(name, t.rank - 1),
                        absl::StrCat(name, ": stride of dim ", t.rank - 1, " is ",
                                     t.strides[t.rank - 1], ", want 1 (last dim contiguous)"));
  }
  // Each leading stride must step over the whole extent of the dimensions below it, so rows never
  // alias (outputs written in parallel rely on it).
  int64_t inner_extent = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    if (t.strides[d] < 0) {
      return InvalidField(
          TensorStrideField(name, d),
          absl::StrCat(name, ": stride of dim ", d, " is ", t.strides[d], ", want >= 0"));
    }
    if (d < t.rank - 1 && t.shape[d] > 1 && t.strides[d] < inner_extent) {
      return InvalidField(TensorStrideField(name, d),
                          absl::StrCat(name, ": stride of dim ", d, " is ", t.strides[d],
                                       ", want >= ", inner_extent));
    }
    int64_t extent;
    if (t.shape[d] == 0) break;
    if (MulOverflow(t.shape[d] - 1, t.strides[d], &extent) ||
        AddOverflow(extent, inner_extent, &inner_extent)) {
      return InvalidField(name, absl::StrCat(name, ": size overflows int64"));
    }
  }
  return CheckSpanAndData(t, name);
}

absl::Status CheckStridedTensor(const Tensor& t, absl::string_view name, DType dtype,
                                std::initializer_list<int64_t> shape) {
  if (absl::Status s = CheckShape(t, name, dtype, shape); !s.ok()) return s;
  for (int d = 0; d < t.rank; ++d) {
    if (t.strides[d] < 0) {
      return InvalidField(
          TensorStrideField(name, d),
          absl::StrCat(name, ": stride of dim ", d, " is ", t.strides[d], ", want >= 0"));
    }
  }
  if (t.numel() == 0) return CheckSpanAndData(t, name);
  // No aliasing (tensor.h): the dimensions longer than 1 by increasing stride (ties by index),
  // each stride at least the span of the ones before it. Then the element offsets are a
  // mixed-radix number and distinct elements land on distinct addresses.
  int order[kMaxRank];
  int n = 0;
  for (int d = 0; d < t.rank && d < kMaxRank; ++d) {
    if (t.shape[d] <= 1) continue;
    int j = n++;  // insertion sort: at most kMaxRank entries; stable, so ties keep index order
    for (; j > 0 && t.strides[order[j - 1]] > t.strides[d]; --j) order[j] = order[j - 1];
    order[j] = d;
  }
  int64_t span = 1;  // elements covered by the dimensions taken so far
  for (int j = 0; j < n; ++j) {
    const int d = order[j];
    if (t.strides[d] < span) {
      return InvalidField(
          TensorStrideField(name, d),
          absl::StrCat(name, ": stride of dim ", d, " is ", t.strides[d], ", want >= ", span,
                       " (the span of the dims with smaller strides; else elements overlap)"));
    }
    int64_t extent;
    if (MulOverflow(t.shape[d] - 1, t.strides[d], &extent) || AddOverflow(extent, span, &span)) {
      return InvalidField(name, absl::StrCat(name, ": size overflows int64"));
    }
  }
  return CheckSpanAndData(t, name);
}

absl::Status CheckOptionalStridedTensor(const Tensor& t, absl::string_view name, DType dtype,
                                        std::initializer_list<int64_t> shape) {
  if (!t.present()) return absl::OkStatus();
  return CheckStridedTensor(t, name, dtype, shape);
}

absl::Status CheckOptionalTensor(const Tensor& t, absl::string_view name, DType dtype,
                                 std::initializer_list<int64_t> shape) {
  if (!t.present()) return absl::OkStatus();
  return CheckTensor(t, name, dtype, shape);
}

}  // namespace attnd::kernels
