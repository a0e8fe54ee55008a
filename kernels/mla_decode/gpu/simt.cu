// Portable SIMT MLA decode (CUDA and HIP; f32 FMA, no tensor cores). A CTA takes 16 query rows
// of one request (MTP tokens stacked over heads; rows past s_q·H are zero and never written)
// and one split of its positions, and walks them in tiles of 32:
//   gather   one thread per position resolves its page (ids outside [0, num_pages) and
//            positions past the range: offset -1, zero-filled, never read), then all threads
//            copy the tile into shared memory (16-B loads when q and the cache are 16-B aligned,
//            2-B loads otherwise).
//   scores   thread (position j, rows 2i and 2i+1) dots q and k in f32, scaled to log2 units;
//            invisible (masked page, causal limit of the row) scores are -inf.
//   softmax  16 threads per row: max and sum by shuffles (xor 8..1, inside 16 lanes on 32- and
//            64-wide warps), online update from a finite initial max, P to shared memory
//            (f32 for HIGH, rounded to bf16 for FAST; the sums take the unrounded P).
//   P·V      thread owns 2 of the 512 columns for all 16 rows.
// A per-tensor FP8 cache (u8 codes, params.h) is copied the same way, 16 codes (16-B loads) or
// one code at a time, each e4m3 × kv_scale rounded to bf16 once (sparse_mla/gpu/fp8_kv.cuh) as
// it is stored to shared memory; the math after that is the bf16 path's.
#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/attention.cuh"
#include "kernels/common/gpu/convert.cuh"
#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/supports.h"
#include "kernels/mla_decode/gpu/common.cuh"
#include "kernels/mla_decode/gpu/launch.h"
#include "kernels/mla_decode/gpu/plan.h"
#include "kernels/sparse_mla/gpu/fp8_kv.cuh"

namespace attnd::kernels::mla_decode::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kBlockM = 16;      // query rows per CTA
constexpr int kBlockN = 32;      // positions per step
constexpr int kRowThreads = 16;  // softmax threads per row
constexpr int kPStride = 20;     // floats per position in P [kBlockN][kPStride] (16-B aligned)
static_assert(kThreads == kBlockN * kBlockM / 2, "scores: one position x two rows per thread");
static_assert(kThreads == kBlockM * kRowThreads, "softmax: kRowThreads threads per row");
static_assert(kThreads * 2 == kDimV, "P·V: two output columns per thread");
static_assert(kBlockN == 2 * kRowThreads, "softmax: two positions per thread");

template <int kDqk>
struct SimtTile {
  static constexpr int kChunks = kDqk / 8;  // 16-B chunks per row
  // Shared rows are kDqk + 8 elements: an odd number of 16-B units, so the 8 threads of a
  // quarter-warp reading one chunk of 8 consecutive rows hit 8 different bank groups.
  static constexpr int kPitch = kDqk + 8;
  static constexpr int kQBytes = kBlockM * kPitch * 2;  // bf16 [kBlockM][kPitch]
  static constexpr int kKBytes = kBlockN * kPitch * 2;  // bf16 [kBlockN][kPitch]
  static constexpr int kPBytes = kBlockN * kPStride * 4;
  static constexpr int kOffBytes = kBlockN * 8;                     // i64 per position
  static constexpr int kStatBytes = kBlockN * 4 + 3 * kBlockM * 4;  // position, alpha, m, l
  static constexpr int kSmemBytes = kQBytes + kKBytes + kPBytes + kOffBytes + kStatBytes;
  static_assert((kPitch * 2 / 16) % 2 == 1, "odd row pitch in 16-B units");
  static_assert((kQBytes + kKBytes + kPBytes) % 16 == 0, "aligned offsets");
};

// Copies a row of kDqk bf16 from global memory (or zeros when src is null) to shared memory,
// with `threads` threads starting at `lane`: 16-B pieces when kVec, else 2-B elements.
template <int kDqk, bool kVec>
__device__ __forceinline__ void CopyRowPiece(uint16_t* dst, const uint16_t* src, int piece) {
  if constexpr (kVec) {
    const uint4 v =
        src != nullptr ? *reinterpret_cast<const uint4*>(src + 8 * piece) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(dst + 8 * piece) = v;
  } else {
    dst[piece] = src != nullptr ? src[piece] : uint16_t{0};
  }
}

// Copies piece `piece` of a per-tensor FP8 cache row (kDqk codes at src, or zeros when src is
// null) to shared memory as bf16 (e4m3 × scale): 16 codes when kVec, else one.
template <bool kVec>
__device__ __forceinline__ void CopyFp8RowPiece(uint16_t* dst, const uint8_t* src, int piece,
                                                float scale) {
  if constexpr (kVec) {
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
    if (src != nullptr) {
      const uint4 codes = *reinterpret_cast<const uint4*>(src + 16 * piece);
      ::attnd::kernels::sparse_mla::gpu::DequantFp8x16(codes, scale, &lo, &hi);
    }
    *reinterpret_cast<uint4*>(dst + 16 * piece) = lo;
    *reinterpret_cast<uint4*>(dst + 16 * piece + 8) = hi;
  } else {
    dst[piece] = src != nullptr
                     ? ::attnd::gpu::FloatToBf16(::attnd::gpu::Fp8E4M3ToFloat(src[piece]) * scale)
                     : uint16_t{0};
  }
}

