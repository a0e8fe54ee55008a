// The PTX the indexer's tensor-core kernel uses (CUDA only, sm_80+): 16-B and 4-B cp.async with
// zero fill, e4m3x2 → f16x2 (exact), and mma.sync m16n8k16 f16 × f16 + f32.
//   CpAsync16(dst, src, valid);  CpAsyncCommit();  CpAsyncWait<1>();
//   MmaF16(acc, a, b0, b1);  // acc[4] += A(16×16) · B(16×8)
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/indexer_logits/gpu/ptx.cuh is CUDA only"
#endif

#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/common/gpu/convert.cuh"

namespace attnd::kernels::indexer_logits::gpu {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared, bypassing L1; when !valid nothing is read and dst is zeroed (src
// must still be a mapped, 16-B aligned address).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// 4 bytes global → shared; zero fill when !valid (src must still be 4-B aligned).
__device__ __forceinline__ void CpAsync4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SharedAddress(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Two e4m3fn codes (low byte → low half) to f16x2, exactly (every e4m3 value is an f16 value).
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

// acc += A · B for one m16n8k16 tile: A 16×16 f16 row-major fragment (a[4]), B 16×8 f16
// column-major fragment (b0, b1), f32 accumulators (acc[4]); PTX ISA fragment layouts.
__device__ __forceinline__ void MmaF16(float acc[4], const uint32_t a[4], uint32_t b0,
                                       uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace attnd::kernels::indexer_logits::gpu
