// The tensor-core MLA decode kernel (CUDA sm_80+, bf16 mma.sync m16n8k16, f32 accumulate).
// A CTA (8 warps) takes kBlockM = 16·kMTiles query rows of one request (MTP tokens stacked over
// heads; rows past s_q·H are zero, see nothing and are never written) and one split of its
// positions, in tiles of 64 positions, double-buffered:
//   gather   cp.async 16 B per thread, 8 threads per cache row, into a swizzled [64][d_qk] tile;
//            positions past the range or on a page id outside [0, num_pages) are zero-filled
//            by plain stores and never read. Tile i+1 is in flight while tile i is computed.
//   kFp8     (the per-tensor FP8 cache, params.h: u8 rows of d_qk e4m3 codes × kv_scale) the
//            two bf16 stages become one bf16 tile plus two stages of raw codes ([64][d_qk] u8,
//            unswizzled; together one bf16 stage's bytes, so shared memory is unchanged). Codes
//            of tile i+1 are cp.async'd (zero-filled like the bf16 gather) while each thread
//            converts its share of tile i's codes into the bf16 tile: e4m3 × kv_scale in f32,
//            rounded to bf16 once (sparse_mla/gpu/fp8_kv.cuh DequantFp8x16, the SIMT kernel's
//            numerics, docs/ACCURACY.md), 16 codes -> swizzled chunks 2c, 2c + 1. From there on
//            the tile is used exactly like a bf16 stage.
//   S = Q·Kᵀ warp (m-group, n-group): kWarpMTiles x kWarpNTiles m16n8 tiles over d_qk.
//   softmax  scores scaled to log2 units, -inf where invisible (masked token or the row's MTP
//            causal limit); tile row max through shared memory, online update from a finite
//            initial max; P = exp2(x - m) in bf16 (HIGH: as hi + lo, |P - hi - lo| <= 2^-16·P,
//            so the output keeps f32-path accuracy; FAST: rounded once, half the P·V MMAs; row
//            sums take the unrounded P) in shared memory: for d576 P hi lives in the rope
//            columns of the tile, dead once Q·Kᵀ is done.
//   O += P·V warp w owns O[:, 64w .. 64w+63] for all kBlockM rows (kMTiles·32 f32 registers).
// Instantiated in mma_d512.cu / mma_d576.cu (and _fast, mma_fp8_*.cu); launched by mma.cu.
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/mla_decode/gpu/mma.cuh is CUDA-only"
#endif

#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/attention.cuh"
#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/mma_sync.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/mla_decode/gpu/common.cuh"
#include "kernels/mla_decode/gpu/plan.h"
#include "kernels/sparse_mla/gpu/fp8_kv.cuh"

