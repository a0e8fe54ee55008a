#include "client/attnctl/fill.h"

#include <cmath>
#include <cstring>

#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"

namespace attnd::attnctl {
namespace {

// Calls fn(element offset) for every logical element of t.
template <class F>
void ForEachOffset(const kernels::Tensor& t, F&& fn) {
  if (!t.present() || t.data == nullptr) return;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) return;
  }
  int64_t index[kernels::kMaxRank] = {};
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < t.rank; ++d) off += index[d] * t.strides[d];
    fn(off);
    int d = t.rank - 1;
    while (d >= 0 && ++index[d] == t.shape[d]) index[d--] = 0;
    if (d < 0) return;
  }
}

void Store(const kernels::Tensor& t, int64_t off, double v) {
  switch (t.dtype) {
    case kernels::DType::kF32: t.ptr<float>()[off] = static_cast<float>(v); break;
    case kernels::DType::kBF16:
      t.ptr<uint16_t>()[off] = kernels::FloatToBf16(static_cast<float>(v));
      break;
    case kernels::DType::kFp8E4M3:
      t.ptr<uint8_t>()[off] = kernels::FloatToFp8E4M3(static_cast<float>(v));
      break;
    case kernels::DType::kI32: t.ptr<int32_t>()[off] = static_cast<int32_t>(std::lround(v)); break;
    case kernels::DType::kU8: t.ptr<uint8_t>()[off] = static_cast<uint8_t>(std::lround(v)); break;
    case kernels::DType::kInvalid: break;
  }
}

}  // namespace

void FillNormal(const kernels::Tensor& t, Rng& rng, double stddev) {
  std::normal_distribution<double> dist(0.0, stddev);
  ForEachOffset(t, [&](int64_t off) { Store(t, off, dist(rng)); });
}

void FillUniform(const kernels::Tensor& t, Rng& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  ForEachOffset(t, [&](int64_t off) { Store(t, off, dist(rng)); });
}

void FillInt(const kernels::Tensor& t, Rng& rng, int64_t lo, int64_t hi) {
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  ForEachOffset(t, [&](int64_t off) { Store(t, off, static_cast<double>(dist(rng))); });
}

void Poison(const kernels::Tensor& t) {
  if (!t.present() || t.data == nullptr) return;
  const int64_t bytes = kernels::SpanElements(t) * kernels::DTypeSize(t.dtype);
  int byte = 0x7f;
  if (t.dtype == kernels::DType::kF32 || t.dtype == kernels::DType::kBF16) byte = 0xff;
  std::memset(t.data, byte, static_cast<size_t>(bytes));
}

}  // namespace attnd::attnctl
