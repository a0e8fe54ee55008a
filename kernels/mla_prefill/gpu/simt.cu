// Portable SIMT MLA prefill (CUDA and HIP; f32 FMA, no tensor cores), any d_qk, d_v <= 256.
// A CTA takes 16 queries of one sequence and one head (schedule: common.cuh) and walks the keys
// the tile's last query sees, 32 at a time:
//   gather   q, k and v rows into shared memory (16-B loads when every tensor is 16-B aligned
//            and both head dims are multiples of 8, 2-B loads otherwise); keys past what the
//            tile sees are zero-filled, never read; rows are padded to an odd number of 16-B
//            units (zeros past d) so the 8 threads of a quarter-warp hit 8 bank groups.
//   scores   thread (key j, queries 2i and 2i + 1) dots q and k in f32, scaled to log2 units;
//            keys past a query's bottom-right causal limit are -inf.
//   softmax  16 threads per query: max and sum by shuffles (xor 8..1, inside 16 lanes on 32-
//            and 64-wide warps), online update from a finite initial max, P to shared memory
//            (f32 for HIGH, rounded to bf16 for FAST; the sums take the unrounded P).
//   P·V      thread owns a column pair of 8 queries (d_v <= 128: 4 queries).
#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/attention.cuh"
#include "kernels/common/gpu/convert.cuh"
#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/supports.h"
#include "kernels/mla_prefill/gpu/common.cuh"
#include "kernels/mla_prefill/gpu/launch.h"
#include "kernels/mla_prefill/gpu/plan.h"

namespace attnd::kernels::mla_prefill::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kBlockM = 16;      // queries per CTA
constexpr int kBlockN = 32;      // keys per step
constexpr int kRowThreads = 16;  // softmax threads per query
constexpr int kPStride = 20;     // floats per key in P [kBlockN][kPStride] (16-B aligned)
constexpr int kMaxPairs = 128;   // column pairs of d_v <= 256
static_assert(kThreads == kBlockN * kBlockM / 2, "scores: one key x two queries per thread");
static_assert(kThreads == kBlockM * kRowThreads, "softmax: kRowThreads threads per query");
static_assert(kBlockN == 2 * kRowThreads, "softmax: two keys per thread");

// Shared row pitch (bf16 elements) for head dim d: an odd number of 16-B units >= d.
__host__ __device__ constexpr int Pitch(int d) {
  const int units = (d + 7) / 8;
  return 8 * (units % 2 == 1 ? units : units + 1);
}

__host__ __device__ constexpr int SmemBytes(int d_qk, int d_v) {
  return (kBlockM + kBlockN) * Pitch(d_qk) * 2 + kBlockN * Pitch(d_v) * 2 + kBlockN * kPStride * 4 +
         4 * kBlockM * 4;  // alpha, m, l (+ spare)
}

// Copies `rows` rows of d elements into shared rows of `pitch` (all threads of the block):
// row r from src(r) or zeros when src(r) is null; elements [d, 8·ceil(d/8)) are zeroed.
template <bool kVec, class Src>
__device__ __forceinline__ void CopyRows(uint16_t* dst, int pitch, int rows, int d, Src src) {
  const int units = (d + 7) / 8;
  if constexpr (kVec) {  // d % 8 == 0 and 16-B aligned rows
    for (int i = threadIdx.x; i < rows * units; i += kThreads) {
      const int r = i / units, c = i % units;
      const uint16_t* s = src(r);
      *reinterpret_cast<uint4*>(dst + r * pitch + 8 * c) =
          s != nullptr ? *reinterpret_cast<const uint4*>(s + 8 * c) : make_uint4(0, 0, 0, 0);
    }
  } else {
    const int width = 8 * units;
    for (int i = threadIdx.x; i < rows * width; i += kThreads) {
      const int r = i / width, e = i % width;
      const uint16_t* s = src(r);
      dst[r * pitch + e] = s != nullptr && e < d ? s[e] : uint16_t{0};
    }
  }
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads) MlaPrefillSimtKernel(const PrefillArgs a) {
  const int pq = Pitch(a.d_qk), pv = Pitch(a.d_v);
  extern __shared__ uint4 smem_raw[];
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem_raw);      // [kBlockM][pq]
  uint16_t* k_s = q_s + kBlockM * pq;                         // [kBlockN][pq]
  uint16_t* v_s = k_s + kBlockN * pq;                         // [kBlockN][pv]
  float* p_s = reinterpret_cast<float*>(v_s + kBlockN * pv);  // [kBlockN][kPStride]
  float* alpha_s = p_s + kBlockN * kPStride;                  // [kBlockM]
  float* m_s = alpha_s + kBlockM;
  float* l_s = m_s + kBlockM;

  const int tid = threadIdx.x;
  const int64_t slot = blockIdx.x % a.slots, h = blockIdx.x / a.slots;
  int64_t b, tile;
  if (!FindTile(a, slot, &b, &tile)) return;
  const SeqRange s = SequenceRange(a, b);
  const int64_t row0 = tile * kBlockM;  // first query of the tile, in the sequence
  const int nrows = static_cast<int>(Min64(kBlockM, s.lq - row0));
  const int64_t key_end = KeyLimit(a, row0 + nrows - 1, s.lq, s.lk);  // keys the tile sees
  if (key_end == 0) {
    WriteEmptyRows(a, s.q0 + row0, nrows, h);
    return;
  }
  const int64_t kvh = h / a.group;

  CopyRows<kVec>(q_s, pq, kBlockM, a.d_qk, [&](int r) -> const uint16_t* {
    return r < nrows ? a.q + (s.q0 + row0 + r) * a.q_stride_t + h * a.q_stride_h : nullptr;
  });

  const int qunits = (a.d_qk + 7) / 8;
  const int sj = tid % kBlockN, si = tid / kBlockN;  // scores: key sj, queries 2·si, 2·si + 1
  int64_t limit[2];
  for (int k = 0; k < 2; ++k) {
    const int r = 2 * si + k;
    limit[k] = r < nrows ? KeyLimit(a, row0 + r, s.lq, s.lk) : 0;
  }
  const int mr = tid / kRowThreads, mj = tid % kRowThreads;  // softmax: query mr
  float m_run = kInitialMax, l_run = 0.0f;
  // P·V: column pair pc of queries [rq0, rq0 + rows_per_thread).
  const int pairs = (a.d_v + 1) / 2;
  const int pair_threads = pairs <= kMaxPairs / 2 ? kMaxPairs / 2 : kMaxPairs;
  const int rows_per_thread = kBlockM * pair_threads / kThreads;  // 4 or 8
  const int pc = tid % pair_threads, rq0 = (tid / pair_threads) * rows_per_thread;
  const bool pv_active = pc < pairs;
  float acc[8][2];
