// The tensor-core sparse MLA kernel (CUDA sm_80+, bf16 mma.sync m16n8k16, f32 accumulate).
// A CTA (8 warps) takes one token, a block of 16·kMTiles heads (padded rows are zero and never
// written) and one split of the token's slots, in tiles of 64 KV rows, double-buffered:
//   gather   cp.async 16 B per thread, 4 threads per row, into a swizzled [64][d_qk] tile; a
//            masked row (slot past the range, index < 0 or >= S) is zero-filled by a plain
//            store and never read. Tile i+1 is in flight while tile i is computed.
//   S = Q·Kᵀ warp (m-tile, token group): 16 heads x 8·kMTiles rows over d_qk; Q's first 512
//            columns from smem, d576's 64 rope columns from registers.
//   softmax  row max over the token groups through smem, online update in log2 units
//            (exp2 with sm_scale·log2e folded, running max from -1e30, masked scores -inf);
//            P goes to smem in bf16: HIGH as two terms, P = hi + lo (|P - hi - lo| <= 2^-16·P),
//            so the output keeps f32-path accuracy; FAST rounded once (2^-9 relative per
//            weight), half the P·V MMAs (kExactP false). Row sums take the unrounded P.
//   O += P·V warp w owns O[:, 64w .. 64w+63] for all heads (kMTiles·32 f32 registers).
// kFp8 (the FP8 cache, d_qk 576): each gather thread loads its 8 chunks of codes and the scales
// of tile i+1 into registers (ld.global.nc) while tile i's S = Q·Kᵀ runs, then dequantises them
// to bf16 (fp8_kv.cuh) into the other stage; the rope columns go by cp.async as in the bf16 path.
// Instantiated in mma_d512.cu / mma_d576.cu / mma_fp8.cu; launched by mma.cu.
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/sparse_mla/gpu/mma.cuh is CUDA-only"
#endif

#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/attention.cuh"
#include "kernels/common/gpu/mma_sync.cuh"
#include "kernels/common/gpu/tiles.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/sparse_mla/gpu/common.cuh"
#include "kernels/sparse_mla/gpu/fp8_kv.cuh"
#include "kernels/sparse_mla/gpu/plan.h"

