#include "client/tensor_codec.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnd::client {
namespace {

constexpr size_t kAlign = 64;

absl::Status Invalid(absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
}

// Shape of the rows below the last dim: calls fn(src_offset, dst_offset) in elements for every
// row (index over dims [0, rank-1)), strides from `a` and `b`.
template <class F>
void ForEachRow(const kernels::Tensor& a, const kernels::Tensor& b, F&& fn) {
  const int lead = a.rank - 1;
  int64_t index[kernels::kMaxRank] = {};
  for (;;) {
    int64_t oa = 0, ob = 0;
    for (int d = 0; d < lead; ++d) {
      oa += index[d] * a.strides[d];
      ob += index[d] * b.strides[d];
    }
    fn(oa, ob);
    int d = lead - 1;
    while (d >= 0 && ++index[d] == a.shape[d]) index[d--] = 0;
    if (d < 0) return;
  }
}

}  // namespace

v1::DType ToProtoDType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return v1::DTYPE_F32;
    case DType::kBF16: return v1::DTYPE_BF16;
    case DType::kFp8E4M3: return v1::DTYPE_FP8_E4M3;
    case DType::kI32: return v1::DTYPE_I32;
    case DType::kU8: return v1::DTYPE_U8;
    case DType::kInvalid: break;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<DType> FromProtoDType(int proto_dtype, absl::string_view name) {
  switch (proto_dtype) {
    case v1::DTYPE_F32: return DType::kF32;
    case v1::DTYPE_BF16: return DType::kBF16;
    case v1::DTYPE_FP8_E4M3: return DType::kFp8E4M3;
    case v1::DTYPE_I32: return DType::kI32;
    case v1::DTYPE_U8: return DType::kU8;
    default:
      return Invalid(name, absl::StrCat("dtype ", proto_dtype, " is not a valid attnd.v1.DType"));
  }
}

void HostArray::FreeDeleter::operator()(void* p) const { std::free(p); }

HostArray HostArray::Dense(DType dtype, const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    if (shape[i] > 0 && __builtin_mul_overflow(stride, shape[i], &stride)) return HostArray();
  }
  return Strided(dtype, shape, strides);
}

HostArray HostArray::Strided(DType dtype, const std::vector<int64_t>& shape,
                             const std::vector<int64_t>& strides) {
  HostArray a;
  if (shape.empty() || shape.size() > kernels::kMaxRank || strides.size() != shape.size()) {
    return a;
  }
  kernels::Tensor v;
  v.dtype = dtype;
  v.rank = static_cast<int>(shape.size());
  for (int i = 0; i < v.rank; ++i) {
    if (shape[i] < 0 || strides[i] < 0) return a;
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  absl::StatusOr<uint64_t> bytes = SpanBytesOf(v, "array");
  if (!bytes.ok()) return a;
  if (*bytes > 0) {
    void* p = std::aligned_alloc(kAlign, (*bytes + kAlign - 1) / kAlign * kAlign);
    if (p == nullptr) return a;
    a.storage_.reset(p);
    v.data = p;
  }
  a.bytes_ = *bytes;
  a.view_ = v;
  return a;
}

HostArray HostArray::CopyOf(const kernels::Tensor& view) {
  std::vector<int64_t> shape(view.shape.begin(), view.shape.begin() + view.rank);
  std::vector<int64_t> strides(view.strides.begin(), view.strides.begin() + view.rank);
  HostArray a = Strided(view.dtype, shape, strides);
  if (a.bytes_ > 0 && view.data != nullptr) std::memcpy(a.data(), view.data, a.bytes_);
  return a;
}

bool IsDense(const kernels::Tensor& t) {
  int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    if (t.shape[i] > 1 && t.strides[i] != stride) return false;
    stride *= t.shape[i] > 0 ? t.shape[i] : 1;
  }
  return true;
}

absl::StatusOr<uint64_t> SpanBytesOf(const kernels::Tensor& t, absl::string_view name) {
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0 || t.strides[i] < 0) return Invalid(name, "negative dim or stride");
  }
  int64_t bytes = 0;
  if (!kernels::SpanBytes(t, &bytes).ok()) return Invalid(name, "byte span overflows int64");
  return static_cast<uint64_t>(bytes);
}

void SetLayout(const kernels::Tensor& t, v1::Tensor* out) {
  out->set_dtype(ToProtoDType(t.dtype));
  out->clear_shape();
  out->clear_strides();
  for (int i = 0; i < t.rank; ++i) out->add_shape(t.shape[i]);
  if (!IsDense(t)) {
    for (int i = 0; i < t.rank; ++i) out->add_strides(t.strides[i]);
  }
}

absl::Status EncodeInline(const kernels::Tensor& t, absl::string_view name, v1::Tensor* out) {
  absl::StatusOr<uint64_t> bytes = SpanBytesOf(t, name);
  if (!bytes.ok()) return bytes.status();
  if (*bytes > 0 && t.data == nullptr) return Invalid(name, "data pointer is null");
  SetLayout(t, out);
  std::string* data = out->mutable_inline_data();
  data->assign(static_cast<const char*>(t.data), *bytes);
  return absl::OkStatus();
}

void EncodeRegion(const kernels::Tensor& t, const std::string& region, uint64_t offset,
                  v1::Tensor* out) {
  SetLayout(t, out);
  v1::RegionSlice* slice = out->mutable_region();
  slice->set_region(region);
  slice->set_offset(offset);
}