#pragma unroll
  for (int r = 0; r < 8; ++r) acc[r][0] = acc[r][1] = 0.0f;

  for (int64_t k0 = 0; k0 < key_end; k0 += kBlockN) {
    __syncthreads();  // the previous step's P·V is done with k_s, v_s and p_s
    const int64_t kn = Min64(kBlockN, key_end - k0);
    CopyRows<kVec>(k_s, pq, kBlockN, a.d_qk, [&](int j) -> const uint16_t* {
      return j < kn ? a.k + (s.k0 + k0 + j) * a.k_stride_t + kvh * a.k_stride_h : nullptr;
    });
    CopyRows<kVec>(v_s, pv, kBlockN, a.d_v, [&](int j) -> const uint16_t* {
      return j < kn ? a.v + (s.k0 + k0 + j) * a.v_stride_t + kvh * a.v_stride_h : nullptr;
    });
    __syncthreads();  // the tile (and, first time, q) is in shared memory

    {
      const uint4* kr = reinterpret_cast<const uint4*>(k_s + sj * pq);
      const uint4* q0 = reinterpret_cast<const uint4*>(q_s + (2 * si) * pq);
      const uint4* q1 = reinterpret_cast<const uint4*>(q_s + (2 * si + 1) * pq);
      float d0 = 0.0f, d1 = 0.0f;
      for (int c = 0; c < qunits; ++c) {
        const uint4 kc = kr[c];
        d0 = Dot8(q0[c], kc, d0);
        d1 = Dot8(q1[c], kc, d1);
      }
      const int64_t key = k0 + sj;
      p_s[sj * kPStride + 2 * si] = key < limit[0] ? d0 * a.scale_log2 : -INFINITY;
      p_s[sj * kPStride + 2 * si + 1] = key < limit[1] ? d1 * a.scale_log2 : -INFINITY;
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

    if (pv_active) {
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        if (r < rows_per_thread) {
          const float alpha = alpha_s[rq0 + r];
          acc[r][0] *= alpha;
          acc[r][1] *= alpha;
        }
      }
      for (int j = 0; j < kBlockN; ++j) {
        const uint32_t v = reinterpret_cast<const uint32_t*>(v_s + j * pv)[pc];
        const float v0 = ::attnd::gpu::BitsToFloat(v << 16),
                    v1 = ::attnd::gpu::BitsToFloat(v & 0xffff0000u);
        const float* pj = p_s + j * kPStride + rq0;
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          if (r < rows_per_thread) {
            acc[r][0] = fmaf(pj[r], v0, acc[r][0]);
            acc[r][1] = fmaf(pj[r], v1, acc[r][1]);
          }
        }
      }
    }
  }

  if (mj == 0) {
    m_s[mr] = m_run;
    l_s[mr] = l_run;
  }
  __syncthreads();
  if (pv_active) {
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      if (r >= rows_per_thread || rq0 + r >= nrows) continue;
      const float l = l_s[rq0 + r], inv = l > 0.0f ? 1.0f / l : 0.0f;
      uint16_t* out = OutRow(a, s.q0 + row0 + rq0 + r, h);
      out[2 * pc] = ::attnd::gpu::FloatToBf16(acc[r][0] * inv);
      if (2 * pc + 1 < a.d_v) out[2 * pc + 1] = ::attnd::gpu::FloatToBf16(acc[r][1] * inv);
    }
  }
  if (a.lse != nullptr && tid < nrows) {
    const float l = l_s[tid];
    *LseAt(a, s.q0 + row0 + tid, h) = l > 0.0f ? (m_s[tid] + log2f(l)) * kLn2 : -INFINITY;
  }
}

template <bool kVec>
KernelShape Shape(const Params& p) {
  return MakeKernelShape(reinterpret_cast<const void*>(&MlaPrefillSimtKernel<kVec>), kBlockM,
                         kThreads,
                         SmemBytes(static_cast<int>(p.q.dim(2)), static_cast<int>(p.v.dim(2))));
}

}  // namespace

KernelShape SimtShape(const Params& p) {
  const bool vec = p.q.dim(2) % 8 == 0 && p.v.dim(2) % 8 == 0 && Bf16RowsAligned16(p.q) &&
                   Bf16RowsAligned16(p.k) && Bf16RowsAligned16(p.v);
  return vec ? Shape<true>(p) : Shape<false>(p);
}

::attnd::gpu::Error LaunchMlaPrefillSimt(const Params& p, void* workspace,
                                         ::attnd::gpu::Stream stream) {
  return LaunchPrefill(p, SimtShape(p), workspace, stream);
}

}  // namespace attnd::kernels::mla_prefill::gpu
