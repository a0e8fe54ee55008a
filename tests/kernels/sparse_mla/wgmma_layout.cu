// One-warpgroup products through the wgmma PTX layer (see wgmma_layout.h).
#include "tests/kernels/sparse_mla/wgmma_layout.h"

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/common/gpu/wgmma.cuh"

namespace attnd::testing {
namespace {

constexpr int kRows = 64, kK = 576, kKSlabs = kK / 64, kV = 512, kVSlabs = kV / 64;
constexpr uint32_t kSlab = 64 * 128;
[[maybe_unused]] constexpr uint32_t kAOff = 0, kBOff = kKSlabs * kSlab;
constexpr uint32_t kPOff = 2 * kKSlabs * kSlab;
constexpr uint32_t kVOff = kPOff + kSlab;
constexpr int kSmem = static_cast<int>(kVOff + kVSlabs * kSlab);

__global__ void __launch_bounds__(128, 1)
    LayoutKernel(const uint16_t* a, const uint16_t* b, const uint16_t* p, const uint16_t* v,
                 float* s_out, float* o_out) {
#if ATTND_SM90A
  using namespace ::attnd::gpu::wgmma;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = SmemAddr(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Row-major [rows][cols] bf16 -> 64-column slabs of 128-byte swizzled rows.
  auto fill = [&](uint32_t off, const uint16_t* src, int cols) {
    const int chunks = cols / 8;
    for (int e = tid; e < kRows * chunks; e += 128) {
      const int r = e / chunks, c = e % chunks;
      *reinterpret_cast<uint4*>(smem + off + (c / 8) * kSlab + SwizzledOffset(r, c % 8)) =
          *reinterpret_cast<const uint4*>(src + r * cols + c * 8);
    }
  };
  fill(kAOff, a, kK);
  fill(kBOff, b, kK);
  fill(kPOff, p, kRows);
  fill(kVOff, v, kV);
  FenceProxyAsync();
  __syncthreads();
  const int r0 = 16 * warp + lane / 4, cq = 2 * (lane % 4);

  float s[32];
  uint64_t ad = SmemDescKMajor(base + kAOff), bd = SmemDescKMajor(base + kBOff);
  WgmmaFence();
  for (int sl = 0; sl < kKSlabs; ++sl) {
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t step = sl * kSlab + kk * 32;
      Wgmma<64, WgmmaA::kSmem>::Run<false>(s, DescAdvance(ad, step), DescAdvance(bd, step),
                                           sl + kk > 0);
    }
  }
  WgmmaCommit();
  WgmmaWait<0>();
  FenceAccumulators(s);
  for (int j = 0; j < 8; ++j) {
    for (int e = 0; e < 4; ++e) {
      s_out[(r0 + 8 * (e >> 1)) * kRows + 8 * j + cq + (e & 1)] = s[4 * j + e];
    }
  }

  float o[128];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint64_t vd = SmemDescMnMajor(base + kVOff + half * 4 * kSlab, kSlab);
    const uint64_t pd = SmemDescKMajor(base + kPOff);
    uint32_t frag[4][4];  // p as the A fragments of k-steps 0..3
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        frag[kk][q] = *reinterpret_cast<const uint32_t*>(p + (r0 + 8 * (q & 1)) * kRows + 16 * kk +
                                                         8 * (q >> 1) + cq);
      }
    }
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (half == 0) {
        Wgmma<256, WgmmaA::kRegs>::Run<true>(o, frag[kk], DescAdvance(vd, kk * 2048), kk > 0);
      } else {
        Wgmma<256, WgmmaA::kSmem>::Run<true>(o, DescAdvance(pd, kk * 32),
                                             DescAdvance(vd, kk * 2048), kk > 0);
      }
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceAccumulators(o);
    for (int j = 0; j < 32; ++j) {
      for (int e = 0; e < 4; ++e) {
        o_out[(r0 + 8 * (e >> 1)) * kV + 256 * half + 8 * j + cq + (e & 1)] = o[4 * j + e];
      }
    }
  }
#else
  __trap();
#endif
}

}  // namespace

int RunWgmmaLayoutCheck(const uint16_t* a, const uint16_t* b, const uint16_t* p, const uint16_t* v,
                        float* s, float* o) {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return -1;
  }
  if (major != 9 || minor != 0) return -1;
  const size_t in_bytes = 2 * (2 * kRows * kK + kRows * kRows + kRows * kV);
  const size_t out_bytes = 4 * (kRows * kRows + kRows * kV);
  char* buf = nullptr;
  cudaError_t e = cudaMalloc(&buf, in_bytes + out_bytes);
  if (e != cudaSuccess) return e;
  uint16_t* da = reinterpret_cast<uint16_t*>(buf);
  uint16_t* db = da + kRows * kK;
  uint16_t* dp = db + kRows * kK;
  uint16_t* dv = dp + kRows * kRows;
  float* ds = reinterpret_cast<float*>(buf + in_bytes);
  float* d_o = ds + kRows * kRows;
  cudaMemcpy(da, a, 2 * kRows * kK, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b, 2 * kRows * kK, cudaMemcpyHostToDevice);
  cudaMemcpy(dp, p, 2 * kRows * kRows, cudaMemcpyHostToDevice);
  cudaMemcpy(dv, v, 2 * kRows * kV, cudaMemcpyHostToDevice);
  e = cudaFuncSetAttribute(LayoutKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e == cudaSuccess) {
    LayoutKernel<<<1, 128, kSmem>>>(da, db, dp, dv, ds, d_o);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpy(s, ds, 4 * kRows * kRows, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(o, d_o, 4 * kRows * kV, cudaMemcpyDeviceToHost);
  cudaFree(buf);
  return e;
}

}  // namespace attnd::testing