absl::StatusOr<kernels::Tensor> LayoutOf(const v1::Tensor& t, absl::string_view name,
                                         uint64_t* span_bytes) {
  absl::StatusOr<DType> dtype = FromProtoDType(t.dtype(), name);
  if (!dtype.ok()) return dtype.status();
  const int rank = t.shape_size();
  if (rank < 1 || rank > kernels::kMaxRank) {
    return Invalid(name, absl::StrCat("rank is ", rank, ", want 1..", kernels::kMaxRank));
  }
  if (t.strides_size() != 0 && t.strides_size() != rank) {
    return Invalid(name, absl::StrCat(t.strides_size(), " strides for rank ", rank));
  }
  kernels::Tensor v;
  v.dtype = *dtype;
  v.rank = rank;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (t.shape(i) < 0) return Invalid(name, absl::StrCat("dim ", i, " is ", t.shape(i)));
    v.shape[i] = t.shape(i);
    v.strides[i] = t.strides_size() ? t.strides(i) : stride;
    if (t.shape(i) > 0 && __builtin_mul_overflow(stride, t.shape(i), &stride)) {
      return Invalid(name, "size overflows int64");
    }
  }
  absl::StatusOr<uint64_t> bytes = SpanBytesOf(v, name);
  if (!bytes.ok()) return bytes.status();
  *span_bytes = *bytes;
  return v;
}

absl::StatusOr<HostArray> DecodeInline(const v1::Tensor& t, absl::string_view name) {
  uint64_t span = 0;
  absl::StatusOr<kernels::Tensor> layout = LayoutOf(t, name, &span);
  if (!layout.ok()) return layout.status();
  if (t.data_case() != v1::Tensor::kInlineData) return Invalid(name, "no inline data");
  if (t.inline_data().size() != span) {
    return Invalid(name,
                   absl::StrCat("inline_data is ", t.inline_data().size(), " bytes, want ", span));
  }
  std::vector<int64_t> shape(layout->shape.begin(), layout->shape.begin() + layout->rank);
  std::vector<int64_t> strides(layout->strides.begin(), layout->strides.begin() + layout->rank);
  HostArray a = HostArray::Strided(layout->dtype, shape, strides);
  if (a.span_bytes() != span) {
    return absl::ResourceExhaustedError(absl::StrCat(name, ": cannot allocate ", span, " bytes"));
  }
  if (span > 0) std::memcpy(a.data(), t.inline_data().data(), span);
  return a;
}

absl::Status CopyTensor(const kernels::Tensor& src, const kernels::Tensor& dest,
                        absl::string_view name) {
  if (src.dtype != dest.dtype) {
    return Invalid(name, absl::StrCat("dtype is ", kernels::DTypeName(src.dtype), ", want ",
                                      kernels::DTypeName(dest.dtype)));
  }
  if (src.rank != dest.rank) {
    return Invalid(name, absl::StrCat("rank is ", src.rank, ", want ", dest.rank));
  }
  bool empty = false;
  for (int i = 0; i < src.rank; ++i) {
    if (src.shape[i] != dest.shape[i]) {
      return Invalid(name, absl::StrCat("dim ", i, " is ", src.shape[i], ", want ", dest.shape[i]));
    }
    empty |= src.shape[i] == 0;
  }
  if (empty || src.rank == 0) return absl::OkStatus();
  if (src.data == nullptr || dest.data == nullptr) return Invalid(name, "null data pointer");
  const int64_t esize = kernels::DTypeSize(src.dtype);
  const int last = src.rank - 1;
  if (src.shape[last] > 1 && (src.strides[last] != 1 || dest.strides[last] != 1)) {
    return Invalid(name, "last dim is not contiguous");
  }
  const size_t row_bytes = static_cast<size_t>(src.shape[last] * esize);
  const auto* from = static_cast<const char*>(src.data);
  auto* to = static_cast<char*>(dest.data);
  ForEachRow(src, dest, [&](int64_t os, int64_t od) {
    std::memmove(to + od * esize, from + os * esize, row_bytes);
  });
  return absl::OkStatus();
}

absl::Status CopyInlineInto(const v1::Tensor& t, absl::string_view name,
                            const kernels::Tensor& dest) {
  uint64_t span = 0;
  absl::StatusOr<kernels::Tensor> layout = LayoutOf(t, name, &span);
  if (!layout.ok()) return layout.status();
  if (t.data_case() != v1::Tensor::kInlineData) return Invalid(name, "no inline data");
  if (t.inline_data().size() != span) {
    return Invalid(name,
                   absl::StrCat("inline_data is ", t.inline_data().size(), " bytes, want ", span));
  }
  kernels::Tensor src = *layout;
  src.data = const_cast<char*>(t.inline_data().data());
  return CopyTensor(src, dest, name);
}

std::string DescribeTensor(const kernels::Tensor& t) {
  if (!t.present()) return "absent";
  std::string s = absl::StrCat(kernels::DTypeName(t.dtype), "[",
                               absl::StrJoin(t.shape.begin(), t.shape.begin() + t.rank, ", "));
  if (!IsDense(t)) {
    absl::StrAppend(&s, " | ", absl::StrJoin(t.strides.begin(), t.strides.begin() + t.rank, ", "));
  }
  return absl::StrCat(s, "]");
}

}  // namespace attnd::client