namespace attnd::kernels::mla_decode::gpu {

template <int kMTiles, int kDqk>
struct MmaTile : MmaSyncTile<kMTiles, kDqk> {
  using Base = MmaSyncTile<kMTiles, kDqk>;
  static_assert(kDimV == 512, "P·V: 64 columns of O per warp");
  static constexpr int kKSteps = kDqk / 16;              // k16 steps of Q·Kᵀ
  static constexpr int kMGroups = kMTiles == 1 ? 1 : 2;  // Q·Kᵀ warp grid
  static constexpr int kNGroups = Base::kWarps / kMGroups;
  static constexpr int kWarpMTiles = kMTiles / kMGroups;
  static constexpr int kWarpNTiles = Base::kBlockN / 8 / kNGroups;
  static constexpr int kLoadRows = Base::kThreads / 8;  // cache rows per gather pass (8 thr/row)
  // P hi sits in the rope chunks 64..71 of the tile's rows (d576) or in its own buffer.
  static constexpr bool kPInRope = kDqk == 576;
  // Shared memory (bytes): Q | tile stage 0 | tile stage 1 | [P hi] | P lo | row max | positions.
  // Q rows are laid out like KV rows (kKvRowBytes).
  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + Base::kBlockM * Base::kKvRowBytes;
  static constexpr int kPHiOffset = kKvOffset + 2 * Base::kKvStageBytes;
  static constexpr int kPLoOffset = kPHiOffset + (kPInRope ? 0 : Base::kBlockM * Base::kPRowBytes);
  static constexpr int kRedOffset = kPLoOffset + Base::kBlockM * Base::kPRowBytes;
  static constexpr int kPosOffset = kRedOffset + Base::kBlockM * kNGroups * 4;
  static constexpr int kSmemBytes = kPosOffset + 2 * Base::kBlockN * 4;
  // The FP8 kernel: tile stage 0 is its one bf16 tile, stage 1's bytes hold two stages of raw
  // codes [kBlockN][kDqk] u8 (16-B chunks, unswizzled; kRawChunks per row, 36 or 32).
  static constexpr int kRawRowBytes = kDqk;
  static constexpr int kRawChunks = kDqk / 16;
  static constexpr int kRawStageBytes = Base::kBlockN * kRawRowBytes;
  static constexpr int kRawOffset = kKvOffset + Base::kKvStageBytes;
  static_assert(2 * kRawStageBytes == Base::kKvStageBytes, "raw stages fill one bf16 stage");
  static_assert(kDqk % 16 == 0 && kRawOffset % 16 == 0, "16-byte raw chunks");
  static_assert(kWarpNTiles == 1 || kWarpNTiles == 2, "one ldmatrix per k-step for K");
  static_assert(Base::kBlockM <= Base::kBlockN, "P hi rows live in the tile's rows");
  static_assert(Base::kKvChunks % 8 == 0, "whole gather passes");
  static_assert(kNGroups % 4 == 0, "row max read as float4");
};

// kExactP: Precision::kHigh (P·V as (P hi + P lo)·V); false: Precision::kFast (bf16 P).
// kFp8: the cache is the per-tensor FP8 one (a.kv_fp8, a.kv_scale), else bf16 (a.kv).
template <int kMTiles, int kDqk, bool kExactP, bool kFp8>
__global__ void __launch_bounds__(256, 1) MlaDecodeMmaKernel(const DecodeArgs a) {
  using T = MmaTile<kMTiles, kDqk>;
  using namespace ::attnd::gpu::ptx;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t q_s = SmemAddr(smem + T::kQOffset);
  const uint32_t kv_s = SmemAddr(smem + T::kKvOffset);
  const uint32_t p_lo_s = SmemAddr(smem + T::kPLoOffset);
  float* red_s = reinterpret_cast<float*>(smem + T::kRedOffset);      // [kBlockM][kNGroups]
  int32_t* pos_s = reinterpret_cast<int32_t*>(smem + T::kPosOffset);  // [2][kBlockN]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, cq = lane % 4;  // fragment row; column pair 2·cq, 2·cq + 1
  const int mg = warp / T::kNGroups, ng = warp % T::kNGroups;
  const WorkItem w = DecodeWorkItem(a, blockIdx.x, T::kBlockN);
  if (w.begin >= w.end) {
    WriteEmptyRows(a, w);  // no position to read: no loads at all
    return;
  }

  // Gather: thread (row lr + kLoadRows·i, chunks lc + 8·k).
  const int lr = tid / 8, lc = tid % 8;
  for (int r = lr; r < T::kBlockM; r += T::kLoadRows) {
    const uint16_t* src = r < w.nrows ? QueryRow(a, w.b, w.row0 + r) : nullptr;
#pragma unroll
    for (int c = lc; c < T::kKvChunks; c += 8) {
      const uint32_t dst = q_s + Swizzle(r, c, T::kKvRowBytes);
      if (src != nullptr) {
        CpAsync16(dst, src + 8 * c, true);
      } else {
        *reinterpret_cast<uint4*>(smem + (dst - SmemAddr(smem))) = make_uint4(0, 0, 0, 0);
      }
    }
  }
  // Tile at t0 into `stage` (bf16: the swizzled tile; FP8: the raw codes), thread (rows
  // lr + kLoadRows·i, chunks lc + 8·k), and its positions (-1: not readable) into pos_s[stage].
  auto issue_tile = [&](int64_t t0, int stage) {
#pragma unroll
    for (int i = 0; i < T::kBlockN / T::kLoadRows; ++i) {
      const int r = lr + T::kLoadRows * i;
      const int64_t pos = t0 + r;
      const int64_t off = pos < w.end ? TokenOffset(a, w.b, pos) : -1;
      if constexpr (kFp8) {  // offsets in bytes; kRawChunks (36 at d576) is not a multiple of 8
        const int row_at = T::kRawOffset + stage * T::kRawStageBytes + r * T::kRawRowBytes;
#pragma unroll
        for (int c = lc; c < T::kRawChunks; c += 8) {
          if (off >= 0) {
            CpAsync16(SmemAddr(smem + row_at + 16 * c), a.kv_fp8 + off + 16 * c, true);
          } else {
            *reinterpret_cast<uint4*>(smem + row_at + 16 * c) = make_uint4(0, 0, 0, 0);
          }
        }
      } else {
        const uint32_t base = kv_s + stage * T::kKvStageBytes;
#pragma unroll
        for (int c = lc; c < T::kKvChunks; c += 8) {
          const uint32_t dst = base + Swizzle(r, c, T::kKvRowBytes);
          if (off >= 0) {
            CpAsync16(dst, a.kv + off + 8 * c, true);
          } else {
            *reinterpret_cast<uint4*>(smem + (dst - SmemAddr(smem))) = make_uint4(0, 0, 0, 0);
          }
        }
      }
      if (lc == 0) pos_s[stage * T::kBlockN + r] = off >= 0 ? static_cast<int32_t>(pos) : -1;
    }
  };
  // FP8: the raw codes of `stage` -> the bf16 tile (stage 0's bytes), thread (rows
  // lr + kLoadRows·i, raw chunks lc + 8·k): 16 codes -> bf16 chunks 2c (codes 0..7) and 2c + 1
  // (8..15), swizzled like the bf16 gather. The eight threads of a row store chunks 2c + 1 first
  // where c / 4 is odd, so each of the two stores fills one 128-B segment's 8 bank groups.
  [[maybe_unused]] auto convert_tile = [&](int stage) {
    const float scale = a.kv_scale;
#pragma unroll
    for (int i = 0; i < T::kBlockN / T::kLoadRows; ++i) {
      const int r = lr + T::kLoadRows * i;
      const uint8_t* raw = smem + T::kRawOffset + stage * T::kRawStageBytes + r * T::kRawRowBytes;
#pragma unroll
      for (int c = lc; c < T::kRawChunks; c += 8) {
        const uint4 codes = *reinterpret_cast<const uint4*>(raw + 16 * c);
        uint4 lo, hi;
        ::attnd::kernels::sparse_mla::gpu::DequantFp8x16(codes, scale, &lo, &hi);
        const int first = (c >> 2) & 1;  // 0: chunk 2c (lo) first; 1: chunk 2c + 1 (hi) first
        *reinterpret_cast<uint4*>(smem + T::kKvOffset + Swizzle(r, 2 * c + first, T::kKvRowBytes)) =
            first ? hi : lo;
        *reinterpret_cast<uint4*>(smem + T::kKvOffset +
                                  Swizzle(r, 2 * c + (first ^ 1), T::kKvRowBytes)) =
            first ? lo : hi;
      }
    }
  };

  // Per-thread state. Q·Kᵀ rows: m-tiles mg·kWarpMTiles + mi, rows g and g + 8. O rows: every
  // m-tile, rows g and g + 8; m_run is kept for all of them (identical in every thread).
  int32_t limit[T::kWarpMTiles][2];  // <= seqlen <= INT32_MAX
#pragma unroll
  for (int mi = 0; mi < T::kWarpMTiles; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = (mg * T::kWarpMTiles + mi) * 16 + g + 8 * h;
      limit[mi][h] = r < w.nrows ? static_cast<int32_t>(RowLimit(a, w.seqlen, w.row0 + r)) : 0;
    }
  }
  float m_run[kMTiles][2], l_part[T::kWarpMTiles][2];
  float o[kMTiles][T::kOTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    m_run[mt][0] = m_run[mt][1] = kInitialMax;
#pragma unroll
    for (int n = 0; n < T::kOTiles; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0;
  }
#pragma unroll
  for (int mi = 0; mi < T::kWarpMTiles; ++mi) l_part[mi][0] = l_part[mi][1] = 0.0f;

  issue_tile(w.begin, 0);
  CpAsyncCommit();
  const int64_t tiles = (w.end - w.begin + T::kBlockN - 1) / T::kBlockN;
  for (int64_t it = 0; it < tiles; ++it) {
    const int stage = static_cast<int>(it & 1);
    // FP8: the one bf16 tile; `stage` then names the raw codes and positions of tile `it`.
    const uint32_t kv_stage = kFp8 ? kv_s : kv_s + stage * T::kKvStageBytes;
    CpAsyncWait<0>();
    __syncthreads();  // tile `it` landed; every warp is done with tile it - 1 (FP8: with the
                      // bf16 tile, the raw stage `stage ^ 1` and its positions)
    if (it + 1 < tiles) {
      issue_tile(w.begin + (it + 1) * T::kBlockN, stage ^ 1);
      CpAsyncCommit();
    }
    if constexpr (kFp8) {
      convert_tile(stage);
      __syncthreads();  // the bf16 tile of tile `it` complete
    }

    // S = Q·Kᵀ for this warp's m16n8 tiles.
    float s[T::kWarpMTiles][T::kWarpNTiles][4];
#pragma unroll
    for (int mi = 0; mi < T::kWarpMTiles; ++mi) {
#pragma unroll
      for (int ni = 0; ni < T::kWarpNTiles; ++ni) {
        s[mi][ni][0] = s[mi][ni][1] = s[mi][ni][2] = s[mi][ni][3] = 0.0f;
      }
    }
#pragma unroll 4
    for (int ks = 0; ks < T::kKSteps; ++ks) {
      uint32_t af[T::kWarpMTiles][4];
#pragma unroll
      for (int mi = 0; mi < T::kWarpMTiles; ++mi) {
        const int row = (mg * T::kWarpMTiles + mi) * 16 + (lane & 15);
        LdMatrixX4(af[mi], q_s + Swizzle(row, 2 * ks + (lane >> 4), T::kKvRowBytes));
      }
      uint32_t bf[T::kWarpNTiles][2];
      if constexpr (T::kWarpNTiles == 2) {
        uint32_t r[4];
        const int tok = ng * 16 + (lane & 7) + ((lane >> 4) << 3);
        LdMatrixX4(r, kv_stage + Swizzle(tok, 2 * ks + ((lane >> 3) & 1), T::kKvRowBytes));
        bf[0][0] = r[0];
        bf[0][1] = r[1];
        bf[T::kWarpNTiles - 1][0] = r[2];
        bf[T::kWarpNTiles - 1][1] = r[3];
      } else {
        const int tok = ng * 8 + (lane & 7);
        LdMatrixX2(bf[0], kv_stage + Swizzle(tok, 2 * ks + ((lane >> 3) & 1), T::kKvRowBytes));
      }
#pragma unroll
      for (int mi = 0; mi < T::kWarpMTiles; ++mi) {
#pragma unroll
        for (int ni = 0; ni < T::kWarpNTiles; ++ni) MmaBf16(s[mi][ni], af[mi], bf[ni]);
      }
    }

    // Scale to log2 units, mask, and publish this warp's row maxima.
    const int32_t* tile_pos = pos_s + stage * T::kBlockN;
#pragma unroll
    for (int mi = 0; mi < T::kWarpMTiles; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int ni = 0; ni < T::kWarpNTiles; ++ni) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int32_t pos = tile_pos[(ng * T::kWarpNTiles + ni) * 8 + 2 * cq + e];
            float& x = s[mi][ni][2 * h + e];
            x = pos >= 0 && pos < limit[mi][h] ? x * a.scale_log2 : -INFINITY;
            mx = fmaxf(mx, x);
          }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const int row = (mg * T::kWarpMTiles + mi) * 16 + g + 8 * h;
        if (cq == 0) red_s[row * T::kNGroups + ng] = mx;
      }
    }
    __syncthreads();  // row maxima of every n-group published

    // New running max per row; rescale O (all rows) and this warp's partial sums. m_qk copies
    // the max of this warp's Q·Kᵀ rows (static register indices: mg is not a constant).
    float m_qk[T::kWarpMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4* red =
            reinterpret_cast<const float4*>(red_s + (mt * 16 + g + 8 * h) * T::kNGroups);
        float mx = m_run[mt][h];
#pragma unroll
        for (int k = 0; k < T::kNGroups / 4; ++k) {
          const float4 v = red[k];
          mx = fmaxf(fmaxf(mx, fmaxf(v.x, v.y)), fmaxf(v.z, v.w));
        }
        const float alpha = Exp2(m_run[mt][h] - mx);
        m_run[mt][h] = mx;
#pragma unroll
        for (int n = 0; n < T::kOTiles; ++n) {
          o[mt][n][2 * h] *= alpha;
          o[mt][n][2 * h + 1] *= alpha;
        }
#pragma unroll
        for (int mi = 0; mi < T::kWarpMTiles; ++mi) {
          if (mt == mg * T::kWarpMTiles + mi) {  // a row of this warp's Q·Kᵀ tiles
            l_part[mi][h] *= alpha;
            m_qk[mi][h] = mx;
          }
        }
      }
    }

    // P = exp2(x - m) in bf16 (HIGH: hi + lo) into shared memory, row-major [row][position].
