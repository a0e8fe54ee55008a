// The tensor-core MLA prefill kernel (CUDA sm_80+, bf16 mma.sync m16n8k16, f32 accumulate),
// FlashAttention-2 style. A CTA (8 warps) takes 128 queries of one sequence and one head
// (schedule: common.cuh) and walks the keys the tile's last query sees in tiles of 64,
// double-buffered (cp.async, 16 B per thread; keys past what the tile sees are zero-filled by
// plain stores and never read; tiles past it are never loaded). Warp w owns queries
// 16w .. 16w+15 outright:
//   S = Q·Kᵀ  m16 x 64 over d_qk (Q and K from swizzled shared tiles by ldmatrix);
//   softmax   scaled to log2 units, -inf past each query's bottom-right causal limit (only on
//             tiles that cross it), online update in registers (quad shuffles), finite
//             initial max; a warp skips tiles wholly past its own queries' limits;
//   O += P·V  P = exp2(x - m) straight from the S accumulators as A fragments in bf16: HIGH
//             as two terms hi + lo (|P - hi - lo| <= 2^-16·P: f32-path accuracy), FAST
//             rounded once (half the MMAs; row sums take the unrounded P); V by
//             ldmatrix.trans; O m16 x d_v in registers.
// Instantiated in mma_d192.cu / mma_dims.cu; launched by mma.cu.
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/mla_prefill/gpu/mma.cuh is CUDA-only"
#endif

#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/mma_sync.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/mla_prefill/gpu/common.cuh"
#include "kernels/mla_prefill/gpu/plan.h"