namespace attnd::kernels::sparse_mla::gpu {

template <int kMTiles, int kDqk>
struct MmaTile : MmaSyncTile<kMTiles, kDqk> {
  using Base = MmaSyncTile<kMTiles, kDqk>;
  static_assert(kDimV == 512, "P·V: 64 columns of O per warp");
  static constexpr int kGroups = Base::kWarps / kMTiles;           // QK warps sharing an m-tile
  static constexpr int kGroupTiles = Base::kBlockN / 8 / kGroups;  // n8 tiles per QK warp
  static constexpr int kRopeSteps = (kDqk - 512) / 16;  // k16 steps of Q held in registers
  static constexpr int kQRowBytes = 512 * 2;            // Q tile: the first 512 columns
  static constexpr int kGatherThreads = Base::kThreads / Base::kBlockN;  // per KV row
  // Shared memory (bytes): Q | KV stage 0 | KV stage 1 | P hi | P lo | statistics.
  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + Base::kBlockM * kQRowBytes;
  static constexpr int kPHiOffset = kKvOffset + 2 * Base::kKvStageBytes;
  static constexpr int kPLoOffset = kPHiOffset + Base::kBlockM * Base::kPRowBytes;
  static constexpr int kStatOffset = kPLoOffset + Base::kBlockM * Base::kPRowBytes;
  static constexpr int kRedFloats = kGroups * Base::kBlockM;  // per-group row max, then row sum
  static constexpr int kStatBytes = (kRedFloats + 3 * Base::kBlockM) * 4 + 2 * Base::kBlockN * 4;
  static constexpr int kSmemBytes = kStatOffset + kStatBytes;
  static_assert(kGroupTiles * 8 * kGroups == Base::kBlockN, "token groups tile the KV block");
  static_assert(Base::kKvChunks % kGatherThreads == 0, "whole chunks per gather thread");
  static_assert(kSplitAlign % Base::kBlockN == 0, "splits are whole KV tiles");
  static_assert(kSmemBytes <= kSm90MaxSmemBytes, "fits sm_90's 227 KiB of shared memory per block");
  // FP8 cache rows: gather thread g_sub takes code chunks g_sub + kGatherThreads·i (scale tile
  // i / 2) and rope chunks g_sub, g_sub + kGatherThreads.
  static constexpr int kFp8Loads = kFp8CodeChunks / kGatherThreads;
  static constexpr int kFp8RopeLoads = kFp8RopeChunks / kGatherThreads;
  static_assert(kFp8CodeChunksPerScale == 2 * kGatherThreads, "chunk i in scale tile i / 2");
  static_assert(kFp8Loads * kGatherThreads == kFp8CodeChunks &&
                    kFp8RopeLoads * kGatherThreads == kFp8RopeChunks,
                "whole FP8 row sections per gather thread");
};

// Two k16 steps (k columns 32·(ks / 2) .. + 31) of S += Q·Kᵀ for the m16 tile of Q rows
// mt·16 .. + 15 and kNt n8 tiles of KV rows row0 + 8·nt: Q and K from swizzled shared memory
// (rows kQRowBytes / kKvRowBytes apart), one ldmatrix x4 of K per n8 tile. Shared with
// mma_lowh.cuh.
template <int kNt, int kQRowBytes, int kKvRowBytes>
__device__ __forceinline__ void QkTwoSteps(float (&s)[kNt][4], uint32_t q_s, uint32_t kv_tile,
                                           int mt, int row0, int ks, int lane) {
  using namespace ::attnd::gpu::ptx;
  uint32_t qa[4], qb[4];
  LdMatrixX4(qa, q_s + Swizzle(mt * 16 + lane % 16, 2 * ks + lane / 16, kQRowBytes));
  LdMatrixX4(qb, q_s + Swizzle(mt * 16 + lane % 16, 2 * ks + 2 + lane / 16, kQRowBytes));
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    uint32_t kb[4];
    LdMatrixX4(kb, kv_tile + Swizzle(row0 + 8 * nt + lane % 8, 2 * ks + lane / 8, kKvRowBytes));
    MmaBf16(s[nt], qa, {kb[0], kb[1]});
    MmaBf16(s[nt], qb, {kb[2], kb[3]});
  }
}

// One m16 tile of O, rows g and g + 8, scaled by a0 and a1 (the online softmax's rescale).
template <int kOTiles>
__device__ __forceinline__ void ScaleORows(float (&o_m)[kOTiles][4], float a0, float a1) {
#pragma unroll
  for (int nt = 0; nt < kOTiles; ++nt) {
    o_m[nt][0] *= a0;
    o_m[nt][1] *= a0;
    o_m[nt][2] *= a1;
    o_m[nt][3] *= a1;
  }
}

// The B fragments of P·V for k16 step ks (KV rows 16·ks .. + 15) and this warp's kOTiles n8
// tiles of V columns (64·warp ..): ldmatrix x4 trans, two n8 tiles per load.
template <int kOTiles, int kKvRowBytes>
__device__ __forceinline__ void LoadVFragments(uint32_t (&v)[kOTiles][2], uint32_t kv_tile, int ks,
                                               int warp, int lane) {
  using namespace ::attnd::gpu::ptx;
#pragma unroll
  for (int np = 0; np < kOTiles / 2; ++np) {
    uint32_t r[4];
    LdMatrixX4Trans(r, kv_tile + Swizzle(16 * ks + lane % 16, kOTiles * warp + 2 * np + lane / 16,
                                         kKvRowBytes));
    v[2 * np][0] = r[0];
    v[2 * np][1] = r[1];
    v[2 * np + 1][0] = r[2];
    v[2 * np + 1][1] = r[3];
  }
}

