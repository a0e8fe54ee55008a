// The tensor-core indexer kernel (CUDA, sm_80+; H in {32, 64}, D in {64, 128}), shared by the
// prefill (kPaged = false) and paged (kPaged = true) operators.
//
// fp8 → f16 is exact, and on sm_90 ptxas lowers `mma.sync … e4m3` to exactly that conversion plus
// two HMMA.16816 per instruction; converting once per fragment instead and issuing f16 m16n8k16
// does the same arithmetic without re-converting shared operands.
//
// CTA: 8 warps, a block of kBlockM / H queries (their kBlockM (query, head) columns held in
// shared memory as f16) against a stream of 256-key tiles (fp8, cp.async, kStages deep). Warp w
// owns keys [32w, 32w + 32) of a tile: S = K·Qᵀ with the keys on the MMA's M side (two m16
// tiles, their A fragments converted once per tile and kept in registers) and the columns on N,
// B fragments read from shared memory. Per query and 16 heads: the full-D accumulators, then
// relu · weight summed in registers; a quad transpose-sum gives each lane one key's head sum,
// times the key's scale, stored (32 consecutive floats per warp).
//
// Head-dim permutation: the dot product is order-free, so lane (g, t) of an MMA owns, for the
// four k-steps of group q, the 16 contiguous head-dim values d ∈ 16t + 64q + [0, 16) of both
// operands (k-step s' uses d = 16t + 64q + 4s' + {0,1} for PTX k = 2t, 2t+1 and + {2,3} for
// k = 2t+8, 2t+9). A fragments are then one 16-B shared load per row and group, B fragments two.
#pragma once

#include <stdint.h>

#include "kernels/common/gpu/mma_sync.cuh"
#include "kernels/indexer_logits/gpu/common.cuh"

namespace attnd::kernels::indexer_logits::gpu {

using ::attnd::gpu::ptx::CpAsync16;
using ::attnd::gpu::ptx::CpAsync4;
using ::attnd::gpu::ptx::CpAsyncCommit;
using ::attnd::gpu::ptx::CpAsyncWait;
using ::attnd::gpu::ptx::Fp8x2ToHalf2;
using ::attnd::gpu::ptx::MmaF16;
using ::attnd::gpu::ptx::SmemAddr;

inline constexpr int kMmaThreads = 256;
inline constexpr int kMmaWarps = 8;
inline constexpr int kMmaBlockN = 256;  // keys per tile: 32 per warp
inline constexpr int kMmaKeysPerWarp = kMmaBlockN / kMmaWarps;
inline constexpr int kMmaMinCapability = 80;  // mma.sync m16n8k16 f16, cp.async

template <int kHeads, int kDim, int kBlockM, int kStages>
struct MmaLayout {
  static_assert(kHeads == 32 || kHeads == 64, "the tensor-core indexer needs H in {32, 64}");
  static_assert(kDim == 64 || kDim == 128, "the tensor-core indexer needs D in {64, 128}");
  static_assert(kBlockM % kHeads == 0 && kBlockM <= 256, "whole queries, <= 256 columns");
  static_assert(kStages >= 2, "at least double buffering");
  static constexpr int kQueries = kBlockM / kHeads;
  static constexpr int kGroups = kDim / 64;     // groups of four k-steps
  static constexpr int kSteps = kDim / 16;      // k-steps of 16
  static constexpr int kRowChunks = kDim / 16;  // 16-B chunks of an fp8 key row
  static constexpr int kTileBytes = kMmaBlockN * kDim;
  // Byte offsets in dynamic shared memory.
  static constexpr int kQ = 0;                                   // f16 [kBlockM][kDim]
  static constexpr int kK = kQ + kBlockM * kDim * 2;             // fp8 [kStages][256][kDim]
  static constexpr int kW = kK + kStages * kTileBytes;           // f32 [kBlockM]
  static constexpr int kScale = kW + kBlockM * 4;                // f32 [kStages][256]
  static constexpr int kLo = kScale + kStages * kMmaBlockN * 4;  // i64 [kQueries]
  static constexpr int kHi = kLo + kQueries * 8;                 // i64 [kQueries]
  static constexpr int kOk = kHi + kQueries * 8;                 // u8 [kStages][256]
  static constexpr int kBytes = kOk + kStages * kMmaBlockN;