namespace attnd::kernels::mla_prefill::gpu {

template <int kDqk, int kDv>
struct MmaTile {
  static_assert(kDqk % 64 == 0 && kDqk <= 256, "d_qk: 64, 128, 192 or 256 (128-B rows)");
  static_assert(kDv % 64 == 0 && kDv <= 256, "d_v: 64, 128, 192 or 256 (128-B rows)");
  static constexpr int kThreads = 256;
  static constexpr int kWarps = 8;
  static constexpr int kBlockM = 16 * kWarps;  // queries per CTA
  static constexpr int kBlockN = 64;           // keys per tile
  static constexpr int kQRowBytes = kDqk * 2;  // Q and K rows in shared memory
  static constexpr int kVRowBytes = kDv * 2;
  static constexpr int kQChunks = kDqk / 8;  // 16-B chunks per row
  static constexpr int kVChunks = kDv / 8;
  static constexpr int kKSteps = kDqk / 16;     // k16 steps of Q·Kᵀ
  static constexpr int kSTiles = kBlockN / 8;   // n8 tiles of S per warp
  static constexpr int kPSteps = kBlockN / 16;  // k16 steps of P·V
  static constexpr int kOTiles = kDv / 8;       // n8 tiles of O per warp
  // Shared memory (bytes): Q | K stage 0 | K stage 1 | V stage 0 | V stage 1.
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kBlockM * kQRowBytes;
  static constexpr int kKStageBytes = kBlockN * kQRowBytes;
  static constexpr int kVOffset = kKOffset + 2 * kKStageBytes;
  static constexpr int kVStageBytes = kBlockN * kVRowBytes;
  static constexpr int kSmemBytes = kVOffset + 2 * kVStageBytes;
};

// kExactP: Precision::kHigh (P·V as (P hi + P lo)·V); false: Precision::kFast (bf16 P).
template <int kDqk, int kDv, bool kExactP>
__global__ void __launch_bounds__(256, 1) MlaPrefillMmaKernel(const PrefillArgs a) {
  using T = MmaTile<kDqk, kDv>;
  using namespace ::attnd::gpu::ptx;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_s = SmemAddr(smem);
  const uint32_t q_s = smem_s + T::kQOffset;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, cq = lane % 4;  // fragment row; column pair 2·cq, 2·cq + 1
  const int64_t slot = blockIdx.x % a.slots, h = blockIdx.x / a.slots;
  int64_t b, tile;
  if (!FindTile(a, slot, &b, &tile)) return;
  const SeqRange s = SequenceRange(a, b);
  const int64_t row0 = tile * T::kBlockM;  // first query of the CTA, in the sequence
  const int nrows = static_cast<int>(Min64(T::kBlockM, s.lq - row0));
  const int64_t key_end = KeyLimit(a, row0 + nrows - 1, s.lq, s.lk);  // keys the CTA sees
  if (key_end == 0) {
    WriteEmptyRows(a, s.q0 + row0, nrows, h);  // nothing visible: no loads at all
    return;
  }
  const int64_t kvh = h / a.group;

  // Zero-fill of a 16-B shared chunk (shared address) by a plain store.
  auto zero16 = [&](uint32_t at) {
    *reinterpret_cast<uint4*>(smem + (at - smem_s)) = make_uint4(0, 0, 0, 0);
  };
  for (int i = tid; i < T::kBlockM * T::kQChunks; i += T::kThreads) {
    const int r = i / T::kQChunks, c = i % T::kQChunks;
    const uint32_t dst = q_s + Swizzle(r, c, T::kQRowBytes);
    if (r < nrows) {
      CpAsync16(dst, a.q + (s.q0 + row0 + r) * a.q_stride_t + h * a.q_stride_h + 8 * c, true);
    } else {
      zero16(dst);
    }
  }
  auto issue_tile = [&](int64_t k0, int stage) {
    const uint32_t k_st = smem_s + T::kKOffset + stage * T::kKStageBytes;
    const uint32_t v_st = smem_s + T::kVOffset + stage * T::kVStageBytes;
    for (int i = tid; i < T::kBlockN * T::kQChunks; i += T::kThreads) {
      const int j = i / T::kQChunks, c = i % T::kQChunks;
      const uint32_t dst = k_st + Swizzle(j, c, T::kQRowBytes);
      if (k0 + j < key_end) {
        CpAsync16(dst, a.k + (s.k0 + k0 + j) * a.k_stride_t + kvh * a.k_stride_h + 8 * c, true);
      } else {
        zero16(dst);
      }
    }
    for (int i = tid; i < T::kBlockN * T::kVChunks; i += T::kThreads) {
      const int j = i / T::kVChunks, c = i % T::kVChunks;
      const uint32_t dst = v_st + Swizzle(j, c, T::kVRowBytes);
      if (k0 + j < key_end) {
        CpAsync16(dst, a.v + (s.k0 + k0 + j) * a.v_stride_t + kvh * a.v_stride_h + 8 * c, true);
      } else {
        zero16(dst);
      }
    }
  };

  // This warp's queries: rows g and g + 8 of its m16 tile. Rows past nrows see nothing.
  const int wrow = 16 * warp;
  int64_t limit[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = wrow + g + 8 * hf;
    limit[hf] = r < nrows ? KeyLimit(a, row0 + r, s.lq, s.lk) : 0;
  }
  // Keys the warp needs at all, and from where any of its rows needs a mask (limits grow
  // with the query index; a partly filled warp masks everywhere).
  const int wlast = min(wrow + 15, nrows - 1);
  const int64_t warp_key_end = wrow < nrows ? KeyLimit(a, row0 + wlast, s.lq, s.lk) : 0;
  const int64_t warp_mask_from = wrow + 15 < nrows ? KeyLimit(a, row0 + wrow, s.lq, s.lk) : 0;

  float m_run[2] = {kInitialMax, kInitialMax}, l_part[2] = {0.0f, 0.0f};
  float o[T::kOTiles][4];
#pragma unroll
  for (int n = 0; n < T::kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  issue_tile(0, 0);
  CpAsyncCommit();
  const int64_t tiles = (key_end + T::kBlockN - 1) / T::kBlockN;
  for (int64_t it = 0; it < tiles; ++it) {
    const int stage = static_cast<int>(it & 1);
    CpAsyncWait<0>();
    __syncthreads();  // tile `it` (and Q) landed; every warp is done with tile it - 1
    if (it + 1 < tiles) {
      issue_tile((it + 1) * T::kBlockN, stage ^ 1);
      CpAsyncCommit();
    }
    const int64_t k0 = it * T::kBlockN;
    if (k0 >= warp_key_end) continue;  // warp-uniform: the whole tile is past its queries

    const uint32_t k_st = smem_s + T::kKOffset + stage * T::kKStageBytes;
    const uint32_t v_st = smem_s + T::kVOffset + stage * T::kVStageBytes;
    float sc[T::kSTiles][4];
#pragma unroll
    for (int n = 0; n < T::kSTiles; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll 2
    for (int ks = 0; ks < T::kKSteps; ++ks) {
      uint32_t af[4];
      LdMatrixX4(af, q_s + Swizzle(wrow + (lane & 15), 2 * ks + (lane >> 4), T::kQRowBytes));
#pragma unroll
      for (int np = 0; np < T::kSTiles / 2; ++np) {
        uint32_t r[4];
        const int key = 16 * np + (lane & 7) + ((lane >> 4) << 3);
        LdMatrixX4(r, k_st + Swizzle(key, 2 * ks + ((lane >> 3) & 1), T::kQRowBytes));
        const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
        MmaBf16(sc[2 * np], af, b0);
        MmaBf16(sc[2 * np + 1], af, b1);
      }
    }

    // Scale, mask where the tile crosses a limit, online softmax per row (quad shuffles).
    const bool mask = k0 + T::kBlockN > warp_mask_from;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < T::kSTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = sc[n][2 * hf + e];
          x *= a.scale_log2;
          if (mask && k0 + 8 * n + 2 * cq + e >= limit[hf]) x = -INFINITY;
          mx = fmaxf(mx, x);
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[hf], mx);
      const float alpha = Exp2(m_run[hf] - m_new);
      m_run[hf] = m_new;
      l_part[hf] *= alpha;
#pragma unroll
      for (int n = 0; n < T::kOTiles; ++n) {
        o[n][2 * hf] *= alpha;
        o[n][2 * hf + 1] *= alpha;
      }
#pragma unroll
      for (int n = 0; n < T::kSTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = sc[n][2 * hf + e];
          x = Exp2(x - m_new);
          l_part[hf] += x;
        }
      }
    }

    // O += P·V, P's k16 step kk = S n-tiles 2kk (keys +0..7) and 2kk + 1 (keys +8..15).
#pragma unroll
    for (int kk = 0; kk < T::kPSteps; ++kk) {
      uint32_t ahi[4], alo[4];
      if constexpr (kExactP) {  // HIGH: P = hi + lo
        SplitBf16x2(sc[2 * kk][0], sc[2 * kk][1], &ahi[0], &alo[0]);
        SplitBf16x2(sc[2 * kk][2], sc[2 * kk][3], &ahi[1], &alo[1]);
        SplitBf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1], &ahi[2], &alo[2]);
        SplitBf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3], &ahi[3], &alo[3]);
      } else {  // FAST: P rounded to bf16 once
        ahi[0] = PackBf16x2(sc[2 * kk][0], sc[2 * kk][1]);
        ahi[1] = PackBf16x2(sc[2 * kk][2], sc[2 * kk][3]);
        ahi[2] = PackBf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
        ahi[3] = PackBf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
      }