// o_m += P hi·V for one m16 tile of O (A fragments ph; B fragments v): FAST's P·V.
template <int kOTiles>
__device__ __forceinline__ void MmaPv(float (&o_m)[kOTiles][4], const uint32_t (&ph)[4],
                                      const uint32_t (&v)[kOTiles][2]) {
#pragma unroll
  for (int nt = 0; nt < kOTiles; ++nt) ::attnd::gpu::ptx::MmaBf16(o_m[nt], ph, v[nt]);
}

// o_m += (P hi + P lo)·V for one m16 tile of O (A fragments ph, pl; B fragments v): HIGH's.
template <int kOTiles>
__device__ __forceinline__ void MmaPvHiLo(float (&o_m)[kOTiles][4], const uint32_t (&ph)[4],
                                          const uint32_t (&pl)[4],
                                          const uint32_t (&v)[kOTiles][2]) {
  using namespace ::attnd::gpu::ptx;
#pragma unroll
  for (int nt = 0; nt < kOTiles; ++nt) {
    MmaBf16(o_m[nt], ph, v[nt]);
    MmaBf16(o_m[nt], pl, v[nt]);
  }
}

// Row (t, h) of O / sum from half i (row g + 8i) of one m16 tile's P·V accumulators `o_m`
// (kOTiles n8 tiles; this thread's columns 64·warp + 8·nt + cq, + 1): bf16 to out, or the
// split's f32 partial (rows with sum > 0 only). Shared with mma_lowh.cuh.
template <int kOTiles>
__device__ __forceinline__ void StoreMmaORow(const KernelArgs& a, const float (&o_m)[kOTiles][4],
                                             int i, int64_t t, int h, int split, float sum,
                                             int warp, int cq) {
  using ::attnd::gpu::ptx::PackBf16x2;
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  if (a.splits == 1) {
    uint16_t* dst = a.out + t * a.out_stride_t + static_cast<int64_t>(h) * a.out_stride_h;
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) {
      const int col = 64 * warp + 8 * nt + cq;
      *reinterpret_cast<uint32_t*>(dst + col) =
          PackBf16x2(o_m[nt][2 * i] * inv, o_m[nt][2 * i + 1] * inv);
    }
  } else if (sum > 0.0f) {
    float* dst = a.partial_o + PartialRow(a, split, t, h) * kDimV;
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) {
      const int col = 64 * warp + 8 * nt + cq;
      *reinterpret_cast<float2*>(dst + col) =
          make_float2(o_m[nt][2 * i] * inv, o_m[nt][2 * i + 1] * inv);
    }
  }
}

