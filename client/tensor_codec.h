// Conversions between attnd.v1.Tensor and host memory: dtypes, layouts (shape, strides in
// elements) and inline bytes, which are exactly the tensor's span (first to one past the last
// addressed element; docs/SERVICE.md "Tensors"). HostArray is an owning, 64-byte-aligned host
// tensor.
//   HostArray q = HostArray::Dense(DType::kBF16, {t, h, 576});
//   ATTND_RETURN_IF_ERROR(EncodeInline(q.view(), "q", request.mutable_q()));
//   ATTND_ASSIGN_OR_RETURN(HostArray out, DecodeInline(reply.out(), "out"));
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnd/v1/attention.pb.h"
#include "kernels/common/tensor.h"

namespace attnd::client {

using kernels::DType;

// attnd.v1.DType <-> kernels::DType (numbered alike). FromProtoDType answers INVALID_ARGUMENT
// naming `name` for DTYPE_UNSPECIFIED and unknown values.
v1::DType ToProtoDType(DType dtype);
absl::StatusOr<DType> FromProtoDType(int proto_dtype, absl::string_view name);

// An owning host tensor: 64-byte-aligned storage of exactly the view's span. Move-only.
class HostArray {
 public:
  HostArray() = default;
  // Dense row-major. Dims must be >= 0 and the size must fit in memory (else an empty array).
  static HostArray Dense(DType dtype, const std::vector<int64_t>& shape);
  // Explicit strides in elements (the last must be 1 unless that dim is <= 1).
  static HostArray Strided(DType dtype, const std::vector<int64_t>& shape,
                           const std::vector<int64_t>& strides);
  // Owns a copy of the span of `view` (same layout).
  static HostArray CopyOf(const kernels::Tensor& view);

  const kernels::Tensor& view() const { return view_; }
  kernels::Tensor& view() { return view_; }
  void* data() const { return view_.data; }
  uint64_t span_bytes() const { return bytes_; }
  bool present() const { return view_.present(); }

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeDeleter> storage_;
  uint64_t bytes_ = 0;
  kernels::Tensor view_;
};

// True when `t`'s strides are the dense row-major ones (dims of size 1 ignored).
bool IsDense(const kernels::Tensor& t);

// Bytes from the first to one past the last addressed element of a view; INVALID_ARGUMENT
// naming `name` when it overflows or the view has negative dims or strides.
absl::StatusOr<uint64_t> SpanBytesOf(const kernels::Tensor& t, absl::string_view name);

// Writes dtype and shape, and strides only when they are not dense.
void SetLayout(const kernels::Tensor& t, v1::Tensor* out);

// Layout plus the span bytes as inline_data (one copy).
absl::Status EncodeInline(const kernels::Tensor& t, absl::string_view name, v1::Tensor* out);

// Layout plus a RegionSlice: the tensor's first element is `offset` bytes into `region`.
void EncodeRegion(const kernels::Tensor& t, const std::string& region, uint64_t offset,
                  v1::Tensor* out);

// The layout a proto tensor describes (data pointer null) and its span in bytes; the same
// checks as the server: rank 1..kMaxRank, dims and strides >= 0, strides empty or one per dim,
// no int64 overflow.
absl::StatusOr<kernels::Tensor> LayoutOf(const v1::Tensor& t, absl::string_view name,
                                         uint64_t* span_bytes);

// An owning copy of an inline proto tensor; INVALID_ARGUMENT when it has no inline data or the
// data is not exactly its span.
absl::StatusOr<HostArray> DecodeInline(const v1::Tensor& t, absl::string_view name);

// Copies an inline proto tensor into `dest` (host memory): dtype and shape must match; the
// strides may differ (copied row by row along the contiguous last dim).
absl::Status CopyInlineInto(const v1::Tensor& t, absl::string_view name,
                            const kernels::Tensor& dest);

// Copies the elements of `src` into `dest` (same dtype and shape; strides may differ).
absl::Status CopyTensor(const kernels::Tensor& src, const kernels::Tensor& dest,
                        absl::string_view name);

// "bf16[64, 16, 512]" (with strides when not dense: "bf16[64, 16, 512 | 9216, 576, 1]").
std::string DescribeTensor(const kernels::Tensor& t);

}  // namespace attnd::client
