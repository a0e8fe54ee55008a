// Element types attnd's operators take and produce, and their sizes.
//   DType::kFp8E4M3 is OCP e4m3fn (no infinities, NaN = S.1111.111), what H200 and gfx950 use.
#pragma once

#include <cstdint>

namespace attnd::kernels {

enum class DType : uint8_t {
  kInvalid = 0,
  kF32 = 1,
  kBF16 = 2,
  kFp8E4M3 = 3,
  kI32 = 4,
  kU8 = 5,
};

constexpr int64_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kFp8E4M3: return 1;
    case DType::kI32: return 4;
    case DType::kU8: return 1;
    case DType::kInvalid: return 0;
  }
  return 0;
}

constexpr const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kFp8E4M3: return "fp8_e4m3";
    case DType::kI32: return "i32";
    case DType::kU8: return "u8";
    case DType::kInvalid: return "invalid";
  }
  return "invalid";
}

}  // namespace attnd::kernels