  // Swizzled 16-B chunk positions (bank-conflict-free fragment loads, see the header comment).
  __device__ static int KeyChunk(int row, int chunk) {
    return kDim >= 128 ? chunk ^ ((row & 1) << 2) : chunk;
  }
  __device__ static int QueryChunk(int column, int chunk) { return chunk ^ (column & 1); }
};

// Issues the cp.async of keys [start, start + 256) (zero-filled past `uhi` or when masked) into
// `stage`, with their scales and validity flags.
template <int kHeads, int kDim, int kBlockM, int kStages, bool kPaged>
__device__ __forceinline__ void LoadKeyTile(const IndexerProblem& p, const BlockWork& w,
                                            int64_t start, int64_t uhi, int stage, uint8_t* smem) {
  using L = MmaLayout<kHeads, kDim, kBlockM, kStages>;
  uint8_t* tile = smem + L::kK + stage * L::kTileBytes;
  const uint8_t* fallback = kPaged ? p.cache : p.k;  // mapped and aligned; never read
#pragma unroll
  for (int it = 0; it < kMmaBlockN * L::kRowChunks / kMmaThreads; ++it) {
    const int idx = it * kMmaThreads + threadIdx.x;
    const int row = idx / L::kRowChunks, chunk = idx % L::kRowChunks;
    const int64_t n = start + row;
    const uint8_t* src = nullptr;
    const float* scale = nullptr;
    const bool valid = n < uhi && LocateKey<kPaged>(p, w.group, n, &src, &scale);
    CpAsync16<0>(SmemAddr(tile + row * kDim + 16 * L::KeyChunk(row, chunk)),
                 valid ? src + 16 * chunk : fallback, valid);
  }
  static_assert(kMmaBlockN == kMmaThreads, "one key's scale per thread");
  const int row = threadIdx.x;
  const int64_t n = start + row;
  const uint8_t* src = nullptr;
  const float* scale = nullptr;
  const bool valid = n < uhi && LocateKey<kPaged>(p, w.group, n, &src, &scale);
  float* scales = reinterpret_cast<float*>(smem + L::kScale) + stage * kMmaBlockN;
  CpAsync4(SmemAddr(scales + row), valid ? scale : reinterpret_cast<const float*>(fallback), valid);
  smem[L::kOk + stage * kMmaBlockN + row] = valid ? 1 : 0;
}

// The query block's q as f16 (swizzled columns) and its weights, into shared memory.
template <int kHeads, int kDim, int kBlockM, int kStages>
__device__ __forceinline__ void LoadQueryBlock(const IndexerProblem& p, const BlockWork& w,
                                               uint8_t* smem) {
  using L = MmaLayout<kHeads, kDim, kBlockM, kStages>;
  const int columns = w.count * kHeads;
  const uint8_t* q_block = p.q + w.group * p.q_group_stride + w.first * p.q_row_stride;
  for (int idx = threadIdx.x; idx < columns * L::kRowChunks; idx += kMmaThreads) {
    const int column = idx / L::kRowChunks, chunk = idx % L::kRowChunks;
    const int qi = column / kHeads, h = column % kHeads;
    const uint4 raw = *reinterpret_cast<const uint4*>(q_block + qi * p.q_row_stride +
                                                      h * p.q_head_stride + 16 * chunk);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t half2[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      half2[2 * i] = Fp8x2ToHalf2(words[i] & 0xffffu);
      half2[2 * i + 1] = Fp8x2ToHalf2(words[i] >> 16);
    }
    // f16 chunk 2·chunk holds d = 16·chunk + [0, 8), 2·chunk + 1 the next eight.
    uint8_t* col = smem + L::kQ + column * kDim * 2;
    *reinterpret_cast<uint4*>(col + 16 * L::QueryChunk(column, 2 * chunk)) =
        make_uint4(half2[0], half2[1], half2[2], half2[3]);
    *reinterpret_cast<uint4*>(col + 16 * L::QueryChunk(column, 2 * chunk + 1)) =
        make_uint4(half2[4], half2[5], half2[6], half2[7]);
  }
  const int64_t row0 = w.group * p.rows_per_group + w.first;
  float* weights = reinterpret_cast<float*>(smem + L::kW);
  for (int c = threadIdx.x; c < columns; c += kMmaThreads) {
    weights[c] = p.weights[(row0 + c / kHeads) * p.weights_stride + c % kHeads];
  }
}

// Warp `warp`'s 32 keys of the tile in `stage` against every query of the block: logits stored
// for keys in [start + 32·warp, …) below `uhi`.
template <int kHeads, int kDim, int kBlockM, int kStages, bool kPaged>
__device__ __forceinline__ void ScoreKeyTile(const IndexerProblem& p, const BlockWork& w,
                                             int64_t start, int64_t uhi, int stage,
                                             const uint8_t* smem) {
  using L = MmaLayout<kHeads, kDim, kBlockM, kStages>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // PTX groupID, threadID_in_group
  const int64_t key0 = start + warp * kMmaKeysPerWarp;
  if (key0 >= uhi) return;

  // A fragments of the warp's two m16 tiles (keys 16mt + g and 16mt + 8 + g), all k-steps.
  const uint8_t* tile = smem + L::kK + stage * L::kTileBytes;
  uint32_t a[2][L::kSteps][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * kMmaKeysPerWarp + 16 * mt + 8 * r + g;
#pragma unroll
      for (int q = 0; q < L::kGroups; ++q) {
        const uint4 raw =
            *reinterpret_cast<const uint4*>(tile + row * kDim + 16 * L::KeyChunk(row, t + 4 * q));
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          a[mt][4 * q + s][r] = Fp8x2ToHalf2(words[s] & 0xffffu);  // PTX k = 2t, 2t+1
          a[mt][4 * q + s][r + 2] = Fp8x2ToHalf2(words[s] >> 16);  // PTX k = 2t+8, 2t+9
        }
      }
    }
  }

  // This lane stores key 8t + g of the warp's 32 (the quad transpose-sum's order).
  const int my_key = warp * kMmaKeysPerWarp + 8 * t + g;
  const int64_t n = start + my_key;
  const float scale = reinterpret_cast<const float*>(smem + L::kScale)[stage * kMmaBlockN + my_key];
  const bool key_ok = smem[L::kOk + stage * kMmaBlockN + my_key] != 0;
  const int64_t* lo = reinterpret_cast<const int64_t*>(smem + L::kLo);
  const int64_t* hi = reinterpret_cast<const int64_t*>(smem + L::kHi);
  const float* weights = reinterpret_cast<const float*>(smem + L::kW);
  const int64_t row0 = w.group * p.rows_per_group + w.first;
  const int64_t key_end = key0 + kMmaKeysPerWarp < uhi ? key0 + kMmaKeysPerWarp : uhi;

