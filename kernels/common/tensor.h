// Tensor: a non-owning strided view (pointer, dtype, shape, strides in elements) that every
// operator's params are made of, plus the checks each Validate() uses. Row-major; the last
// dimension must be contiguous; leading strides may exceed the dense ones (a strided cache view).
//   ATTND_RETURN_IF_ERROR(CheckTensor(p.q, "q", DType::kFp8E4M3, {kAnyDim, h, d}));
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "kernels/common/dtype.h"

namespace attnd::kernels {

inline constexpr int kMaxRank = 5;
inline constexpr int64_t kAnyDim = -1;  // shape wildcard in CheckTensor

// How an operator uses a tensor; Params::ForEachTensor reports it so generic code (the test
// harness, the server's tensor resolution, GPU mirroring) can walk any op's tensors.
enum class Role { kInput, kOutput };

// Base of every params struct: gives it ForEachTensor(f), which calls f(name, tensor, role) for
// each tensor field in the order the struct lists them, once, in a static Tensors(self, f)
// (Tensor& on mutable params, const Tensor& on const ones). Names are the proto's field names.
//   struct Params : WithTensors<Params> {
//     Tensor q, out;
//     template <class Self, class F>
//     static void Tensors(Self& self, F& f) {
//       f("q", self.q, Role::kInput);
//       f("out", self.out, Role::kOutput);
//     }
//   };
template <class P>
struct WithTensors {
  template <class F>
  void ForEachTensor(F&& f) {
    P::Tensors(static_cast<P&>(*this), f);
  }
  template <class F>
  void ForEachTensor(F&& f) const {
    P::Tensors(static_cast<const P&>(*this), f);
  }
};

struct Tensor {
  void* data = nullptr;  // not owned; may be null only when the tensor has no elements
  DType dtype = DType::kInvalid;
  int rank = 0;  // 0 means "absent" for optional tensors
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> strides{};  // in elements

  bool present() const { return rank > 0; }
  int64_t dim(int i) const { return shape[i]; }
  int64_t stride(int i) const { return strides[i]; }
  int64_t numel() const;  // product of shape; callers validated it fits
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // The address `offset` elements past data, or null when the tensor has no elements: its data
  // may then be null, and nullptr + offset is undefined behaviour even when nothing is read.
  // Index a row of a tensor that a request may send empty with this, not ptr<T>() + offset.
  template <class T>
  T* ptr_at(int64_t offset) const {
    return numel() == 0 ? nullptr : static_cast<T*>(data) + offset;
  }
};

// A dense row-major view of `data` with the given shape.
Tensor MakeTensor(void* data, DType dtype, std::initializer_list<int64_t> shape);
Tensor MakeTensor(void* data, DType dtype, const int64_t* shape, int rank);
// The same, with explicit strides (elements).
Tensor MakeStridedTensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                         std::initializer_list<int64_t> strides);

// Checks dtype, rank, each dimension (kAnyDim accepts any >= 0), non-negative strides, a
// contiguous last dimension, leading strides at least as large as the data below them, that the
// element span fits in int64, and a non-null pointer when the tensor has elements. Messages name
// the tensor and the dimension with both values: "q: dim 2 is 575, want 576"; the field at fault
// is also a payload of the status ("q.shape[2]", "q.dtype", "q.strides[1]", "q.shape" for the
// rank, "q" otherwise; kernels/common/status_details.h BadField).
absl::Status CheckTensor(const Tensor& t, absl::string_view name, DType dtype,
                         std::initializer_list<int64_t> shape);

// Like CheckTensor but the tensor may be absent (rank 0).
absl::Status CheckOptionalTensor(const Tensor& t, absl::string_view name, DType dtype,
                                 std::initializer_list<int64_t> shape);

// Like CheckTensor, but the strides may come in any order and the last dimension need not be
// contiguous (a transposed or padded view of the caller's own buffer: an lse written as [T, H]
// into the caller's [H, T]). No two elements may share an address; the check for that is
// sufficient, not exact (docs/CONTRACTS.md "Strided lse"): over the dimensions longer than 1,
// taken by increasing stride, each stride must be at least the span of those before it (1 for
// the first). Only for tensors whose op writes through every stride; every other tensor keeps
// CheckTensor's row-major rule.
absl::Status CheckStridedTensor(const Tensor& t, absl::string_view name, DType dtype,
                                std::initializer_list<int64_t> shape);
absl::Status CheckOptionalStridedTensor(const Tensor& t, absl::string_view name, DType dtype,
                                        std::initializer_list<int64_t> shape);

// Number of elements from the first to one past the last addressed element (0 when empty);
// callers have run CheckTensor, which guarantees it does not overflow.
int64_t SpanElements(const Tensor& t);
// The same in bytes, or an error when it overflows int64.
absl::Status SpanBytes(const Tensor& t, int64_t* bytes);

// Overflow-checked arithmetic for sizes that come from requests.
bool MulOverflow(int64_t a, int64_t b, int64_t* out);
bool AddOverflow(int64_t a, int64_t b, int64_t* out);

}  // namespace attnd::kernels