#pragma unroll
    for (int mi = 0; mi < T::kWarpMTiles; ++mi) {
      const int mt = mg * T::kWarpMTiles + mi;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = mt * 16 + g + 8 * h;
#pragma unroll
        for (int ni = 0; ni < T::kWarpNTiles; ++ni) {
          const int chunk = ng * T::kWarpNTiles + ni;
          const float p0 = Exp2(s[mi][ni][2 * h] - m_qk[mi][h]);
          const float p1 = Exp2(s[mi][ni][2 * h + 1] - m_qk[mi][h]);
          l_part[mi][h] += p0 + p1;
          if constexpr (kExactP) {
            uint32_t hi, lo;
            SplitBf16x2(p0, p1, &hi, &lo);
            const uint32_t hi_at =
                T::kPInRope ? kv_stage + Swizzle(row, 64 + chunk, T::kKvRowBytes)
                            : SmemAddr(smem + T::kPHiOffset) + Swizzle(row, chunk, T::kPRowBytes);
            const uint32_t lo_at = p_lo_s + Swizzle(row, chunk, T::kPRowBytes);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(hi_at + 4 * cq), "r"(hi) : "memory");
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(lo_at + 4 * cq), "r"(lo) : "memory");
          } else {  // FAST: P rounded to bf16 once
            const uint32_t hi = PackBf16x2(p0, p1);
            const uint32_t hi_at =
                T::kPInRope ? kv_stage + Swizzle(row, 64 + chunk, T::kKvRowBytes)
                            : SmemAddr(smem + T::kPHiOffset) + Swizzle(row, chunk, T::kPRowBytes);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(hi_at + 4 * cq), "r"(hi) : "memory");
          }
        }
      }
    }
    __syncthreads();  // P complete (Q·Kᵀ of every warp finished before the rope chunks changed)

    // O[:, 64·warp ..] += P·V, V = the tile's first 512 columns.
    const uint32_t p_hi_s = T::kPInRope ? kv_stage + 64 * 16 : SmemAddr(smem + T::kPHiOffset);