#pragma unroll
      for (int np = 0; np < T::kOTiles / 2; ++np) {
        uint32_t r[4];
        const int key = 16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3);
        LdMatrixX4Trans(r, v_st + Swizzle(key, 2 * np + (lane >> 4), T::kVRowBytes));
        const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
        MmaBf16(o[2 * np], ahi, b0);
        if constexpr (kExactP) MmaBf16(o[2 * np], alo, b0);
        MmaBf16(o[2 * np + 1], ahi, b1);
        if constexpr (kExactP) MmaBf16(o[2 * np + 1], alo, b1);
      }
    }
  }

  // Epilogue: row sums over the quad, then out = O / l and lse (rows past nrows are skipped).
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float l = l_part[hf];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = wrow + g + 8 * hf;
    if (r >= nrows) continue;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    uint16_t* out = OutRow(a, s.q0 + row0 + r, h) + 2 * cq;
#pragma unroll
    for (int n = 0; n < T::kOTiles; ++n) {
      *reinterpret_cast<uint32_t*>(out + 8 * n) =
          PackBf16x2(o[n][2 * hf] * inv, o[n][2 * hf + 1] * inv);
    }
    if (cq == 0 && a.lse != nullptr) {
      *LseAt(a, s.q0 + row0 + r, h) = l > 0.0f ? (m_run[hf] + log2f(l)) * kLn2 : -INFINITY;
    }
  }
}

// How the instance runs (its kernel pointer, shared memory, residency on the current device).
template <int kDqk, int kDv, bool kExactP>
KernelShape MmaInstanceShape() {
  using T = MmaTile<kDqk, kDv>;
  return MakeKernelShape(reinterpret_cast<const void*>(&MlaPrefillMmaKernel<kDqk, kDv, kExactP>),
                         T::kBlockM, T::kThreads, T::kSmemBytes);
}

// Explicit instantiation (mma_d192.cu, mma_dims.cu) or its extern declaration (mma.cu).
// Both precisions (HIGH: kExactP true; FAST: false).
#define ATTND_MLA_PREFILL_MMA_INSTANCE(EXTERN, DQK, DV)          \
  EXTERN template KernelShape MmaInstanceShape<DQK, DV, true>(); \
  EXTERN template KernelShape MmaInstanceShape<DQK, DV, false>();

}  // namespace attnd::kernels::mla_prefill::gpu
