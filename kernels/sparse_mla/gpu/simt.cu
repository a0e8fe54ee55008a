// Portable SIMT sparse MLA (CUDA and HIP; f32 FMA, no tensor cores). A CTA takes one token, 16
// of its heads (padded: rows past H are zero and never written) and one split of its slots, and
// walks the slots in chunks of 32 KV rows:
//   gather   8 threads per row, 16 B each, into shared memory; a masked row (slot past the range,
//            index < 0 or >= S) is zero-filled and never read. The next chunk is in flight in
//            registers while this one is computed.
//   scores   thread (row j, heads 2p and 2p+1) dots q and k in f32, scaled to log2 units.
//   softmax  the 32 threads of a head pair hold one chunk row each: max and sum by shuffles
//            (xor 16..1, inside 32 lanes on 32- and 64-wide warps); online update, P to smem
//            (f32 for HIGH, rounded to bf16 for FAST; the sums take the unrounded P).
//   P·V      thread owns 2 of the 512 columns for all 16 heads.
// An FP8 cache (d_qk 576) is gathered the same way (8 threads per row: 4 chunks of codes, the
// scales, 1 chunk of rope each) and dequantised to bf16 (fp8_kv.cuh) as it is stored to smem;
// so is a per-tensor FP8 cache (4 chunks of codes each, plus one of the 4 rope-code chunks for
// the first 4 threads at d_qk 576; every code × kv_scale).
#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/attention.cuh"
#include "kernels/common/gpu/convert.cuh"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/math.h"
#include "kernels/sparse_mla/gpu/common.cuh"
#include "kernels/sparse_mla/gpu/fp8_kv.cuh"
#include "kernels/sparse_mla/gpu/launch.h"
#include "kernels/sparse_mla/gpu/plan.h"

namespace attnd::kernels::sparse_mla::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kBlockM = 16;                      // heads per CTA
constexpr int kBlockN = 32;                      // KV rows per step
constexpr int kRowThreads = kThreads / kBlockN;  // gather threads per row
constexpr int kHeadPairs = kThreads / kBlockN;   // score threads: kBlockN rows x head pairs
static_assert(kHeadPairs * 2 == kBlockM, "a head pair per group of kBlockN threads");
static_assert(kThreads * 2 == kDimV, "P·V: two output columns per thread");
static_assert(kSplitAlign % kBlockN == 0, "splits are whole chunks");

template <int kDqk>
struct SimtTile {
  static constexpr int kRowChunks = kDqk / 8;                       // 16-B chunks per row
  static constexpr int kLoads = kRowChunks / kRowThreads;           // per gather thread per chunk
  static constexpr int kKvPitch = kDqk + 8;                         // odd number of 16-B units:
                                                                    // 8 rows hit 8 bank groups
  static constexpr int kQBytes = kBlockM * kDqk * 2;                // bf16 [kBlockM][kDqk]
  static constexpr int kKvBytes = kBlockN * kKvPitch * 2;           // bf16 [kBlockN][kKvPitch]
  static constexpr int kPBytes = kBlockN * kBlockM * 4;             // f32 P [kBlockN][kBlockM]
  static constexpr int kStatBytes = 3 * kBlockM * 4 + kBlockN * 4;  // alpha, l, m; row valid
  static constexpr int kSmemBytes = kQBytes + kKvBytes + kPBytes + kStatBytes;
  static_assert(kRowChunks % kRowThreads == 0, "whole chunks per gather thread");
  static_assert((kKvPitch * 2 / 16) % 2 == 1, "odd row pitch in 16-B units");
  // FP8 cache rows: code chunks g_sub + kRowThreads·i (i < kFp8Loads, all in scale tile i) and
  // rope chunk g_sub per gather thread.
  static constexpr int kFp8Loads = kFp8CodeChunks / kRowThreads;
  static_assert(kFp8Loads * kRowThreads == kFp8CodeChunks, "whole code chunks per thread");
  static_assert(kRowThreads == kFp8CodeChunksPerScale,
                "chunk i of every gather thread lies in scale tile i");
  static_assert(kRowThreads == kFp8RopeChunks, "one rope chunk per gather thread");
  // Per-tensor FP8 rows (kDqk codes): code chunks g_sub + kRowThreads·i (i < kFp8Loads) hold
  // the 512 latent columns; at d_qk 576 the 4 rope-code chunks go to gather threads 0..3.
  static constexpr int kPtRopeChunks = (kDqk - static_cast<int>(kDimV)) / 16;
  static_assert(kPtRopeChunks <= kRowThreads, "at most one rope-code chunk per gather thread");
};

// How the kernel reads kv (params.h): bf16 rows, FlashMLA FP8 rows (656 bytes, own scales) or
// per-tensor FP8 rows (kDqk codes × KernelArgs::kv_scale).
enum class Kv { kBf16, kFp8, kFp8PerTensor };

