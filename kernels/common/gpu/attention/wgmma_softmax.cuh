// The online softmax of the warpgroup-MMA attention kernels, written once (CUDA; sm_90a only in
// use): kernels/sparse_mla/gpu/wgmma.cuh (whose body mla_decode's wgmma kernel shares) and
// kernels/mla_prefill/gpu/wgmma.cuh. A thread of a wgmma m64nN accumulator holds rows r and r + 8
// (r = 16·warp + lane / 4), columns 8j + 2(lane % 4) + 0..1 of each; a row's max and sum go over
// the quad of lanes that hold it (shuffles xor 1, 2). Scores are raw Q·Kᵀ values; the kernels
// fold sm_scale·log2(e) in (`scale_log2`) and work in log2 units (docs/KERNELS.md).
//   float mx[2] = ...;  // this thread's maxima of the masked scores of its two rows
//   WgmmaSoftmaxStep(s, mx, a.scale_log2, m_run, l_run, alpha);  // P in place of S
//   WgmmaPackP<kSteps, kExactP>(s, p_hi, p_lo);                  // P as P·V A fragments
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/common/gpu/attention/wgmma_softmax.cuh is CUDA-only"
#endif

#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/mma_sync.cuh"
#include "kernels/common/gpu/vendor.h"

namespace attnd::kernels {

// One online-softmax step of a thread's two rows over a tile of kN / 2 columns each: `mx` holds
// this thread's maxima of the tile's (already masked: -inf) scores of row r and r + 8 and becomes
// the rows' maxima. The running max m_run (log2 units, from kInitialMax) moves to
// max(m_run, mx · scale_log2); alpha = exp2(m_old - m_new) is the factor of the earlier O and of
// l_run, this thread's share of the row sums, to which the tile's P is then added; P =
// exp2(s · scale_log2 - m_new) replaces s (masked scores give exactly 0). scale_log2 by reference:
// callers pass their argument block's field, and the kernels' PTX stayed what it was when the
// step was written inline in each of them.
// kLazyMax: the running max moves only when the tile's max passes it by more than
// kLazyMaxSlack (log2 units), so P may reach 2^kLazyMaxSlack and alpha is exactly 1 on most
// tiles (callers may then skip the O rescale); O / l and the LSE are the same in exact
// arithmetic, and P's bf16 rounding is relative. FAST only (docs/KERNELS.md).
// WgmmaSoftmaxStepFrom: the same step with the new running max taken from `m_from` (>= m_run)
// instead of m_run, i.e. max(m_from, tile max) (lazily: m_from unless the tile passes it by more
// than the slack), while alpha = exp2(m_run - m_new) still scales this thread's own O and l_run:
// the ping-pong kernel (kernels/sparse_mla/gpu/wgmma_pp.cuh), whose second warpgroup starts from
// the first one's max of the same pair. WgmmaSoftmaxStep is it with m_from = m_run.
constexpr float kLazyMaxSlack = 8.0f;
template <int kN, bool kLazyMax = false>
__device__ __forceinline__ void WgmmaSoftmaxStepFrom(float (&s)[kN], float (&mx)[2],
                                                     const float& scale_log2,
                                                     const float (&m_from)[2], float (&m_run)[2],
                                                     float (&l_run)[2], float (&alpha)[2]) {
  static_assert(kN % 4 == 0, "an accumulator of whole n8 column groups");
  float neg_m[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], ::attnd::gpu::ShflXor(mx[i], 1));
    mx[i] = fmaxf(mx[i], ::attnd::gpu::ShflXor(mx[i], 2));
    const float m_tile = mx[i] * scale_log2;
    float m_new = fmaxf(m_from[i], m_tile);
    if constexpr (kLazyMax) m_new = m_tile - m_from[i] > kLazyMaxSlack ? m_new : m_from[i];
    alpha[i] = ::attnd::gpu::ptx::Exp2(m_run[i] - m_new);
    m_run[i] = m_new;
    neg_m[i] = -m_new;
    l_run[i] *= alpha[i];
  }
#pragma unroll
  for (int j = 0; j < kN / 4; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pe = ::attnd::gpu::ptx::Exp2(fmaf(s[4 * j + e], scale_log2, neg_m[e >> 1]));
      s[4 * j + e] = pe;
      l_run[e >> 1] += pe;
    }
  }
}
template <int kN, bool kLazyMax = false>
__device__ __forceinline__ void WgmmaSoftmaxStep(float (&s)[kN], float (&mx)[2],
                                                 const float& scale_log2, float (&m_run)[2],
                                                 float (&l_run)[2], float (&alpha)[2]) {
  WgmmaSoftmaxStepFrom<kN, kLazyMax>(s, mx, scale_log2, m_run, m_run, l_run, alpha);
}

// P (f32, accumulator layout, kSteps k16 steps of keys) as the A fragments of P·V with A in
// registers: k-step kk is accumulator registers 8kk .. 8kk + 7 packed pairwise to bf16x2 (the
// layouts coincide). HIGH (kExactP): hi = bf16(P) and lo = bf16(P - hi), |P - hi - lo| <=
// 2^-16·P; FAST: hi only, P rounded once (lo untouched). docs/ACCURACY.md has the bounds.
template <int kSteps, bool kExactP>
__device__ __forceinline__ void WgmmaPackP(const float (&s)[8 * kSteps], uint32_t (&hi)[kSteps][4],
                                           uint32_t (&lo)[kSteps][4]) {
  using ::attnd::gpu::ptx::PackBf16x2;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float x0 = s[8 * kk + 2 * q], x1 = s[8 * kk + 2 * q + 1];
      const uint32_t h = PackBf16x2(x0, x1);
      hi[kk][q] = h;
      if constexpr (kExactP) {
        lo[kk][q] =
            PackBf16x2(x0 - ::attnd::gpu::ptx::Bf16Lo(h), x1 - ::attnd::gpu::ptx::Bf16Hi(h));
      }
    }
  }
}

}  // namespace attnd::kernels