#pragma unroll 1
  for (int qi = 0; qi < w.count; ++qi) {
    const int64_t row_lo = lo[qi], row_hi = hi[qi];
    const bool meets = (row_lo > key0 ? row_lo : key0) < (row_hi < key_end ? row_hi : key_end);
    if (!meets) {  // warp-uniform: no MMA, only the -inf of the cleaned columns
      if (n < uhi && p.clean) p.logits[(row0 + qi) * p.ld + n] = kNegInf;
      continue;
    }
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // Σ_h w·relu(s) of keys 16mt + 8r + g, [2mt + r]
#pragma unroll
    for (int np = 0; np < kHeads / 16; ++np) {
      float acc[2][2][4] = {};
#pragma unroll
      for (int q = 0; q < L::kGroups; ++q) {
        uint32_t b[2][8];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int column = qi * kHeads + 16 * np + 8 * nt + g;
          const uint8_t* col = smem + L::kQ + column * kDim * 2;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const uint4 v = *reinterpret_cast<const uint4*>(
                col + 16 * L::QueryChunk(column, 2 * t + 8 * q + hh));
            b[nt][4 * hh] = v.x;
            b[nt][4 * hh + 1] = v.y;
            b[nt][4 * hh + 2] = v.z;
            b[nt][4 * hh + 3] = v.w;
          }
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
              MmaF16(acc[mt][nt], a[mt][4 * q + s], b[nt][2 * s], b[nt][2 * s + 1]);
            }
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const float2 wh =
            *reinterpret_cast<const float2*>(weights + qi * kHeads + 16 * np + 8 * nt + 2 * t);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          part[2 * mt] += wh.x * fmaxf(acc[mt][nt][0], 0.0f) + wh.y * fmaxf(acc[mt][nt][1], 0.0f);
          part[2 * mt + 1] +=
              wh.x * fmaxf(acc[mt][nt][2], 0.0f) + wh.y * fmaxf(acc[mt][nt][3], 0.0f);
        }
      }
    }
    const float logit = QuadTransposeSum(part, t) * scale;
    if (n < uhi) {
      float* out = p.logits + (row0 + qi) * p.ld + n;
      if (key_ok && n >= row_lo && n < row_hi) {
        *out = logit;
      } else if (p.clean) {
        *out = kNegInf;
      }
    }
  }
}