// kExactP: Precision::kHigh (P·V as (P hi + P lo)·V); false: Precision::kFast (bf16 P).
template <int kMTiles, int kDqk, bool kFp8, bool kExactP>
__global__ void __launch_bounds__(256, 1) SparseMlaMmaKernel(const KernelArgs a) {
  static_assert(!kFp8 || kDqk == kFp8DimQk, "the FP8 cache has d_qk 576");
  using Tile = MmaTile<kMTiles, kDqk>;
  using namespace ::attnd::gpu::ptx;
  if (GateClosed(a)) return;  // another kernel was chosen for this call (common.cuh)
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t q_s = SmemAddr(smem + Tile::kQOffset);
  const uint32_t kv_s = SmemAddr(smem + Tile::kKvOffset);
  const uint32_t p_hi_s = SmemAddr(smem + Tile::kPHiOffset);
  const uint32_t p_lo_s = SmemAddr(smem + Tile::kPLoOffset);
  float* red_s = reinterpret_cast<float*>(smem + Tile::kStatOffset);  // [kGroups][kBlockM]
  float* alpha_s = red_s + Tile::kRedFloats;                          // [kBlockM]
  float* l_s = alpha_s + Tile::kBlockM;                               // [kBlockM]
  float* m_s = l_s + Tile::kBlockM;                                   // [kBlockM]
  int* valid_s = reinterpret_cast<int*>(m_s + Tile::kBlockM);         // [2][kBlockN]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, cq = 2 * (lane % 4);  // mma fragment row and column pair
  const int groups = (a.heads + Tile::kBlockM - 1) / Tile::kBlockM;
  const int64_t t = blockIdx.x / groups;
  const int h0 = static_cast<int>(blockIdx.x % groups) * Tile::kBlockM;
  const int split = blockIdx.y;
  const SlotRange range = SplitSlots(a, t, split);

  // QK role: m-tile `mt`, token group `grp` (rows tok0 .. tok0 + 8·kGroupTiles of the tile).
  const int mt = warp / Tile::kGroups, grp = warp % Tile::kGroups;
  const int tok0 = grp * Tile::kGroupTiles * 8;
  // Gather role: KV row g_row of the tile, chunks g_sub + kGatherThreads·i.
  const int g_row = tid / Tile::kGatherThreads, g_sub = tid % Tile::kGatherThreads;

  float m_row[2] = {kInitialMax, kInitialMax};  // rows mt·16 + g and + 8 (QK role)
  float l_row[2] = {0.0f, 0.0f};                // this thread's share of their sums
  float o[kMTiles][Tile::kOTiles][4] = {};      // O[:, 64·warp ..] (P·V role)

  // FP8: the codes and scales of this thread's share of the next tile's row (zeros: masked).
  [[maybe_unused]] uint4 fp8_codes[kFp8 ? Tile::kFp8Loads : 1];
  [[maybe_unused]] uint4 fp8_scales;

  // KV row `row` (or -1: zeros) into stage `stage`; masked rows issue no load. FP8: the rope
  // columns by cp.async, codes and scales to registers (store_fp8 puts them in the stage).
  auto gather = [&](int stage, int32_t row) {
    const uint32_t dst = kv_s + stage * Tile::kKvStageBytes;
    if constexpr (kFp8) {
      fp8_scales = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < Tile::kFp8Loads; ++i) fp8_codes[i] = make_uint4(0, 0, 0, 0);
      if (row >= 0) {
        const uint4* src =
            reinterpret_cast<const uint4*>(a.kv_fp8 + static_cast<int64_t>(row) * a.kv_fp8_stride);
#pragma unroll
        for (int i = 0; i < Tile::kFp8Loads; ++i) {
          fp8_codes[i] = __ldg(src + g_sub + Tile::kGatherThreads * i);
        }
        fp8_scales = __ldg(src + kFp8ScaleChunk);
#pragma unroll
        for (int i = 0; i < Tile::kFp8RopeLoads; ++i) {
          const int r = g_sub + Tile::kGatherThreads * i;
          CpAsync16(dst + Swizzle(g_row, kFp8CodeChunks * 2 + r, Tile::kKvRowBytes),
                    src + kFp8RopeChunk0 + r, true);
        }
      } else {
        uint8_t* base = smem + Tile::kKvOffset + stage * Tile::kKvStageBytes;
#pragma unroll
        for (int i = 0; i < Tile::kFp8RopeLoads; ++i) {
          const int r = g_sub + Tile::kGatherThreads * i;
          *reinterpret_cast<uint4*>(base + Swizzle(g_row, kFp8CodeChunks * 2 + r,
                                                   Tile::kKvRowBytes)) = make_uint4(0, 0, 0, 0);
        }
      }
    } else if (row >= 0) {
      const uint16_t* src = a.kv + static_cast<int64_t>(row) * a.kv_stride;
#pragma unroll
      for (int i = 0; i < Tile::kKvChunks / Tile::kGatherThreads; ++i) {
        const int c = g_sub + Tile::kGatherThreads * i;
        CpAsync16(dst + Swizzle(g_row, c, Tile::kKvRowBytes), src + c * 8, true);
      }
    } else {
      uint8_t* base = smem + Tile::kKvOffset + stage * Tile::kKvStageBytes;
#pragma unroll
      for (int i = 0; i < Tile::kKvChunks / Tile::kGatherThreads; ++i) {
        const int c = g_sub + Tile::kGatherThreads * i;
        *reinterpret_cast<uint4*>(base + Swizzle(g_row, c, Tile::kKvRowBytes)) =
            make_uint4(0, 0, 0, 0);
      }
    }
    if (g_sub == 0) valid_s[stage * Tile::kBlockN + g_row] = row >= 0;
  };

  // FP8: the codes gathered last (zeros for a masked row) × their scales, as bf16, into the
  // first 512 columns of stage `stage` (code chunk c -> bf16 chunks 2c, 2c + 1).
  auto store_fp8 = [&](int stage) {
    if constexpr (kFp8) {
      uint8_t* base = smem + Tile::kKvOffset + stage * Tile::kKvStageBytes;
#pragma unroll
      for (int i = 0; i < Tile::kFp8Loads; ++i) {
        const int c = g_sub + Tile::kGatherThreads * i;
        uint4 lo, hi;
        DequantFp8x16(fp8_codes[i], Fp8Scale(fp8_scales, i / 2), &lo, &hi);
        *reinterpret_cast<uint4*>(base + Swizzle(g_row, 2 * c, Tile::kKvRowBytes)) = lo;
        *reinterpret_cast<uint4*>(base + Swizzle(g_row, 2 * c + 1, Tile::kKvRowBytes)) = hi;
      }
    }
  };

  if (range.begin < range.end) {
    // Q's first 512 columns to smem (rows past H zero); d576's rope columns to registers.
    const uint16_t* q_tok = a.q + t * a.q_stride_t;
    for (int e = tid; e < Tile::kBlockM * 64; e += Tile::kThreads) {
      const int r = e / 64, c = e % 64;
      if (h0 + r < a.heads) {
        CpAsync16(q_s + Swizzle(r, c, Tile::kQRowBytes),
                  q_tok + static_cast<int64_t>(h0 + r) * a.q_stride_h + c * 8, true);
      } else {
        *reinterpret_cast<uint4*>(smem + Tile::kQOffset + Swizzle(r, c, Tile::kQRowBytes)) =
            make_uint4(0, 0, 0, 0);
      }
    }
    uint32_t q_rope[Tile::kRopeSteps > 0 ? Tile::kRopeSteps : 1][4];
#pragma unroll
    for (int rs = 0; rs < Tile::kRopeSteps; ++rs) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = h0 + mt * 16 + g + 8 * (i & 1);
        const int col = 512 + 16 * rs + cq + 8 * (i >> 1);
        q_rope[rs][i] = h < a.heads ? *reinterpret_cast<const uint32_t*>(
                                          q_tok + static_cast<int64_t>(h) * a.q_stride_h + col)
                                    : 0u;
      }
    }

    gather(0, LoadRow(a, range, range.begin + g_row));
    store_fp8(0);
    CpAsyncCommit();
    int32_t row_next = LoadRow(a, range, range.begin + Tile::kBlockN + g_row);

    int stage = 0;
    for (int64_t pos = range.begin; pos < range.end; pos += Tile::kBlockN, stage ^= 1) {
      CpAsyncWait<0>();
      __syncthreads();  // (A) tile `stage` landed; the previous P·V is done with the other
                        // stage, P and alpha
      const bool more = pos + Tile::kBlockN < range.end;
      if (more) gather(stage ^ 1, row_next);
      CpAsyncCommit();
      row_next = LoadRow(a, range, pos + 2 * Tile::kBlockN + g_row);
      const uint32_t kv_tile = kv_s + stage * Tile::kKvStageBytes;
      const int* valid = valid_s + stage * Tile::kBlockN;

      // S = Q·Kᵀ for rows mt·16 .. +15 and tile rows tok0 .. (two k16 steps per ldmatrix of K).
      float s[Tile::kGroupTiles][4] = {};
#pragma unroll 4
      for (int ks = 0; ks < 32; ks += 2) {
        QkTwoSteps<Tile::kGroupTiles, Tile::kQRowBytes, Tile::kKvRowBytes>(s, q_s, kv_tile, mt,
                                                                           tok0, ks, lane);
      }
#pragma unroll
      for (int rs = 0; rs < Tile::kRopeSteps; rs += 2) {
#pragma unroll
        for (int nt = 0; nt < Tile::kGroupTiles; ++nt) {
          uint32_t kb[4];
          LdMatrixX4(kb, kv_tile + Swizzle(tok0 + 8 * nt + lane % 8, 64 + 2 * rs + lane / 8,
                                           Tile::kKvRowBytes));
          MmaBf16(s[nt], q_rope[rs], {kb[0], kb[1]});
          MmaBf16(s[nt], q_rope[rs + 1], {kb[2], kb[3]});
        }
      }
      // FP8: the next tile's codes have had the QKᵀ to arrive; the other stage is free since (A)
      // and is read after the next iteration's (A).
      if (more) store_fp8(stage ^ 1);

      // Scores in log2 units, masked -inf; this group's row max to smem.
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < Tile::kGroupTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool ok = valid[tok0 + 8 * nt + cq + (e & 1)] != 0;
          s[nt][e] = ok ? s[nt][e] * a.scale_log2 : -INFINITY;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], ::attnd::gpu::ShflXor(mx[i], 1));
        mx[i] = fmaxf(mx[i], ::attnd::gpu::ShflXor(mx[i], 2));
        if (lane % 4 == 0) red_s[grp * Tile::kBlockM + mt * 16 + g + 8 * i] = mx[i];
      }
      __syncthreads();  // (B) every group's row max visible

      // Online softmax: new max, rescale factor, P (HIGH: hi + lo) to smem.
      float alpha[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float m_new = m_row[i];
#pragma unroll
        for (int gg = 0; gg < Tile::kGroups; ++gg) {
          m_new = fmaxf(m_new, red_s[gg * Tile::kBlockM + mt * 16 + g + 8 * i]);
        }
        alpha[i] = Exp2(m_row[i] - m_new);
        m_row[i] = m_new;
        l_row[i] *= alpha[i];
      }