#pragma unroll 1
    for (int kk = 0; kk < T::kBlockN / 16; ++kk) {
      uint32_t bv[T::kOTiles][2];
#pragma unroll
      for (int np = 0; np < T::kOTiles / 2; ++np) {
        uint32_t r[4];
        const int tok = 16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3);
        LdMatrixX4Trans(r,
                        kv_stage + Swizzle(tok, 8 * warp + 2 * np + (lane >> 4), T::kKvRowBytes));
        bv[2 * np][0] = r[0];
        bv[2 * np][1] = r[1];
        bv[2 * np + 1][0] = r[2];
        bv[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const int row = mt * 16 + (lane & 15), chunk = 2 * kk + (lane >> 4);
        if constexpr (kExactP) {  // HIGH: (P hi + P lo)·V
          uint32_t ahi[4], alo[4];
          LdMatrixX4(ahi,
                     p_hi_s + Swizzle(row, chunk, T::kPInRope ? T::kKvRowBytes : T::kPRowBytes));
          LdMatrixX4(alo, p_lo_s + Swizzle(row, chunk, T::kPRowBytes));
#pragma unroll
          for (int n = 0; n < T::kOTiles; ++n) {
            MmaBf16(o[mt][n], ahi, bv[n]);
            MmaBf16(o[mt][n], alo, bv[n]);
          }
        } else {  // FAST: bf16 P·V
          uint32_t ahi[4];
          LdMatrixX4(ahi,
                     p_hi_s + Swizzle(row, chunk, T::kPInRope ? T::kKvRowBytes : T::kPRowBytes));
#pragma unroll
          for (int n = 0; n < T::kOTiles; ++n) MmaBf16(o[mt][n], ahi, bv[n]);
        }
      }
    }
  }

  // Row sums: quad, then across the n-groups through shared memory (no warp reads red_s after
  // the last tile's second barrier, so it is free).