template <int kDqk, bool kVec, bool kFp8>
__global__ void __launch_bounds__(kThreads) MlaDecodeSimtKernel(const DecodeArgs a) {
  using Tile = SimtTile<kDqk>;
  constexpr int kPieces = kVec ? Tile::kChunks : kDqk;           // copy units per row
  constexpr int kKvPieces = kFp8 && kVec ? kDqk / 16 : kPieces;  // per cache row
  extern __shared__ uint4 smem_raw[];
  char* smem = reinterpret_cast<char*>(smem_raw);
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem);                  // [kBlockM][kPitch]
  uint16_t* k_s = reinterpret_cast<uint16_t*>(smem + Tile::kQBytes);  // [kBlockN][kPitch]
  float* p_s = reinterpret_cast<float*>(smem + Tile::kQBytes + Tile::kKBytes);
  int64_t* off_s = reinterpret_cast<int64_t*>(smem + Tile::kQBytes + Tile::kKBytes +
                                              Tile::kPBytes);    // [kBlockN]
  int32_t* pos_s = reinterpret_cast<int32_t*>(off_s + kBlockN);  // [kBlockN]
  float* alpha_s = reinterpret_cast<float*>(pos_s + kBlockN);    // [kBlockM]
  float* m_s = alpha_s + kBlockM;                                // [kBlockM]
  float* l_s = m_s + kBlockM;                                    // [kBlockM]

  const int tid = threadIdx.x;
  const WorkItem w = DecodeWorkItem(a, blockIdx.x, kBlockN);
  if (w.begin >= w.end) {
    WriteEmptyRows(a, w);
    return;
  }

  for (int i = tid; i < kBlockM * kPieces; i += kThreads) {
    const int r = i / kPieces;
    CopyRowPiece<kDqk, kVec>(q_s + r * Tile::kPitch,
                             r < w.nrows ? QueryRow(a, w.b, w.row0 + r) : nullptr, i % kPieces);
  }

  // Scores: position sj, rows 2·si and 2·si + 1 (rows past nrows see nothing).
  const int sj = tid % kBlockN, si = tid / kBlockN;
  int64_t limit[2];
  for (int k = 0; k < 2; ++k) {
    const int r = 2 * si + k;
    limit[k] = r < w.nrows ? RowLimit(a, w.seqlen, w.row0 + r) : 0;
  }
  // Softmax: row mr, positions mj and mj + 16. Every thread of a row keeps its m and l.
  const int mr = tid / kRowThreads, mj = tid % kRowThreads;
  float m_run = kInitialMax, l_run = 0.0f;
  // P·V: columns 2·tid and 2·tid + 1 of every row.
  float acc[kBlockM][2];