#pragma unroll
      for (int nt = 0; nt < Tile::kGroupTiles; ++nt) {
        const int col = tok0 + 8 * nt + cq;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float p0 = Exp2(s[nt][2 * i] - m_row[i]);
          const float p1 = Exp2(s[nt][2 * i + 1] - m_row[i]);
          l_row[i] += p0 + p1;
          const int row = mt * 16 + g + 8 * i;
          const uint32_t off = Swizzle(row, col / 8, Tile::kPRowBytes) + (col % 8) * 2;
          if constexpr (kExactP) {
            uint32_t hi, lo;
            SplitBf16x2(p0, p1, &hi, &lo);
            *reinterpret_cast<uint32_t*>(smem + Tile::kPHiOffset + off) = hi;
            *reinterpret_cast<uint32_t*>(smem + Tile::kPLoOffset + off) = lo;
          } else {
            *reinterpret_cast<uint32_t*>(smem + Tile::kPHiOffset + off) = PackBf16x2(p0, p1);
          }
        }
      }
      if (grp == 0 && lane % 4 == 0) {
        alpha_s[mt * 16 + g] = alpha[0];
        alpha_s[mt * 16 + g + 8] = alpha[1];
      }
      __syncthreads();  // (C) P and alpha visible

      // O[:, 64·warp ..] = alpha · O + P · V (HIGH: (P_hi + P_lo) · V).
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        ScaleORows(o[m], alpha_s[m * 16 + g], alpha_s[m * 16 + g + 8]);
      }
