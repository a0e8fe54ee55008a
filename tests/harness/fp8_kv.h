// Random rows of sparse MLA's FP8 KV cache (kernels/sparse_mla/params.h: 512 e4m3 codes, 4 f32
// scales, 64 bf16 rope per 656-byte row) for the tests of every op that takes that cache, and
// the bf16 values the GPU kernels compute from it.
//   FillFp8Row(kv.data<uint8_t>() + r * row_stride, rng, /*pow2_scales=*/true);
#pragma once

#include <cstdint>
#include <random>

#include "kernels/common/bf16.h"
#include "kernels/common/tensor.h"
#include "tests/harness/host_tensor.h"

namespace attnd::testing {

// Fills row `row` (656 bytes) of an FP8 cache with random codes (never NaN; per 128-column tile
// either N(0, 64) quantised to e4m3 with 4% random subnormal codes and a scale in [2^-9, 2^-4),
// or, a quarter of the tiles, N(0, 1/64) quantised (mostly subnormals) with a scale in
// [2^2, 2^7)), powers of two when pow2_scales, and bf16 N(0, 1) rope.
void FillFp8Row(uint8_t* row, std::mt19937_64& rng, bool pow2_scales);

// A dense bf16 [S, 576] copy of an FP8 cache whose values are what the GPU kernels compute in
// shared memory: e4m3 × scale in f32, rounded to bf16 (exact for power-of-two scales).
HostTensor Fp8KvAsBf16(const kernels::Tensor& kv);

// The per-tensor FP8 MLA cache (docs/CONTRACTS.md "Per-tensor FP8 KV cache") written the way
// vLLM's cache writer does for kv_cache_dtype "fp8" (concat_and_cache_mla, docs/CONTRACTS.md
// names the version): the row is the latent kv_c (512) followed by the rope k_pe (64, or none
// for GLM-5.3-Flash), each bf16 element x becomes the e4m3fn code of f32(x) / scale, rounded to
// nearest even and saturated to ±448 (PTX cvt.rn.satfinite), one scale for the whole cache.
// `src` holds `n` bf16 values (kv_c then k_pe), `dst` receives n codes.
void QuantizeMlaRowPerTensor(const kernels::bf16_t* src, int64_t n, float scale, uint8_t* dst);

// A bf16 source row for it: N(0, 1) values, with 4% of them tiny (|x / scale| in the e4m3
// subnormal range) and 1% large (|x / scale| past 448: saturated), so both ends of the
// conversion matter.
void FillMlaSourceRow(kernels::bf16_t* row, int64_t n, float scale, std::mt19937_64& rng);

// A dense bf16 [S, W] copy of a per-tensor FP8 cache u8 [S, W]: e4m3 × scale in f32 rounded to
// bf16, what the GPU kernels compute in shared memory (exact for power-of-two scales).
HostTensor Fp8PerTensorKvAsBf16(const kernels::Tensor& kv, float scale);

}  // namespace attnd::testing
