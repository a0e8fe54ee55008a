// CUDA-only (sm_80+) PTX wrappers for the tensor-core kernels built on mma.sync (attention and
// the indexer): 16- and 4-byte cp.async with zero fill, ldmatrix (x2, x4, transposed), bf16 and
// f16 m16n8k16 mma with f32 accumulation, e4m3x2 -> f16x2, bf16x2 packing and the hi + lo split
// of a float, ex2, and the XOR swizzle of 16-byte chunks that makes ldmatrix and cp.async on
// row-major tiles bank-conflict free.
//   CpAsync16(SmemAddr(dst), src, ok);  CpAsyncCommit();  CpAsyncWait<0>();
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/common/gpu/mma_sync.cuh is CUDA-only"
#endif

#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/common/gpu/convert.cuh"

namespace attnd::gpu::ptx {

// Shared-memory address (the 32-bit .shared window) of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes global -> shared asynchronously (bypassing L1) when `valid`; otherwise writes
// 16 zero bytes and reads nothing (src-size 0), so `src` only has to be some mapped, 16-byte
// aligned address. kL2Prefetch 128: the L2 also fetches the rest of the 128-byte line (the
// attention kernels, which read whole rows); 0: no hint (the indexer).
template <int kL2Prefetch = 128>
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  static_assert(kL2Prefetch == 128 || kL2Prefetch == 0, "L2 prefetch: 128 bytes or none");
  if constexpr (kL2Prefetch == 128) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
  }
}

// 4 bytes global -> shared (through L1); zero fill and no read when !valid (src must still be a
// mapped, 4-byte aligned address).
__device__ __forceinline__ void CpAsync4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ldmatrix: lane l supplies the address of row l % 8 of matrix l / 8 (x2: lanes 0..15 matter);
// r[i] receives matrix i as this lane's row l / 4, columns 2·(l % 4) and +1 (two b16 values).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void LdMatrixX2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr)
               : "memory");
}
// Transposed: r[i] holds matrix i's rows 2·(l % 4) and +1 at column l / 4.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// d += A (16x16 bf16, row-major) · B (16x8 bf16, "col": B[k][n]) in f32. Fragments, with
// g = lane / 4 and c = 2·(lane % 4): a[0] = A[g][c..c+1], a[1] = A[g+8][c..c+1],
// a[2] = A[g][c+8..c+9], a[3] = A[g+8][c+8..c+9]; b[0] = B[c..c+1][g], b[1] = B[c+8..c+9][g];
// d[0..1] = D[g][c..c+1], d[2..3] = D[g+8][c..c+1]. (An m16n8 accumulator pair over columns
// 8j..8j+15 is, packed to bf16, exactly the A fragment of k-step j: the FlashAttention-2 trick.)
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// acc += A · B for one m16n8k16 tile in f16: A 16x16 row-major fragment (a[4]), B 16x8
// column-major fragment (b0, b1), f32 accumulators (acc[4]); the fragment layouts of MmaBf16.
__device__ __forceinline__ void MmaF16(float acc[4], const uint32_t a[4], uint32_t b0,
                                       uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two e4m3fn codes (low byte -> low half) to f16x2, exactly (every e4m3 value is an f16 value):
// the hardware conversion on sm_89+, the table-free decode of convert.cuh before.
__device__ __forceinline__ uint32_t Fp8x2ToHalf2(uint32_t two_codes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t out;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(out) : "h"(static_cast<uint16_t>(two_codes)));
  return out;
#else
  const __half2 h = __floats2half2_rn(::attnd::gpu::Fp8E4M3ToFloat(two_codes & 0xff),
                                      ::attnd::gpu::Fp8E4M3ToFloat((two_codes >> 8) & 0xff));
  return *reinterpret_cast<const uint32_t*>(&h);
#endif
}

// Two floats as bf16x2 (round to nearest even): lo in bits 0..15, hi in bits 16..31.
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float Bf16Lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float Bf16Hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// x0, x1 as two bf16x2 terms: *hi = bf16(x), *lo = bf16(x - hi), so |x - hi - lo| <= 2^-16·|x|
// (for the probabilities of a softmax, x in [0, 1]). P·V as hi·V + lo·V keeps f32-path accuracy
// where bf16 P alone would cost up to 2^-9 relative per weight.
__device__ __forceinline__ void SplitBf16x2(float x0, float x1, uint32_t* hi, uint32_t* lo) {
  *hi = PackBf16x2(x0, x1);
  *lo = PackBf16x2(x0 - Bf16Lo(*hi), x1 - Bf16Hi(*hi));
}

// 2^x (MUFU.EX2, ~2 ulp; -inf -> +0, subnormal results flushed to 0).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a row-major shared tile whose rows are a
// multiple of 128 bytes: within each 128-byte segment the chunk index is XORed with row % 8, so
// one logical chunk of 8 consecutive rows falls in 8 different bank groups.
__device__ __forceinline__ uint32_t Swizzle(int row, int chunk, int row_bytes) {
  return static_cast<uint32_t>(row * row_bytes + ((chunk ^ (row & 7)) << 4));
}

}  // namespace attnd::gpu::ptx
