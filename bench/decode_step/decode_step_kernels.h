// The C++ decode-step frontend's own small CUDA kernels (bench/decode_step/decode_step_cpp.cc):
// deterministic fills of the model's tensors, the per-layer producer (the stand-in for the
// projections) and consumer. Every function only enqueues on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace attnd::bench::decode_step {

// bf16 values N-ish(0, scale) from a counter hash (not a statistics-grade generator).
void FillBf16(uint16_t* p, int64_t n, float scale, uint64_t seed, cudaStream_t stream);
void FillF32(float* p, int64_t n, float scale, uint64_t seed, cudaStream_t stream);
// e4m3 codes of magnitude <= 7.5 (never NaN).
void FillFp8(uint8_t* p, int64_t n, uint64_t seed, cudaStream_t stream);
void FillValue(uint16_t* p, int64_t n, uint16_t bits, cudaStream_t stream);  // bf16 bits
void FillI32(int32_t* p, int64_t n, int32_t v, cudaStream_t stream);
// The 656-byte FP8 KV rows (docs/CONTRACTS.md FLASHMLA_FP8_656): 512 e4m3 codes, 4 f32 scales
// (powers of two 2^-9..2^-5), 64 bf16 rope values.
void FillKvFp8(uint8_t* kv, int64_t rows, uint64_t seed, cudaStream_t stream);
// The paged indexer cache: per block, block_size e4m3 keys of dim bytes, then block_size f32
// scales in [0.5, 2).
void FillIndexCache(uint8_t* cache, int64_t blocks, int64_t block_size, int64_t dim, uint64_t seed,
                    cudaStream_t stream);

// Producer of layer l: q[:, :, :512] = q_base[:, :, :512] + acc / 64 (the rest of q_base copied),
// index_q = index_q_base. rows = T·H, d_qk >= 512.
void Produce(uint16_t* q, const uint16_t* q_base, const uint16_t* acc, int64_t rows, int64_t d_qk,
             uint8_t* index_q, const uint8_t* index_q_base, int64_t index_bytes,
             cudaStream_t stream);
// Consumer of layer l: acc = acc + (out - acc) / 2, bf16, n elements.
void Consume(uint16_t* acc, const uint16_t* out, int64_t n, cudaStream_t stream);

}  // namespace attnd::bench::decode_step