#pragma unroll
      for (int ks = 0; ks < Tile::kBlockN / 16; ++ks) {
        uint32_t v[Tile::kOTiles][2];
        LoadVFragments<Tile::kOTiles, Tile::kKvRowBytes>(v, kv_tile, ks, warp, lane);
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          uint32_t ph[4];
          const uint32_t off = Swizzle(m * 16 + lane % 16, 2 * ks + lane / 16, Tile::kPRowBytes);
          LdMatrixX4(ph, p_hi_s + off);
          if constexpr (kExactP) {
            uint32_t pl[4];
            LdMatrixX4(pl, p_lo_s + off);
            MmaPvHiLo(o[m], ph, pl, v);
          } else {
            MmaPv(o[m], ph, v);
          }
        }
      }
    }
    CpAsyncWait<0>();  // nothing may be left in flight (the last commit is empty)
  }

  // Epilogue: row sums over the quad and the token groups; final max per row.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_row[i] += ::attnd::gpu::ShflXor(l_row[i], 1);
    l_row[i] += ::attnd::gpu::ShflXor(l_row[i], 2);
  }
  __syncthreads();  // every read of red_s in the loop is done
  if (lane % 4 == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      red_s[grp * Tile::kBlockM + mt * 16 + g + 8 * i] = l_row[i];
      if (grp == 0) m_s[mt * 16 + g + 8 * i] = m_row[i];
    }
  }
  __syncthreads();
  if (tid < Tile::kBlockM) {
    float sum = 0.0f;
#pragma unroll
    for (int gg = 0; gg < Tile::kGroups; ++gg) sum += red_s[gg * Tile::kBlockM + tid];
    l_s[tid] = sum;
  }
  __syncthreads();

  // O / l (bf16 out, or the f32 partial of this split); rows past H are never written.
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = m * 16 + g + 8 * i;
      const int h = h0 + row;
      if (h >= a.heads) continue;
      StoreMmaORow(a, o[m], i, t, h, split, l_s[row], warp, cq);
    }
  }
  if (tid < Tile::kBlockM && h0 + tid < a.heads) {
    StoreRowLse(a, split, t, h0 + tid, m_s[tid], l_s[tid]);
  }
}

