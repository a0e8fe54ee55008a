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
// The tails of `rows` FP8 MLA cache rows at `kv` (kernels/sparse_mla/params.h: the codes, four
// f32 scales, the bf16 rope): every scale 2^-7 (a power of two, as quantisers write) or, with
// `f32_scales`, 0x3c3c3c3c (0.0115, not a bf16 value), every rope byte 0x3c (bf16 0.0115).
// Finite and non-zero (random bytes could be huge); the codes are left as they are.
gpu::Error LaunchFp8MlaRowTails(void* kv, int64_t rows, bool f32_scales, gpu::Stream stream);

}  // namespace attnd::bench