#pragma unroll
  for (int mi = 0; mi < T::kWarpMTiles; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_part[mi][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = (mg * T::kWarpMTiles + mi) * 16 + g + 8 * h;
      if (cq == 0) red_s[row * T::kNGroups + ng] = l;
    }
  }
  __syncthreads();

#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = mt * 16 + g + 8 * h;
      if (row >= w.nrows) continue;
      float l = 0.0f;
#pragma unroll
      for (int k = 0; k < T::kNGroups; ++k) l += red_s[row * T::kNGroups + k];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int col0 = 64 * warp + 2 * cq;
      if (w.direct) {
        uint16_t* out = OutRow(a, w.b, w.row0 + row) + col0;
#pragma unroll
        for (int n = 0; n < T::kOTiles; ++n) {
          *reinterpret_cast<uint32_t*>(out + 8 * n) =
              PackBf16x2(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
        }
      } else {
        float* out = a.partial_o + PartialRow(a, w.split, w.b, w.row0 + row) * kDimV + col0;
#pragma unroll
        for (int n = 0; n < T::kOTiles; ++n) {
          *reinterpret_cast<float2*>(out + 8 * n) =
              make_float2(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
        }
      }
      if (warp == 0 && cq == 0) {
        const float lse2 = l > 0.0f ? m_run[mt][h] + log2f(l) : -INFINITY;
        if (!w.direct) {
          a.partial_lse[PartialRow(a, w.split, w.b, w.row0 + row)] = lse2;
        } else if (a.lse != nullptr) {
          *LseAt(a, w.b, w.row0 + row) = lse2 * kLn2;
        }
      }
    }
  }
}