#pragma unroll
  for (int r = 0; r < kBlockM; ++r) acc[r][0] = acc[r][1] = 0.0f;

  for (int64_t t0 = w.begin; t0 < w.end; t0 += kBlockN) {
    if (tid < kBlockN) {
      const int64_t pos = t0 + tid;
      const int64_t off = pos < w.end ? TokenOffset(a, w.b, pos) : -1;
      off_s[tid] = off;
      pos_s[tid] = off >= 0 ? static_cast<int32_t>(pos) : -1;
    }
    __syncthreads();  // offsets visible; the previous tile's P·V is done with k_s and p_s
    for (int i = tid; i < kBlockN * kKvPieces; i += kThreads) {
      const int j = i / kKvPieces;
      const int64_t off = off_s[j];
      if constexpr (kFp8) {
        CopyFp8RowPiece<kVec>(k_s + j * Tile::kPitch, off >= 0 ? a.kv_fp8 + off : nullptr,
                              i % kKvPieces, a.kv_scale);
      } else {
        CopyRowPiece<kDqk, kVec>(k_s + j * Tile::kPitch, off >= 0 ? a.kv + off : nullptr,
                                 i % kPieces);
      }
    }
    __syncthreads();  // the tile (and, first time, q) is in shared memory

    {
      const uint4* kr = reinterpret_cast<const uint4*>(k_s + sj * Tile::kPitch);
      const uint4* q0 = reinterpret_cast<const uint4*>(q_s + (2 * si) * Tile::kPitch);
      const uint4* q1 = reinterpret_cast<const uint4*>(q_s + (2 * si + 1) * Tile::kPitch);
      float d0 = 0.0f, d1 = 0.0f;
#pragma unroll 8
      for (int c = 0; c < Tile::kChunks; ++c) {
        const uint4 kc = kr[c];
        d0 = Dot8(q0[c], kc, d0);
        d1 = Dot8(q1[c], kc, d1);
      }
      const int32_t pos = pos_s[sj];
      p_s[sj * kPStride + 2 * si] = pos >= 0 && pos < limit[0] ? d0 * a.scale_log2 : -INFINITY;
      p_s[sj * kPStride + 2 * si + 1] = pos >= 0 && pos < limit[1] ? d1 * a.scale_log2 : -INFINITY;
    }
    __syncthreads();  // scores complete

    // FAST: P·V with P rounded to bf16 (the sum keeps the unrounded P).
    {
      const SoftmaxRow row =
          SoftmaxTwoPositions<kRowThreads>(a, p_s, kPStride, mr, mj, m_run, l_run);
      l_run = row.l;
      m_run = row.m;
      if (mj == 0) alpha_s[mr] = row.alpha;
    }
    __syncthreads();  // P and alpha complete

#pragma unroll
    for (int r = 0; r < kBlockM; ++r) {
      const float alpha = alpha_s[r];
      acc[r][0] *= alpha;
      acc[r][1] *= alpha;
    }
    for (int j = 0; j < kBlockN; ++j) {
      const uint32_t v = reinterpret_cast<const uint32_t*>(k_s + j * Tile::kPitch)[tid];
      const float v0 = ::attnd::gpu::BitsToFloat(v << 16),
                  v1 = ::attnd::gpu::BitsToFloat(v & 0xffff0000u);
      const float4* pj = reinterpret_cast<const float4*>(p_s + j * kPStride);
#pragma unroll
      for (int r4 = 0; r4 < kBlockM / 4; ++r4) {
        const float4 p = pj[r4];
        const float pr[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          acc[4 * r4 + k][0] = fmaf(pr[k], v0, acc[4 * r4 + k][0]);
          acc[4 * r4 + k][1] = fmaf(pr[k], v1, acc[4 * r4 + k][1]);
        }
      }
    }
  }

  if (mj == 0) {
    m_s[mr] = m_run;
    l_s[mr] = l_run;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kBlockM; ++r) {
    if (r >= w.nrows) continue;
    const float l = l_s[r], inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (w.direct) {
      uint16_t* out = OutRow(a, w.b, w.row0 + r);
      out[2 * tid] = ::attnd::gpu::FloatToBf16(acc[r][0] * inv);
      out[2 * tid + 1] = ::attnd::gpu::FloatToBf16(acc[r][1] * inv);
    } else {
      const int64_t at = PartialRow(a, w.split, w.b, w.row0 + r);
      *reinterpret_cast<float2*>(a.partial_o + at * kDimV + 2 * tid) =
          make_float2(acc[r][0] * inv, acc[r][1] * inv);
    }
  }
  if (tid < w.nrows) {
    const float l = l_s[tid], m = m_s[tid];
    if (!w.direct) {
      a.partial_lse[PartialRow(a, w.split, w.b, w.row0 + tid)] =
          l > 0.0f ? m + log2f(l) : -INFINITY;
    } else if (a.lse != nullptr) {
      *LseAt(a, w.b, w.row0 + tid) = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
    }
  }
}

template <int kDqk, bool kVec, bool kFp8 = false>
KernelShape Shape() {
  KernelShape s;
  s.kernel = reinterpret_cast<const void*>(&MlaDecodeSimtKernel<kDqk, kVec, kFp8>);
  s.block_m = kBlockM;
  s.block_n = kBlockN;
  s.threads = kThreads;
  s.smem_bytes = SimtTile<kDqk>::kSmemBytes;
  s.blocks_per_sm = ::attnd::gpu::BlocksPerSm(s.kernel, s.threads, s.smem_bytes);
  return s;
}

}  // namespace

KernelShape SimtShape(const Params& p) {
  if (p.kv_is_fp8()) {  // 16-code loads need 16-byte aligned cache rows
    const bool vec =
        Bf16RowsAligned16(p.q) && Aligned(p.kv_cache.data, 16) && StridesMultipleOf(p.kv_cache, 16);
    if (p.q.dim(3) == 576) return vec ? Shape<576, true, true>() : Shape<576, false, true>();
    if (p.q.dim(3) == 512) return vec ? Shape<512, true, true>() : Shape<512, false, true>();
    return KernelShape{};
  }
  const bool vec = Bf16RowsAligned16(p.q) && Bf16RowsAligned16(p.kv_cache);
  if (p.q.dim(3) == 576) return vec ? Shape<576, true>() : Shape<576, false>();
  if (p.q.dim(3) == 512) return vec ? Shape<512, true>() : Shape<512, false>();
  return KernelShape{};
}

::attnd::gpu::Error LaunchMlaDecodeSimt(const Params& p, int splits, void* workspace,
                                        ::attnd::gpu::Stream stream) {
  return LaunchDecode(p, SimtShape(p), splits, workspace, stream);
}

}  // namespace attnd::kernels::mla_decode::gpu