template <int kHeads, int kDim, int kBlockM, int kStages, bool kPaged>
__global__ void __launch_bounds__(kMmaThreads, 1) IndexerMmaKernel(const IndexerProblem p) {
  using L = MmaLayout<kHeads, kDim, kBlockM, kStages>;
  extern __shared__ __align__(16) uint8_t smem[];
  const BlockWork w = DecodeBlock</*kLongestFirst=*/!kPaged>(p);
  int64_t* lo = reinterpret_cast<int64_t*>(smem + L::kLo);
  int64_t* hi = reinterpret_cast<int64_t*>(smem + L::kHi);
  if (static_cast<int>(threadIdx.x) < w.count) {
    RowWindow<kPaged>(p, w.group, w.first + threadIdx.x, &lo[threadIdx.x], &hi[threadIdx.x]);
  }
  __syncthreads();
  int64_t ulo, uhi;
  WindowUnion(lo, hi, w.count, w.c0, w.c1, &ulo, &uhi);
  if (p.clean) FillOutsideUnion(p, w, ulo, uhi);
  if (ulo >= uhi) return;
  LoadQueryBlock<kHeads, kDim, kBlockM, kStages>(p, w, smem);

  // kStages-deep pipeline: tile t lands in stage t % kStages; one commit group per tile (empty
  // past the last) so that wait_group<kStages - 1> always means "tile t has landed".
  const int64_t num_tiles = (uhi - ulo + kMmaBlockN - 1) / kMmaBlockN;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) {
      LoadKeyTile<kHeads, kDim, kBlockM, kStages, kPaged>(p, w, ulo + s * kMmaBlockN, uhi, s, smem);
    }
    CpAsyncCommit();
  }
  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    const int64_t ahead = tile + kStages - 1;  // its stage held tile - 1, finished last round
    if (ahead < num_tiles) {
      LoadKeyTile<kHeads, kDim, kBlockM, kStages, kPaged>(p, w, ulo + ahead * kMmaBlockN, uhi,
                                                          static_cast<int>(ahead % kStages), smem);
    }
    CpAsyncCommit();
    CpAsyncWait<kStages - 1>();
    __syncthreads();  // tile landed for every thread's copies; q block and flags visible
    ScoreKeyTile<kHeads, kDim, kBlockM, kStages, kPaged>(p, w, ulo + tile * kMmaBlockN, uhi,
                                                         static_cast<int>(tile % kStages), smem);
    __syncthreads();  // stage free for the load issued next round
  }
}

}  // namespace attnd::kernels::indexer_logits::gpu
