#include "kernels/common/reference.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"

namespace attnd::kernels {

int64_t RefOffset(const Tensor& t, std::initializer_list<int64_t> index) {
  int64_t off = 0;
  int d = 0;
  for (int64_t i : index) off += i * t.strides[d++];
  return off;
}

double RefLoad(const Tensor& t, std::initializer_list<int64_t> index) {
  const int64_t off = RefOffset(t, index);
  switch (t.dtype) {
    case DType::kF32: return static_cast<const float*>(t.data)[off];
    case DType::kBF16: return Bf16ToFloat(static_cast<const uint16_t*>(t.data)[off]);
    case DType::kFp8E4M3: return Fp8E4M3ToFloat(static_cast<const uint8_t*>(t.data)[off]);
    case DType::kI32: return static_cast<const int32_t*>(t.data)[off];
    case DType::kU8: return static_cast<const uint8_t*>(t.data)[off];
    case DType::kInvalid: break;
  }
  return std::nan("");
}

void RefStore(const Tensor& t, std::initializer_list<int64_t> index, double v) {
  const int64_t off = RefOffset(t, index);
  switch (t.dtype) {
    case DType::kF32: static_cast<float*>(t.data)[off] = static_cast<float>(v); break;
    case DType::kBF16:
      static_cast<uint16_t*>(t.data)[off] = FloatToBf16(static_cast<float>(v));
      break;
    case DType::kI32: static_cast<int32_t*>(t.data)[off] = static_cast<int32_t>(v); break;
    default: break;
  }
}

double RefDecodeE4m3(uint8_t code) {
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  double v = exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                           : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  if (exponent == 0xf && mantissa == 0x7) v = std::numeric_limits<double>::quiet_NaN();
  return (code & 0x80) ? -v : v;
}

}  // namespace attnd::kernels