// How the instance runs (its kernel pointer, shared memory, residency on the current device).
template <int kMTiles, int kDqk, bool kExactP, bool kFp8 = false>
KernelShape MmaInstanceShape() {
  using T = MmaTile<kMTiles, kDqk>;
  KernelShape s;
  s.kernel = reinterpret_cast<const void*>(&MlaDecodeMmaKernel<kMTiles, kDqk, kExactP, kFp8>);
  s.block_m = T::kBlockM;
  s.block_n = T::kBlockN;
  s.threads = T::kThreads;
  s.smem_bytes = T::kSmemBytes;
  s.blocks_per_sm = ::attnd::gpu::BlocksPerSm(s.kernel, s.threads, s.smem_bytes);
  return s;
}

// Explicit instantiation (mma_d512.cu, mma_d576.cu) or its extern declaration (mma.cu).
// EXACT: true for HIGH, false for FAST. The two precisions' instances live in separate .cu files
// (mma_d576.cu, mma_d576_fast.cu, ...): instantiated in one translation unit, the HIGH kernels
// compiled differently (spilling 8 bytes at 64 rows, d576) from the same source alone. The FP8
// cache's instances (ATTND_MLA_DECODE_MMA_FP8_INSTANCE) are split the same way (mma_fp8_*.cu).
#define ATTND_MLA_DECODE_MMA_INSTANCE(EXTERN, M, D, EXACT) \
  EXTERN template KernelShape MmaInstanceShape<M, D, EXACT>();
#define ATTND_MLA_DECODE_MMA_FP8_INSTANCE(EXTERN, M, D, EXACT) \
  EXTERN template KernelShape MmaInstanceShape<M, D, EXACT, true>();

}  // namespace attnd::kernels::mla_decode::gpu