template <int kDqk, Kv kKv>
__global__ void __launch_bounds__(kThreads, 2) SparseMlaSimtKernel(const KernelArgs a) {
  constexpr bool kFp8 = kKv == Kv::kFp8;
  constexpr bool kPt = kKv == Kv::kFp8PerTensor;
  static_assert(!kFp8 || kDqk == kFp8DimQk, "the FP8 cache has d_qk 576");
  using Tile = SimtTile<kDqk>;
  extern __shared__ uint4 smem_raw[];
  char* smem = reinterpret_cast<char*>(smem_raw);
  uint4* q_s = reinterpret_cast<uint4*>(smem);                         // [kBlockM][kRowChunks]
  uint16_t* kv_s = reinterpret_cast<uint16_t*>(smem + Tile::kQBytes);  // [kBlockN][kKvPitch]
  float* p_s = reinterpret_cast<float*>(smem + Tile::kQBytes + Tile::kKvBytes);
  float* alpha_s = p_s + kBlockN * kBlockM;
  float* l_s = alpha_s + kBlockM;
  float* m_s = l_s + kBlockM;
  int* valid_s = reinterpret_cast<int*>(m_s + kBlockM);

  const int tid = threadIdx.x;
  const int groups = (a.heads + kBlockM - 1) / kBlockM;
  const int64_t t = blockIdx.x / groups;
  const int h0 = static_cast<int>(blockIdx.x % groups) * kBlockM;
  const int split = blockIdx.y;
  const SlotRange range = SplitSlots(a, t, split);

  const int j = tid % kBlockN, pair = tid / kBlockN;               // score / softmax role
  const int g_row = tid / kRowThreads, g_sub = tid % kRowThreads;  // gather role
  float m[2] = {kInitialMax, kInitialMax}, l[2] = {0.0f, 0.0f};    // heads 2·pair, 2·pair + 1
  float acc[kBlockM][2] = {};                                      // columns 2·tid, 2·tid + 1

  if (range.begin < range.end) {
    // Q rows of this head block (zero past H).
    const uint16_t* q_tok = a.q + t * a.q_stride_t;
    for (int e = tid; e < kBlockM * Tile::kRowChunks; e += kThreads) {
      const int h = e / Tile::kRowChunks, c = e % Tile::kRowChunks;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (h0 + h < a.heads) {
        v = *reinterpret_cast<const uint4*>(q_tok + static_cast<int64_t>(h0 + h) * a.q_stride_h +
                                            c * 8);
      }
      q_s[e] = v;
    }

    // The gather thread's row of the current chunk is in `cur` (loaded one chunk ahead): bf16
    // chunks, or (FP8) the code chunks, then the scales, then the rope chunk.
    constexpr int kCurLoads = kFp8  ? Tile::kFp8Loads + 2
                              : kPt ? Tile::kFp8Loads + (Tile::kPtRopeChunks > 0 ? 1 : 0)
                                    : Tile::kLoads;
    uint4 cur[kCurLoads];
    auto fetch = [&](int32_t row) {
#pragma unroll
      for (int i = 0; i < kCurLoads; ++i) cur[i] = make_uint4(0, 0, 0, 0);
      if (row < 0) return;
      if constexpr (kFp8) {
        const uint4* src =
            reinterpret_cast<const uint4*>(a.kv_fp8 + static_cast<int64_t>(row) * a.kv_fp8_stride);
#pragma unroll
        for (int i = 0; i < Tile::kFp8Loads; ++i) cur[i] = src[g_sub + kRowThreads * i];
        cur[Tile::kFp8Loads] = src[kFp8ScaleChunk];
        cur[Tile::kFp8Loads + 1] = src[kFp8RopeChunk0 + g_sub];
      } else if constexpr (kPt) {
        const uint4* src =
            reinterpret_cast<const uint4*>(a.kv_fp8 + static_cast<int64_t>(row) * a.kv_fp8_stride);
#pragma unroll
        for (int i = 0; i < Tile::kFp8Loads; ++i) cur[i] = src[g_sub + kRowThreads * i];
        if constexpr (Tile::kPtRopeChunks > 0) {
          if (g_sub < Tile::kPtRopeChunks) cur[Tile::kFp8Loads] = src[kFp8CodeChunks + g_sub];
        }
      } else {
        const uint16_t* src = a.kv + static_cast<int64_t>(row) * a.kv_stride;
#pragma unroll
        for (int i = 0; i < Tile::kLoads; ++i) {
          cur[i] = *reinterpret_cast<const uint4*>(src + (g_sub + kRowThreads * i) * 8);
        }
      }
    };
    int32_t row_cur = LoadRow(a, range, range.begin + g_row);
    int32_t row_next = LoadRow(a, range, range.begin + kBlockN + g_row);
    fetch(row_cur);

    for (int64_t pos = range.begin; pos < range.end; pos += kBlockN) {
      __syncthreads();  // the previous chunk's P·V is done with kv_s, p_s and alpha_s
      uint16_t* dst = kv_s + g_row * Tile::kKvPitch;
      if constexpr (kFp8) {
        // Code chunk c = g_sub + kRowThreads·i holds columns 16c .. 16c + 15, scale tile i.
#pragma unroll
        for (int i = 0; i < Tile::kFp8Loads; ++i) {
          uint4 lo, hi;
          DequantFp8x16(cur[i], Fp8Scale(cur[Tile::kFp8Loads], i), &lo, &hi);
          const int col = 16 * (g_sub + kRowThreads * i);
          *reinterpret_cast<uint4*>(dst + col) = lo;
          *reinterpret_cast<uint4*>(dst + col + 8) = hi;
        }
        *reinterpret_cast<uint4*>(dst + kDimV + 8 * g_sub) = cur[Tile::kFp8Loads + 1];
      } else if constexpr (kPt) {
        // Code chunk c holds columns 16c .. 16c + 15, all × kv_scale.
#pragma unroll
        for (int i = 0; i < Tile::kFp8Loads; ++i) {
          uint4 lo, hi;
          DequantFp8x16(cur[i], a.kv_scale, &lo, &hi);
          const int col = 16 * (g_sub + kRowThreads * i);
          *reinterpret_cast<uint4*>(dst + col) = lo;
          *reinterpret_cast<uint4*>(dst + col + 8) = hi;
        }
        if constexpr (Tile::kPtRopeChunks > 0) {
          if (g_sub < Tile::kPtRopeChunks) {
            uint4 lo, hi;
            DequantFp8x16(cur[Tile::kFp8Loads], a.kv_scale, &lo, &hi);
            const int col = static_cast<int>(kDimV) + 16 * g_sub;
            *reinterpret_cast<uint4*>(dst + col) = lo;
            *reinterpret_cast<uint4*>(dst + col + 8) = hi;
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < Tile::kLoads; ++i) {
          *reinterpret_cast<uint4*>(dst + (g_sub + kRowThreads * i) * 8) = cur[i];
        }
      }
      if (g_sub == 0) valid_s[g_row] = row_cur >= 0;
      __syncthreads();  // chunk rows, their validity (and Q) visible
      row_cur = row_next;
      fetch(row_cur);  // next chunk in flight during this one's math
      row_next = LoadRow(a, range, pos + 2 * kBlockN + g_row);

      // Scores of row j for heads 2·pair and 2·pair + 1, in log2 units; masked rows -inf.
      const uint4* k_row = reinterpret_cast<const uint4*>(kv_s + j * Tile::kKvPitch);
      const uint4* q0 = q_s + (2 * pair) * Tile::kRowChunks;
      const uint4* q1 = q0 + Tile::kRowChunks;
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 8
      for (int c = 0; c < Tile::kRowChunks; ++c) {
        const uint4 k = k_row[c];
        s0 = Dot8(q0[c], k, s0);
        s1 = Dot8(q1[c], k, s1);
      }
      const bool valid = valid_s[j] != 0;
      const float x[2] = {valid ? s0 * a.scale_log2 : -INFINITY,
                          valid ? s1 * a.scale_log2 : -INFINITY};
      // Online softmax over the chunk for both heads.
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float m_new = fmaxf(m[i], GroupMax<kBlockN>(x[i]));
        const float alpha = exp2f(m[i] - m_new);
        const float p = exp2f(x[i] - m_new);
        l[i] = l[i] * alpha + GroupSum<kBlockN>(p);
        m[i] = m_new;
        // FAST: P·V with P rounded to bf16 (the sum above keeps the unrounded P).
        p_s[j * kBlockM + 2 * pair + i] =
            a.exact_p ? p : ::attnd::gpu::Bf16ToFloat(::attnd::gpu::FloatToBf16(p));
        if (j == 0) alpha_s[2 * pair + i] = alpha;
      }
      __syncthreads();  // P and alpha visible

      // O[h][2·tid .. +1] = alpha_h · O + Σ_j P[j][h] · V[j][2·tid .. +1].
#pragma unroll
      for (int h = 0; h < kBlockM; ++h) {
        acc[h][0] *= alpha_s[h];
        acc[h][1] *= alpha_s[h];
      }
#pragma unroll 4
      for (int r = 0; r < kBlockN; ++r) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(kv_s + r * Tile::kKvPitch + 2 * tid);
        const float v0 = ::attnd::gpu::BitsToFloat(w << 16),
                    v1 = ::attnd::gpu::BitsToFloat(w & 0xffff0000u);
        const float4* p4 = reinterpret_cast<const float4*>(p_s + r * kBlockM);
#pragma unroll
        for (int h4 = 0; h4 < kBlockM / 4; ++h4) {
          const float4 p = p4[h4];
          const float ps[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[4 * h4 + i][0] = fmaf(ps[i], v0, acc[4 * h4 + i][0]);
            acc[4 * h4 + i][1] = fmaf(ps[i], v1, acc[4 * h4 + i][1]);
          }
        }
      }
    }
  }

  // Epilogue: per-head sum and max to smem, then O / l (or the split partial) and the LSE.
  if (j == 0) {
    l_s[2 * pair] = l[0];
    l_s[2 * pair + 1] = l[1];
    m_s[2 * pair] = m[0];
    m_s[2 * pair + 1] = m[1];
  }
  __syncthreads();
  const int col = 2 * tid;
