// Device pieces the attention kernels share (kernels/{mla_decode,mla_prefill,sparse_mla}/gpu,
// portable CUDA/HIP): 64-bit min/max, the SIMT bf16 dot product, max and sum over an aligned group
// of lanes (the online softmax's row max and sum), and the CTA shape of the mma.sync kernels
// (names as in kernels/common/gpu/tiles.h).
//   const float m_new = fmaxf(m_run, GroupMax<16>(fmaxf(x0, x1)));
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/convert.cuh"
#include "kernels/common/gpu/vendor.h"

namespace attnd::kernels {

// The running max starts finite so that exp2(m_old - m_new) never sees inf - inf; masked scores
// are -inf and contribute exp2(-inf) = 0.
inline constexpr float kInitialMax = -1e30f;

__host__ __device__ __forceinline__ int64_t Min64(int64_t x, int64_t y) { return x < y ? x : y; }
__host__ __device__ __forceinline__ int64_t Max64(int64_t x, int64_t y) { return x > y ? x : y; }

// Σ over 8 bf16 pairs of q·k, accumulated into acc in f32 (bf16 -> f32 is exact).
__device__ __forceinline__ float Dot8(const uint4& q, const uint4& k, float acc) {
  const uint32_t qw[4] = {q.x, q.y, q.z, q.w}, kw[4] = {k.x, k.y, k.z, k.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(::attnd::gpu::BitsToFloat(qw[i] << 16), ::attnd::gpu::BitsToFloat(kw[i] << 16), acc);
    acc = fmaf(::attnd::gpu::BitsToFloat(qw[i] & 0xffff0000u),
               ::attnd::gpu::BitsToFloat(kw[i] & 0xffff0000u), acc);
  }
  return acc;
}

// Max and sum over an aligned group of kLanes lanes (a power of two, at most a warp).
template <int kLanes>
__device__ __forceinline__ float GroupMax(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o /= 2) v = fmaxf(v, ::attnd::gpu::ShflXor(v, o));
  return v;
}
template <int kLanes>
__device__ __forceinline__ float GroupSum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o /= 2) v += ::attnd::gpu::ShflXor(v, o);
  return v;
}

// The online-softmax step of the SIMT MLA kernels (mla_decode, mla_prefill gpu/simt.cu) for one
// tile of scores in shared memory, P [positions][p_stride] in log2 units: row `mr` is held by an
// aligned group of kRowThreads lanes, lane `mj` owning positions mj and mj + kRowThreads. Takes
// the row's running max and sum (every lane of the group keeps them) and returns them updated with
// alpha = exp2(m_old - m_new), the factor of the row's earlier output; writes P = exp2(x - m_new)
// back in place (a.exact_p false: rounded to bf16; the sum takes the unrounded P).
struct SoftmaxRow {
  float m, l, alpha;
};
template <int kRowThreads, class Args>
__device__ __forceinline__ SoftmaxRow SoftmaxTwoPositions(const Args& a, float* p_s, int p_stride,
                                                          int mr, int mj, float m_run,
                                                          float l_run) {
  const float x0 = p_s[mj * p_stride + mr], x1 = p_s[(mj + kRowThreads) * p_stride + mr];
  const float m_new = fmaxf(m_run, GroupMax<kRowThreads>(fmaxf(x0, x1)));
  const float alpha = exp2f(m_run - m_new);
  const float p0 = exp2f(x0 - m_new), p1 = exp2f(x1 - m_new);
  p_s[mj * p_stride + mr] =
      a.exact_p ? p0 : ::attnd::gpu::Bf16ToFloat(::attnd::gpu::FloatToBf16(p0));
  p_s[(mj + kRowThreads) * p_stride + mr] =
      a.exact_p ? p1 : ::attnd::gpu::Bf16ToFloat(::attnd::gpu::FloatToBf16(p1));
  return {m_new, l_run * alpha + GroupSum<kRowThreads>(p0 + p1), alpha};
}

// The CTA of the bf16 mma.sync attention kernels over 512-column V (mla_decode and sparse_mla
// gpu/mma.cuh): 8 warps, kMTiles m16 tiles of S and O rows, tiles of 64 KV rows of d_qk bf16
// columns, each warp owning 64 of O's 512 columns. A kernel's tile derives from it.
template <int kMTiles, int kDqk>
struct MmaSyncTile {
  static_assert(kMTiles == 1 || kMTiles == 2 || kMTiles == 4, "16, 32 or 64 rows per CTA");
  static_assert(kDqk == 512 || kDqk == 576, "d_qk 512 or 576");
  static constexpr int kThreads = 256;
  static constexpr int kWarps = 8;
  static constexpr int kBlockM = 16 * kMTiles;                 // rows of S and O
  static constexpr int kBlockN = 64;                           // KV rows per tile
  static constexpr int kKvRowBytes = kDqk * 2;                 // a KV row in shared memory
  static constexpr int kKvChunks = kDqk / 8;                   // its 16-B chunks
  static constexpr int kKvStageBytes = kBlockN * kKvRowBytes;  // one KV tile
  static constexpr int kPRowBytes = kBlockN * 2;               // a bf16 P row
  static constexpr int kOTiles = 512 / kWarps / 8;             // n8 tiles of O per warp (8)
};

}  // namespace attnd::kernels
