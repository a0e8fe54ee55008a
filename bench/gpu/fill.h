// Launchers of the device-side random fills used by DeviceArena (bench only).
#pragma once

#include <stdint.h>

#include "kernels/common/gpu/vendor.h"

namespace attnd::bench {

// dtype: 1 f32, 2 bf16, 3 fp8 e4m3 (kernels::DType numbering).
gpu::Error LaunchFill(void* out, int dtype, int64_t n, float scale, uint64_t seed,
                      gpu::Stream stream);
gpu::Error LaunchFillInt(int32_t* out, int64_t n, int32_t lo, int32_t hi, uint64_t seed,
                         gpu::Stream stream);
// Sets the first `words` 32-bit words of each of `rows` rows, `pitch` bytes apart (a multiple
// of 4, as is `base`), to `value`.
gpu::Error LaunchFillRows32(void* base, int64_t pitch, int64_t words, int64_t rows, uint32_t value,
                            gpu::Stream stream);

}  // namespace attnd::bench