#pragma unroll
  for (int h = 0; h < kBlockM; ++h) {
    if (h0 + h >= a.heads) break;
    const float sum = l_s[h];
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    if (a.splits == 1) {
      const uint32_t packed =
          static_cast<uint32_t>(::attnd::gpu::FloatToBf16(acc[h][0] * inv)) |
          (static_cast<uint32_t>(::attnd::gpu::FloatToBf16(acc[h][1] * inv)) << 16);
      *reinterpret_cast<uint32_t*>(a.out + t * a.out_stride_t +
                                   static_cast<int64_t>(h0 + h) * a.out_stride_h + col) = packed;
    } else if (sum > 0.0f) {
      float* dst = a.partial_o + PartialRow(a, split, t, h0 + h) * kDimV + col;
      dst[0] = acc[h][0] * inv;
      dst[1] = acc[h][1] * inv;
    }
  }
  if (tid < kBlockM && h0 + tid < a.heads) StoreRowLse(a, split, t, h0 + tid, m_s[tid], l_s[tid]);
}

template <int kDqk, Kv kKv = Kv::kBf16>
const void* SimtKernel() {
  return reinterpret_cast<const void*>(&SparseMlaSimtKernel<kDqk, kKv>);
}

template <int kDqk, Kv kKv = Kv::kBf16>
::attnd::gpu::Error LaunchSimt(const KernelArgs& a, int groups, ::attnd::gpu::Stream stream) {
  constexpr int kSmem = SimtTile<kDqk>::kSmemBytes;
  ::attnd::gpu::Error e = ::attnd::gpu::AllowDynamicSmem(SimtKernel<kDqk, kKv>(), kSmem);
  if (e != ::attnd::gpu::kSuccess) return e;
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(a.tokens) * groups),
                  static_cast<unsigned>(a.splits));
  SparseMlaSimtKernel<kDqk, kKv><<<grid, kThreads, kSmem, stream>>>(a);
  return ::attnd::gpu::GetLastError();
}

}  // namespace