// One instance's launch (main kernel only) and its shape on the current device.
template <int kMTiles, int kDqk, bool kFp8 = false, bool kExactP = true>
::attnd::gpu::Error LaunchMmaInstance(const KernelArgs& a, ::attnd::gpu::Stream stream) {
  using Tile = MmaTile<kMTiles, kDqk>;
  const void* fn = reinterpret_cast<const void*>(&SparseMlaMmaKernel<kMTiles, kDqk, kFp8, kExactP>);
  const ::attnd::gpu::Error e = ::attnd::gpu::AllowDynamicSmem(fn, Tile::kSmemBytes);
  if (e != ::attnd::gpu::kSuccess) return e;
  const int groups = CeilDiv(a.heads, Tile::kBlockM);
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(a.tokens) * groups),
                  static_cast<unsigned>(a.splits));
  SparseMlaMmaKernel<kMTiles, kDqk, kFp8, kExactP>
      <<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(a);
  return ::attnd::gpu::GetLastError();
}

template <int kMTiles, int kDqk, bool kFp8 = false>
KernelShape MmaInstanceShape() {
  using Tile = MmaTile<kMTiles, kDqk>;
  KernelShape s;
  s.block_m = Tile::kBlockM;
  s.smem_bytes = Tile::kSmemBytes;
  s.ctas_per_sm = ::attnd::gpu::BlocksPerSm(
      reinterpret_cast<const void*>(&SparseMlaMmaKernel<kMTiles, kDqk, kFp8, true>), Tile::kThreads,
      Tile::kSmemBytes);
  return s;
}

// Both precisions (HIGH: kExactP true; FAST: false).
#define ATTND_SPARSE_MLA_MMA_INSTANCE(EXTERN, M, D)                                                \
  EXTERN template ::attnd::gpu::Error LaunchMmaInstance<M, D, false, true>(const KernelArgs&,      \
                                                                           ::attnd::gpu::Stream);  \
  EXTERN template ::attnd::gpu::Error LaunchMmaInstance<M, D, false, false>(const KernelArgs&,     \
                                                                            ::attnd::gpu::Stream); \
  EXTERN template KernelShape MmaInstanceShape<M, D>();
// The FP8-cache instances (d_qk 576), both precisions.
#define ATTND_SPARSE_MLA_MMA_FP8_INSTANCE(EXTERN, M)                                               \
  EXTERN template ::attnd::gpu::Error LaunchMmaInstance<M, 576, true, true>(const KernelArgs&,     \
                                                                            ::attnd::gpu::Stream); \
  EXTERN template ::attnd::gpu::Error LaunchMmaInstance<M, 576, true, false>(                      \
      const KernelArgs&, ::attnd::gpu::Stream);                                                    \
  EXTERN template KernelShape MmaInstanceShape<M, 576, true>();

}  // namespace attnd::kernels::sparse_mla::gpu
