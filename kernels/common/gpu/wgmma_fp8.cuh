// Hopper (sm_90a) FP8 additions to the warpgroup PTX layer of wgmma.cuh, CUDA-only: e4m3 x e4m3
// -> f32 wgmma m64nNk32 (N = 64, 128, 256; both operands from shared-memory descriptors, which
// for fp8 must be K-major), a 2-D TMA tile load and a plain bulk copy. Descriptors, fences, commit
// / wait, mbarriers and the rest come from wgmma.cuh; everything here compiles only where
// ATTND_SM90A is 1.
//   WgmmaFence();
//   for (int kk = 0; kk < 4; ++kk)  // k = 128 fp8 values = four k32 steps, 32 bytes apart
//     WgmmaFp8<256>::Run(d, DescAdvance(da, 32 * kk), DescAdvance(db, 32 * kk), kk > 0);
//   WgmmaCommit();  WgmmaWait<0>();  FenceAccumulators(d);
#pragma once

#include "kernels/common/gpu/wgmma.cuh"

namespace attnd::gpu::wgmma {

#if ATTND_SM90A

// D (64 x kN f32; accumulate ? D + A·B : A·B) with A 64 x 32 e4m3 and B 32 x kN e4m3, both
// K-major (32 consecutive bytes of a row per k32 step). The accumulator layout is the bf16
// one (wgmma.cuh): d[4j + 0..1] row 16·warp + lane/4, columns 8j + 2(lane%4) + 0..1;
// d[4j + 2..3] the same columns of row + 8. Issues only: fence before, commit after.
template <int kN>
struct WgmmaFp8;

#define ATTND_WGMMA_FP8_D8(i)                                                                 \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define ATTND_WGMMA_FP8_D32(i)                                                  \
  ATTND_WGMMA_FP8_D8(i), ATTND_WGMMA_FP8_D8(i + 8), ATTND_WGMMA_FP8_D8(i + 16), \
      ATTND_WGMMA_FP8_D8(i + 24)
#define ATTND_WGMMA_FP8_D64 ATTND_WGMMA_FP8_D32(0), ATTND_WGMMA_FP8_D32(32)
#define ATTND_WGMMA_FP8_D128 ATTND_WGMMA_FP8_D64, ATTND_WGMMA_FP8_D32(64), ATTND_WGMMA_FP8_D32(96)
// clang-format off
#define ATTND_WGMMA_FP8_P32                                                \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define ATTND_WGMMA_FP8_P64                                                                \
  ATTND_WGMMA_FP8_P32 ", "                                                                 \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "       \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define ATTND_WGMMA_FP8_P128                                                               \
  ATTND_WGMMA_FP8_P64 ", "                                                                 \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "       \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "       \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "   \
  "%125, %126, %127"
// clang-format on
// kN, the accumulator count, their placeholders and operands, then the placeholders of desc_a,
// desc_b and accumulate (strings: the preprocessor cannot add).
#define ATTND_WGMMA_FP8_SPECIALISATION(kN, kRegsN, P, D, R0, R1, R2)                         \
  template <>                                                                                \
  struct WgmmaFp8<kN> {                                                                      \
    static __device__ __forceinline__ void Run(float (&d)[kRegsN], uint64_t desc_a,          \
                                               uint64_t desc_b, bool accumulate) {           \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" R2                                   \
                   ", 0;\n"                                                                  \
                   "wgmma.mma_async.sync.aligned.m64n" #kN "k32.f32.e4m3.e4m3 {" P "}, %" R0 \
                   ", %" R1 ", p, 1, 1;\n}\n"                                                \
                   : D                                                                       \
                   : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));           \
    }                                                                                        \
  };
ATTND_WGMMA_FP8_SPECIALISATION(64, 32, ATTND_WGMMA_FP8_P32, ATTND_WGMMA_FP8_D32(0), "32", "33",
                               "34")
ATTND_WGMMA_FP8_SPECIALISATION(128, 64, ATTND_WGMMA_FP8_P64, ATTND_WGMMA_FP8_D64, "64", "65", "66")
ATTND_WGMMA_FP8_SPECIALISATION(256, 128, ATTND_WGMMA_FP8_P128, ATTND_WGMMA_FP8_D128, "128", "129",
                               "130")
#undef ATTND_WGMMA_FP8_SPECIALISATION
#undef ATTND_WGMMA_FP8_P128
#undef ATTND_WGMMA_FP8_P64
#undef ATTND_WGMMA_FP8_P32
#undef ATTND_WGMMA_FP8_D128
#undef ATTND_WGMMA_FP8_D64
#undef ATTND_WGMMA_FP8_D32
#undef ATTND_WGMMA_FP8_D8

// ---- TMA, 2-D tile load ----
// Loads the box of a 2-D tensor map at element coordinates (c0 innermost, c1) into shared
// memory at `dst` (1024-byte aligned for the 128-byte swizzle); the whole box's bytes complete
// on the transaction count of `bar`, its out-of-range part written as zeros.
// `tensor_map`: the generic address of a __grid_constant__ kernel parameter (CUtensorMap).
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const void* tensor_map, uint32_t bar,
                                          int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// ---- Bulk copy (non-tensor), global -> shared ----
// Copies `bytes` (a multiple of 16) from `src` (16-byte aligned, global) to shared memory at
// `dst` (16-byte aligned); the bytes complete on the transaction count of `bar`.
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

#endif  // ATTND_SM90A

}  // namespace attnd::gpu::wgmma