KernelShape SimtShape(const Params& p) {
  KernelShape s;
  s.block_m = kBlockM;
  const bool d576 = p.q.dim(2) == 576;
  s.smem_bytes = d576 ? SimtTile<576>::kSmemBytes : SimtTile<512>::kSmemBytes;
  const bool pt = p.kv_is_fp8_per_tensor();
  const void* fn =
      p.kv_is_fp8() ? SimtKernel<576, Kv::kFp8>()
      : pt   ? (d576 ? SimtKernel<576, Kv::kFp8PerTensor>() : SimtKernel<512, Kv::kFp8PerTensor>())
      : d576 ? SimtKernel<576>()
             : SimtKernel<512>();
  s.ctas_per_sm = ::attnd::gpu::BlocksPerSm(fn, kThreads, s.smem_bytes);
  return s;
}

::attnd::gpu::Error LaunchSparseMlaSimt(const Params& p, int splits, void* workspace,
                                        ::attnd::gpu::Stream stream) {
  if (p.q.dim(0) == 0) return ::attnd::gpu::kSuccess;
  const KernelArgs a = MakeKernelArgs(p, splits, workspace);
  const int groups = CeilDiv(a.heads, kBlockM);
  const bool d576 = p.q.dim(2) == 576;
  ::attnd::gpu::Error e;
  if (p.kv_is_fp8()) {
    e = LaunchSimt<576, Kv::kFp8>(a, groups, stream);
  } else if (p.kv_is_fp8_per_tensor()) {
    e = d576 ? LaunchSimt<576, Kv::kFp8PerTensor>(a, groups, stream)
             : LaunchSimt<512, Kv::kFp8PerTensor>(a, groups, stream);
  } else {
    e = d576 ? LaunchSimt<576>(a, groups, stream) : LaunchSimt<512>(a, groups, stream);
  }
  if (e != ::attnd::gpu::kSuccess || splits == 1) return e;
  return LaunchSparseMlaCombine(p, splits, workspace, stream);
}

}  // namespace attnd::kernels::sparse_mla::gpu
