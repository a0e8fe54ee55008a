// The Hopper sparse MLA kernel (CUDA sm_90a: warpgroup MMA, mbarriers, setmaxnreg). A CTA of
// three warpgroups takes one token, 64 heads and one split of the token's slots, in blocks of
// 64 KV rows through two shared-memory stages:
//   WG2 (producer)  gathers each block's rows with 16-byte cp.async straight into the 128-byte
//                   swizzled layout (a masked row is stored as zeros, never read), writes the
//                   block's validity bits, and completes the stage's "full" mbarrier;
//                   it waits on the stage's "empty" mbarrier before refilling it. For pools
//                   larger than the L2 (decode) it asks the L2 for the next block's rows
//                   (cp.async.bulk.prefetch) a block ahead, so their cp.async wait on L2.
//                   kFp8 (the FP8 cache, d_qk 576): a warp per row, lane c loads code chunk c
//                   (16 e4m3, 16-byte ld.global.nc) and its tile's scale; kFp8RoundRows rows'
//                   loads are in flight before any is used; e4m3 × scale to bf16 (integer
//                   e4m3 decode and one bf16x2 multiply for power-of-two-like scales, the cvt
//                   chain otherwise: bit for bit fp8_kv.cuh's result) and st.shared into the
//                   same swizzled stage; the bf16 rope goes by cp.async. Then
//                   fence.proxy.async and a cp.async and a plain mbarrier arrive per thread.
//                   With H a multiple of 128 the launcher makes each token's two head groups
//                   a cluster of two CTAs that split every block's dequantisation: each
//                   stores its rows into both stages (st.async to the peer) and loads them
//                   through a rolling pipeline (docs/KERNELS.md "FP8 cache in CTA pairs").
//   WG0 (softmax)   S = Q·Kᵀ (m64n64k16, A = Q and B = K from shared memory), masks invalid
//                   slots to -inf, online softmax in log2 units (exp2 with sm_scale·log2e folded,
//                   running max from -1e30), P in bf16: HIGH as hi + lo (|P - hi - lo| <=
//                   2^-16·P, so O keeps f32-path accuracy), FAST rounded once (the row sums
//                   take the unrounded P in both); then O[:, 0:256] += P·V (m64n256k16, A = P
//                   from registers, B = V read N-major from the same rows; HIGH: 8 k-steps, hi
//                   then lo; FAST: 4). P and the per-row rescale factor go to shared memory
//                   for WG1.
//   WG1 (P·V right) O[:, 256:512] = alpha·O + P·V (m64n256k16, A = P from shared memory).
// WG0 issues P·V_L of block b-1 before Q·Kᵀ of block b and releases b-1's stage as soon as it
// completes, so the gather of b+1 overlaps Q·Kᵀ, softmax and P·V of b. Epilogue: O / l to bf16
// (or the split's f32 partial), LSE.
// The body (WgmmaAttention) takes the row source as a template parameter: SparseRows here (an
// index list per token), kernels/mla_decode/gpu/wgmma.cuh's PagedRows (a paged cache through a
// block table: the dense MLA decode).
// Instantiated in wgmma_d512.cu / wgmma_d576.cu / wgmma_fp8.cu; launched by wgmma.cu.
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/sparse_mla/gpu/wgmma.cuh is CUDA-only"
#endif

#include <math.h>
#include <stdint.h>

#include "kernels/common/gpu/attention/wgmma_softmax.cuh"
#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/mma_sync.cuh"
#include "kernels/common/gpu/tiles.h"
#include "kernels/common/gpu/vendor.h"
#include "kernels/common/gpu/wgmma.cuh"
#include "kernels/sparse_mla/gpu/common.cuh"
#include "kernels/sparse_mla/gpu/fp8_kv.cuh"
#include "kernels/sparse_mla/gpu/plan.h"

namespace attnd::kernels::sparse_mla::gpu {

template <int kDqk>
struct WgmmaTile {
  static_assert(kDqk == 512 || kDqk == 576, "d_qk 512 or 576");
  static constexpr int kThreads = 384;      // WG0 softmax + left P·V, WG1 right P·V, WG2 producer
  static constexpr int kBlockM = 64;        // rows of S and O: one wgmma M
  static constexpr int kBlockN = 64;        // KV rows per stage
  static constexpr int kSlabs = kDqk / 64;  // 64-column slabs of Q and K
  static constexpr uint32_t kSlabBytes = 64 * 128;
  static constexpr uint32_t kStageBytes = kSlabs * kSlabBytes;
  // Shared memory (bytes; every tile 1024-byte aligned): Q | KV stage 0 | KV stage 1 | P lo |
  // P hi (d512; d576 keeps P hi in the stage's rope slab, dead once Q·Kᵀ of the stage is
  // complete and refilled only after the stage's P·V) | alpha, row sum, row max | validity | bars.
  static constexpr uint32_t kQOffset = 0;
  static constexpr uint32_t kKvOffset = kQOffset + kSlabs * kSlabBytes;
  static constexpr uint32_t kPLoOffset = kKvOffset + 2 * kStageBytes;
  static constexpr bool kPHiInRope = kDqk == 576;
  static constexpr uint32_t kPHiOffset = kPLoOffset + kSlabBytes;  // d512 only
  static constexpr uint32_t kStatOffset = kPLoOffset + (kPHiInRope ? 1 : 2) * kSlabBytes;
  static constexpr uint32_t kAlphaOffset = kStatOffset;               // f32 [64]
  static constexpr uint32_t kSumOffset = kAlphaOffset + 4 * kBlockM;  // f32 [64]
  static constexpr uint32_t kMaxOffset = kSumOffset + 4 * kBlockM;    // f32 [64]
  static constexpr uint32_t kMaskOffset = kMaxOffset + 4 * kBlockM;  // u64 [2]: bit r = row r valid
  static constexpr uint32_t kBarOffset = kMaskOffset + 16;  // u64 full[2], empty[2], q_full
  static constexpr int kSmemBytes = static_cast<int>(kBarOffset + 5 * 8);
  // Registers per thread after setmaxnreg: 3·168 = 504 (the 384-thread launch cap) in total.
  static constexpr int kProducerRegs = 72, kSoftmaxRegs = 240, kPvRegs = 192;
  // FP8: the producer holds kFp8RoundRows rows of codes in registers; WG1 gives it 32 (at 96
  // the producer spilled 4 bytes, at 104 neither it nor WG1 at 160 spills).
  static constexpr int kProducerRegsFp8 = 104, kPvRegsFp8 = 160;
  // mbarrier counts: full = 128 cp.async arrivals (noinc) + 128 ordinary ones (they release
  // the validity bits and zero stores); empty = one arrival per consumer warp.
  static constexpr uint32_t kFullCount = 256, kEmptyCount = 8, kQCount = 128;
  // FP8: full = per producer thread one cp.async arrival (noinc: its rope copies) and one
  // ordinary one (after its stores and proxy fence).
  static constexpr uint32_t kFullCountFp8 = 256;
  // FP8: rows per producer warp (16 per block) whose loads are in flight together (5 registers
  // each: code chunk, scale).
  static constexpr int kFp8RoundRows = 8;

  static constexpr uint32_t PHiOffset(int stage) {
    return kPHiInRope ? kKvOffset + stage * kStageBytes + (kSlabs - 1) * kSlabBytes : kPHiOffset;
  }
  static constexpr int kLaunchRegs = kSm90Regs384;  // tiles.h
  static_assert(kProducerRegs + kSoftmaxRegs + kPvRegs <= 3 * kLaunchRegs, "register budget");
  static_assert(kProducerRegsFp8 + kSoftmaxRegs + kPvRegsFp8 <= 3 * kLaunchRegs, "register budget");
  static_assert(kProducerRegs <= kLaunchRegs && kProducerRegsFp8 <= kLaunchRegs &&
                    kSoftmaxRegs >= kLaunchRegs && kPvRegs >= kLaunchRegs &&
                    kPvRegsFp8 <= kLaunchRegs,
                "setmaxnreg: dec for the producer and FP8's WG1, inc for the others");
  static_assert(kSmemBytes <= kSm90MaxSmemBytes, "fits sm_90's 227 KiB of shared memory per block");
  static_assert(kSplitAlign % kBlockN == 0, "splits are whole KV blocks");
};

// Named barriers between WG0 and WG1 (256 threads each; 0 is __syncthreads).
enum WgmmaBarrier : uint32_t {
  kBarPFree = 1,   // WG1 -> WG0: P (smem), alpha and the previous block's P·V_R are done
  kBarPReady = 2,  // WG0 -> WG1: P and alpha of the current block are written
  kBarStats = 3,   // both: final row sums and maxima are written
};

namespace wgmma_internal {

// An empty asm that "changes" the descriptors: keeps the compiler from precomputing every
// k-step's descriptor of an unrolled loop (dozens of live 64-bit registers).
__device__ __forceinline__ void OpaqueDescriptors(uint64_t& a) { asm volatile("" : "+l"(a)); }
__device__ __forceinline__ void OpaqueDescriptors(uint64_t& a, uint64_t& b) {
  asm volatile("" : "+l"(a), "+l"(b));
}

// 16 bytes from global memory through the non-coherent path (read-only KV), without L1
// allocation (a gathered row is read once per CTA) and with a 256-byte L2 prefetch (the row's
// other chunks).
__device__ __forceinline__ uint4 LdgNc16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t LdgNc4(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

// e4m3 codes as bf16 bits: the sign to bit 15, exponent and mantissa (7 bits)
// to bits 4..10 give the bf16 value code·2^-120 exactly, subnormal codes included (they land in
// bf16's subnormal range). Bytes 0 and 1 of `w` (pair 0) or 2 and 3 (pair 1) as bf16x2, the
// first in bits 0..15. Integer ops only (the cvt chain's f16 -> f32 -> bf16 steps run on the
// slow conversion pipe); NaN codes are not valid input.
template <int kPair>
__device__ __forceinline__ uint32_t E4m3PairAsScaledBf16(uint32_t w) {
  // The pair's codes to bytes 1 and 3, zeros elsewhere.
  const uint32_t t = __byte_perm(w, 0u, kPair == 0 ? 0x1404u : 0x3424u);
  return (t & 0x80008000u) | ((t >> 4) & 0x07f007f0u);
}

// a·b per bf16 lane, rounded once to bf16 (sm_90 mul.rn.bf16x2; subnormals kept).
__device__ __forceinline__ uint32_t MulBf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Whether DequantFp8x16Int serves the f32 scale with bits `u`: 2^-110 <= |scale| < 2^8 (biased
// exponent 17..134: scale·2^120 finite, every code·scale normal in f32) and scale a bf16 (low 16
// bits 0; powers of two, which real quantisers write, always are).
__device__ __forceinline__ bool Bf16ScaleFastPath(uint32_t u) {
  return ((u >> 23) & 0xffu) - 17u < 118u && (u & 0xffffu) == 0;
}

// One 16-byte chunk of codes × scale as bf16 (columns 0..7 to *lo, 8..15 to *hi), the scale's
// f32 bits `scale_bits` passing Bf16ScaleFastPath: one bf16x2 multiply per pair of
// (code·2^-120)·(scale·2^120) (the exponent field raised by 120), the same real number as
// code·scale, rounded once. fp8_kv.cuh's DequantFp8x16 rounds code·scale to f32 and then to
// bf16, but a 4-bit times an 8-bit significand is exact in f32: bit for bit the same result.
__device__ __forceinline__ void DequantFp8x16Int(const uint4& codes, uint32_t scale_bits, uint4* lo,
                                                 uint4* hi) {
  const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
  const uint32_t scale2 = __byte_perm(scale_bits + (120u << 23), 0u, 0x3232u);
  uint32_t r[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    r[2 * i] = MulBf16x2(E4m3PairAsScaledBf16<0>(w[i]), scale2);
    r[2 * i + 1] = MulBf16x2(E4m3PairAsScaledBf16<1>(w[i]), scale2);
  }
  *lo = make_uint4(r[0], r[1], r[2], r[3]);
  *hi = make_uint4(r[4], r[5], r[6], r[7]);
}

// O / l of this thread's two rows (r0, r0 + 8) and 128 columns starting at `col0` to out (bf16)
// or to the split's partial (f32, rows with l > 0 only). kGuardRows: heads h >= h_end are
// padding and not stored (the ping-pong kernel at H < 64).
template <bool kGuardRows = false>
__device__ __forceinline__ void StoreO(const KernelArgs& a, const float (&o)[128], int64_t t,
                                       int split, int h_row0, int col0, const float (&l)[2],
                                       int h_end = 0) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t h = h_row0 + 8 * i;
    if (kGuardRows && h >= h_end) continue;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    if (a.splits == 1) {
      uint16_t* dst = a.out + t * a.out_stride_t + h * a.out_stride_h + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<uint32_t*>(dst + 8 * j) =
            ::attnd::gpu::ptx::PackBf16x2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      }
    } else if (l[i] > 0.0f) {
      float* dst = a.partial_o + PartialRow(a, split, t, h) * kDimV + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) =
            make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      }
    }
  }
}

}  // namespace wgmma_internal

// kExactP: Precision::kHigh, P·V as (P hi + P lo)·V (f32-path accuracy). false: Precision::kFast,
// P rounded to bf16 once (FlashMLA's numerics: relative error up to 2^-9 per weight), half the
// P·V MMAs and no P lo tile (kernels/common/precision.h).
// kFp8: KV from the FP8 cache (a.kv_fp8; d_qk 576), dequantised by the producer.
// Src: where the rows come from and where the results go (SparseRows below: an index list;
// kernels/mla_decode/gpu/wgmma.cuh: a paged cache through a block table). Src::Args is the
// argument block; Src::Begin(a) the CTA's work item (64 query rows, one split of their rows);
// Src::Blocks its 64-row KV blocks; Src::QueryBase / QueryStride the block's first query row
// and the stride between its rows; Src::LoadRow(a, w, block_begin, r) row block_begin + r of
// the work item as a handle (< 0: masked; it never reads past the work item's end);
// Src::RowPtr(a, row, col) column col of the handle's bf16 row; Src::PrefetchL2(a) whether to
// prefetch the next block's rows to L2; Src::StoreO / StoreLse the epilogue of block row r;
// Src::kTmaPages whether whole-page blocks come by TMA through `kv_map` (Src::WholePageBlock /
// TmaBlock: mla_decode's PagedRowsTma); Src::kPaddedRows whether a block may hold fewer than 64
// rows (Src::QueryRowPtr per row, null for a padding row; StoreO / StoreLse skip those rows:
// mla_decode's PagedRows at H < 64). kFp8 is SparseRows only.
template <int kDqk, bool kExactP, bool kFp8, class Src>
__device__ __forceinline__ void WgmmaAttention(const typename Src::Args& a,
                                               const void* kv_map = nullptr) {
  static_assert(!kFp8 || kDqk == kFp8DimQk, "the FP8 cache has d_qk 576");
#if ATTND_SM90A
  using Tile = WgmmaTile<kDqk>;
  using namespace ::attnd::gpu::wgmma;
  using ::attnd::gpu::ClusterCtaRank, ::attnd::gpu::ClusterNumCtas, ::attnd::gpu::ClusterSync,
      ::attnd::gpu::MapShared;
  using wgmma_internal::OpaqueDescriptors;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = SmemAddr(smem);
  if ((base & (kSwizzleAtomBytes - 1)) != 0) __trap();  // swizzle atoms need 1024-B alignment

  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform role
  const typename Src::Work w = Src::Begin(a);
  const int n_blocks = Src::Blocks(w);

  const uint32_t full_bar = base + Tile::kBarOffset;  // + 8·stage
  const uint32_t empty_bar = full_bar + 16;           // + 8·stage
  const uint32_t q_bar = full_bar + 32;
  // FP8 in CTA pairs (launched as clusters of two: the token's two 64-head groups; without a
  // cluster `pair` is 1): each CTA dequantises half of every block's rows into its own stage and,
  // by st.async, into its peer's (completing on the peer's full barrier), and the peer's
  // consumers also release this CTA's stages (empty barriers count both CTAs' warps).
  uint32_t pair = 1, rank = 0, peer_base = 0;
  if constexpr (kFp8) {
    pair = ClusterNumCtas();
    if (pair == 2) {
      rank = ClusterCtaRank();
      peer_base = MapShared(base, rank ^ 1u);
    }
  }
  if (tid == 0) {
    constexpr uint32_t kFull = kFp8 ? Tile::kFullCountFp8 : Tile::kFullCount;
    MbarInit(full_bar, kFull);
    MbarInit(full_bar + 8, kFull);
    MbarInit(empty_bar, pair * Tile::kEmptyCount);
    MbarInit(empty_bar + 8, pair * Tile::kEmptyCount);
    MbarInit(q_bar, Tile::kQCount);
    FenceMbarInit();
  }
  if (pair == 2) {
    ClusterSync();  // the peer's barriers are initialised before any remote operation
  } else {
    __syncthreads();
  }

  if (wg == 2) {
    // ---- Producer: thread (warp pw, lane) fills 16-byte chunk lane % 8 of every slab of rows
    // pw·16 + 4i + lane / 8 (i < 4): 8 threads per 128-byte slab row, conflict-free.
    SetMaxRegsDec<kFp8 ? Tile::kProducerRegsFp8 : Tile::kProducerRegs>();
    const int p = tid - 256, pw = p / 32, lane = p % 32, chunk = lane & 7;
    int rows[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) rows[i] = pw * 16 + 4 * i + (lane >> 3);
    if (n_blocks == 0) {  // both CTAs of a pair have the same blocks
      if (pair == 2) ClusterSync();
      return;
    }
    const uint16_t* q_tok = Src::QueryBase(a, w);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t* src = q_tok + static_cast<int64_t>(rows[i]) * Src::QueryStride(a) + chunk * 8;
      uint32_t bytes = 16;
      if constexpr (Src::kPaddedRows) {
        // A padding row (QueryRowPtr null: a block of fewer than 64 rows) is zero-filled by the
        // same cp.async (source size 0 reads nothing) from the block's row 0.
        const uint16_t* row = Src::QueryRowPtr(a, w, rows[i]);
        bytes = row != nullptr ? 16 : 0;
        src = (row != nullptr ? row : Src::QueryRowPtr(a, w, 0)) + chunk * 8;
      }
      const uint32_t dst = base + Tile::kQOffset + SwizzledOffset(rows[i], chunk);
#pragma unroll
      for (int s = 0; s < Tile::kSlabs; ++s) {
        CpAsync16(dst + s * Tile::kSlabBytes, src + s * 64, bytes);
      }
    }
    CpAsyncArriveNoinc(q_bar);

    if constexpr (kFp8) {
      // Warp pw fills rows pw·16 + i of each block; lane c dequantises code chunk c (columns
      // 16c..16c+15: slab c / 4, 16-byte chunks 2(c % 4) and + 1) with its tile's scale
      // (c / 8; wgmma_internal::DequantFp8x16Int); the rope is copied by cp.async. Odd slabs
      // store their high chunk first: the 8 lanes of a store phase then hit 8 distinct bank
      // groups. In a pair, CTA `rank` dequantises rows pw·16 + 8·rank + i (i < 8) and stores
      // each chunk into both CTAs' stages; its thread 0 expects the peer's bytes.
      const SlotRange& range = w.range;
      constexpr uint32_t kPeerBytes = 4 * 8 * kDimV * 2;  // 4 warps x 8 rows x 512 bf16
      constexpr int kRound = Tile::kFp8RoundRows;
      static_assert(16 % kRound == 0, "rounds split a warp's 16 rows");
      const int slab = lane >> 2;
      const bool swap = (slab & 1) != 0;
      const uint32_t chunk_first = 2 * (lane & 3) + (swap ? 1 : 0);
      const uint32_t slab_off = static_cast<uint32_t>(slab) * Tile::kSlabBytes;
      const uint32_t rope_off = (Tile::kSlabs - 1) * Tile::kSlabBytes;
      const int64_t code_byte = 16 * lane;
      const int64_t scale_byte = kFp8ScaleOffset + 4 * (lane >> 3);
      const int64_t rope_src_byte = kFp8RopeOffset + 16 * (lane & 7);
      // Lane l < 16 holds the KV row of row pw·16 + l of a block (-1: masked).
      auto load_row = [&](int b) {
        const int64_t i = range.begin + int64_t{Tile::kBlockN} * b + pw * 16 + lane;
        return lane < 16 ? LoadRow(a, range, i) : int32_t{-1};
      };
      // Lane l < 16's address of row pw·16 + l of a block whose rows `rows` holds (null: masked,
      // or no such block).
      auto row_ptr = [&](int32_t rows) {
        return rows >= 0 ? a.kv_fp8 + static_cast<int64_t>(rows) * a.kv_fp8_stride
                         : static_cast<const uint8_t*>(nullptr);
      };
      // Code chunk and scale of row first + i of the block whose row addresses `ptrs` holds
      // (zeros for a null address: it reads nothing). The shuffles do not depend on the
      // dequantisation, so they are issued ahead of it.
      uint4 codes[kRound];
      uint32_t scales[kRound];
      auto load_codes = [&](const uint8_t* ptrs, int first, int i) {
        const uint8_t* src = reinterpret_cast<const uint8_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(ptrs), first + i));
        if (src != nullptr) {  // warp-uniform
          codes[i] = wgmma_internal::LdgNc16(src + code_byte);
          scales[i] = wgmma_internal::LdgNc4(src + scale_byte);
        } else {
          codes[i] = make_uint4(0, 0, 0, 0);
          scales[i] = 0;
        }
      };
      // The block's validity bits (from `bits`) and its rope (bf16 already) by cp.async straight
      // to slab 8: lane l copies chunk l % 8 of rows 4i + l / 8 (zeros for a masked row); they
      // complete on the full barrier.
      auto mask_and_rope = [&](int stage, uint32_t stage_off, int32_t rows, uint32_t bits) {
        if (lane == 0) {
          *reinterpret_cast<uint16_t*>(smem + Tile::kMaskOffset + 8 * stage + 2 * pw) =
              static_cast<uint16_t>(bits);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 4 * i + lane / 8;
          const int32_t row = __shfl_sync(0xffffffffu, rows, j);
          const uint32_t dst =
              stage_off + rope_off + SwizzledOffset(static_cast<uint32_t>(pw * 16 + j), lane & 7);
          if (row >= 0) {
            CpAsync16(base + dst,
                      a.kv_fp8 + static_cast<int64_t>(row) * a.kv_fp8_stride + rope_src_byte, 16);
          } else {
            *reinterpret_cast<uint4*>(smem + dst) = make_uint4(0, 0, 0, 0);
          }
        }
      };
      // Row i of the loaded round as the two bf16 chunks its lane stores first and second:
      // odd-slab lanes swap their code halves, so the first store always takes the first
      // result. Power-of-two-like scales (what quantisers write): the integer decode and a
      // bf16x2 multiply per pair; else fp8_kv.cuh's cvt chain (the same bits where both apply).
      // Decided per row: a row's vote waits for that row's loads only.
      auto dequant = [&](int i, uint4* d0, uint4* d1) {
        const uint4 c =
            swap ? make_uint4(codes[i].z, codes[i].w, codes[i].x, codes[i].y) : codes[i];
        if (__all_sync(0xffffffffu, wgmma_internal::Bf16ScaleFastPath(scales[i]))) {
          wgmma_internal::DequantFp8x16Int(c, scales[i], d0, d1);
        } else {
          DequantFp8x16(c, ::attnd::gpu::BitsToFloat(scales[i]), d0, d1);
        }
      };
      // Rows first + i (i < kRound; first a multiple of 8, so row i has swizzle phase i) of the
      // stage at `stage_off`: each row's two chunks and their offsets to `put(i, off0, d0, off1,
      // d1)` (off0: the chunk this lane stores first).
      auto dequant_round = [&](uint32_t stage_off, int first, auto&& put) {
        const uint32_t row_base =
            stage_off + slab_off + static_cast<uint32_t>(pw * 16 + first) * kSwizzleRowBytes;
#pragma unroll
        for (int i = 0; i < kRound; ++i) {
          uint4 d0, d1;
          dequant(i, &d0, &d1);
          put(i, row_base + SwizzledOffset(i, chunk_first), d0,
              row_base + SwizzledOffset(i, chunk_first ^ 1u), d1);
        }
      };
      if (pair == 2) {
        // This CTA's rows of each warp's 16: one round of kRound (= 8) per block.
        static_assert(kRound == 8, "a pair splits each warp's 16 rows into two rounds");
        const int first = kRound * static_cast<int>(rank);
        // A rolling pipeline: as row i of a block is dequantised, row i of the next block is
        // loaded into its registers, so the loads are in flight under the dequantisation and
        // under the wait for the next stage. Row indices are loaded two blocks ahead.
        int32_t rows_cur = load_row(0);
        int32_t rows_next = n_blocks > 1 ? load_row(1) : int32_t{-1};
        {
          const uint8_t* ptrs = row_ptr(rows_cur);
#pragma unroll
          for (int i = 0; i < kRound; ++i) load_codes(ptrs, first, i);
        }
        for (int b = 0; b < n_blocks; ++b) {
          const int stage = b & 1;
          const int32_t rows_after = b + 2 < n_blocks ? load_row(b + 2) : int32_t{-1};
          const uint32_t bits = __ballot_sync(0xffffffffu, rows_cur >= 0) & 0xffffu;
          const uint32_t stage_off = Tile::kKvOffset + stage * Tile::kStageBytes;
          const uint32_t peer_full = peer_base + (full_bar - base) + 8 * stage;
          if (b >= 2) MbarWait(empty_bar + 8 * stage, ((b >> 1) - 1) & 1);
          mask_and_rope(stage, stage_off, rows_cur, bits);
          // The next block's rows: null addresses after the last block (nothing is read).
          const uint8_t* next_ptrs = row_ptr(rows_next);
          // Both CTAs' stages take the chunks.
          dequant_round(stage_off, first,
                        [&](int i, uint32_t off0, uint4 d0, uint32_t off1, uint4 d1) {
                          load_codes(next_ptrs, first, i);
                          *reinterpret_cast<uint4*>(smem + off0) = d0;
                          *reinterpret_cast<uint4*>(smem + off1) = d1;
                          StAsync16(peer_base + off0, d0, peer_full);
                          StAsync16(peer_base + off1, d1, peer_full);
                        });
          CpAsyncArriveNoinc(full_bar + 8 * stage);  // the rope copies
          FenceProxyAsync();  // the generic stores before the consumers' wgmma reads
          if (p == 0) {
            MbarArriveExpectTx(full_bar + 8 * stage, kPeerBytes);  // the peer's rows
          } else {
            MbarArrive(full_bar + 8 * stage);
          }
          rows_cur = rows_next;
          rows_next = rows_after;
        }
      } else {
        // One CTA per token and split: two rounds of kRound rows per block; a round's loads are
        // issued before the stage's wait (first round) or right after the previous round's
        // stores. (The rolling pipeline above measured slower here: docs/KERNELS.md.)
        int32_t kv_row = load_row(0);
        for (int b = 0; b < n_blocks; ++b) {
          const int stage = b & 1;
          const int32_t cur_row = kv_row;
          if (b + 1 < n_blocks) kv_row = load_row(b + 1);  // in flight under this block's gather
          const uint32_t bits = __ballot_sync(0xffffffffu, cur_row >= 0) & 0xffffu;
          const uint32_t stage_off = Tile::kKvOffset + stage * Tile::kStageBytes;
          const uint8_t* ptrs = row_ptr(cur_row);
#pragma unroll 1
          for (int first = 0; first < 16; first += kRound) {
#pragma unroll
            for (int i = 0; i < kRound; ++i) load_codes(ptrs, first, i);
            if (first == 0) {  // the first round's loads are in flight while the stage drains
              if (b >= 2) MbarWait(empty_bar + 8 * stage, ((b >> 1) - 1) & 1);
              mask_and_rope(stage, stage_off, cur_row, bits);
            }
            dequant_round(stage_off, first,
                          [&](int, uint32_t off0, uint4 d0, uint32_t off1, uint4 d1) {
                            *reinterpret_cast<uint4*>(smem + off0) = d0;
                            *reinterpret_cast<uint4*>(smem + off1) = d1;
                          });
          }
          CpAsyncArriveNoinc(full_bar + 8 * stage);  // the rope copies
          FenceProxyAsync();  // the generic stores before the consumers' wgmma reads
          MbarArrive(full_bar + 8 * stage);
        }
      }
      if (pair == 2) ClusterSync();  // the peer's last arrivals on this CTA's barriers
    } else {
      typename Src::Row kv_rows[4];
      // The block whose rows are in kv_rows into `stage` (`load(i)` first sets kv_rows[i] where
      // the caller has not): its validity bits, each valid row by cp.async (completing on the
      // full barrier: noinc), a masked row as zeros; then every thread's arrival (256 with the
      // cp.async ones).
      auto fill_stage = [&](int stage, auto&& load) {
        uint32_t bits = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          load(i);
          const uint32_t vote = __ballot_sync(0xffffffffu, kv_rows[i] >= 0);
#pragma unroll
          for (int sub = 0; sub < 4; ++sub) bits |= ((vote >> (8 * sub)) & 1u) << (4 * i + sub);
        }
        if (lane == 0) {
          *reinterpret_cast<uint16_t*>(smem + Tile::kMaskOffset + 8 * stage + 2 * pw) =
              static_cast<uint16_t>(bits);
        }
        const uint32_t stage_off = Tile::kKvOffset + stage * Tile::kStageBytes;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t off = stage_off + SwizzledOffset(rows[i], chunk);
          if (kv_rows[i] >= 0) {
            const uint16_t* src = Src::RowPtr(a, kv_rows[i], chunk * 8);
#pragma unroll
            for (int s = 0; s < Tile::kSlabs; ++s) {
              CpAsync16(base + off + s * Tile::kSlabBytes, src + s * 64, 16);
            }
          } else {
#pragma unroll
            for (int s = 0; s < Tile::kSlabs; ++s) {
              *reinterpret_cast<uint4*>(smem + off + s * Tile::kSlabBytes) = make_uint4(0, 0, 0, 0);
            }
          }
        }
        CpAsyncArriveNoinc(full_bar + 8 * stage);
        MbarArrive(full_bar + 8 * stage);
      };
      if constexpr (Src::kTmaPages) {
        // Whole-page blocks by TMA (Src::TmaBlock: one thread, kSlabs boxes of 64 rows x 64
        // columns, an out-of-range page id read as zeros); a block that is not one whole page
        // (the split's partial last block) by cp.async as below. Either way the stage's full
        // barrier takes 256 arrivals: for TMA thread 0's expect-tx arrival and 255 others.
        for (int b = 0; b < n_blocks; ++b) {
          const int stage = b & 1;
          if (b >= 2) MbarWait(empty_bar + 8 * stage, ((b >> 1) - 1) & 1);
          const uint32_t stage_off = Tile::kKvOffset + stage * Tile::kStageBytes;
          const int64_t block_begin = int64_t{Tile::kBlockN} * b;
          if (Src::WholePageBlock(a, w, block_begin)) {
            if (p == 0) {
              Src::TmaBlock(a, w, block_begin, kv_map, base + stage_off, Tile::kSlabs,
                            Tile::kSlabBytes, full_bar + 8 * stage,
                            smem + Tile::kMaskOffset + 8 * stage);
            }
            MbarArrive(full_bar + 8 * stage);
            if (p != 0) MbarArrive(full_bar + 8 * stage);
            continue;
          }
          fill_stage(stage, [&](int i) { kv_rows[i] = Src::LoadRow(a, w, block_begin, rows[i]); });
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) kv_rows[i] = Src::LoadRow(a, w, 0, rows[i]);
        for (int b = 0; b < n_blocks; ++b) {
          const int stage = b & 1;
          if (b >= 2) MbarWait(empty_bar + 8 * stage, ((b >> 1) - 1) & 1);
          fill_stage(stage, [](int) {});  // kv_rows loaded a block ahead (below)
          if (b + 1 < n_blocks) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              kv_rows[i] = Src::LoadRow(a, w, int64_t{Tile::kBlockN} * (b + 1), rows[i]);
            }
            // Pools larger than the L2 (a.prefetch_l2): block b + 1's rows into L2 (one thread
            // per row) while its stage is still in use, so its cp.async wait on L2, not HBM.
            // It pays on BF16 decode and not on the FP8 path, which does not do it
            // (docs/BENCHMARKS.md "Sparse MLA on Hopper").
            if (Src::PrefetchL2(a) && chunk == 0) {
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                if (kv_rows[i] >= 0) {
                  PrefetchL2(Src::RowPtr(a, kv_rows[i], 0), static_cast<uint32_t>(2 * kDqk));
                }
              }
            }
          }
        }
      }
    }
    return;
  }

  // ---- Consumers: warp w of the warpgroup owns rows 16w + lane/4 and + 8 of S and O.
  const int warp = (tid / 32) % 4, lane = tid % 32;
  const int r0 = 16 * warp + lane / 4;
  float* alpha_s = reinterpret_cast<float*>(smem + Tile::kAlphaOffset);
  float* sum_s = reinterpret_cast<float*>(smem + Tile::kSumOffset);
  float* max_s = reinterpret_cast<float*>(smem + Tile::kMaxOffset);
  float o[128];  // O[:, 0:256] (WG0) or O[:, 256:512] (WG1), wgmma accumulator layout

  if (wg == 0) {
    SetMaxRegsInc<Tile::kSoftmaxRegs>();
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    const int cq = 2 * (lane % 4);
    float m_run[2] = {kInitialMax, kInitialMax};  // log2 units (scores · sm_scale·log2e)
    float l_run[2] = {0.0f, 0.0f};                // this thread's share of the row sums
    uint32_t p_hi[4][4], p_lo[4][4];              // P of the last softmax as A fragments
    float s[32];
    float alpha[2];
    const uint64_t q_desc = SmemDescKMajor(base + Tile::kQOffset);
    auto stage_off = [](int stage) { return Tile::kKvOffset + stage * Tile::kStageBytes; };

    // S = Q·Kᵀ of the block in `stage` (one commit group).
    auto issue_qk = [&](int stage) {
      WgmmaSsOverSlabs<64, Tile::kSlabs>(s, q_desc, SmemDescKMajor(base + stage_off(stage)),
                                         Tile::kSlabBytes);
      WgmmaCommit();
    };
    // O_L += (P hi + P lo)·V_L of the block in `stage` (one commit group).
    auto issue_pv = [&](int stage) {
      uint64_t vd = SmemDescMnMajor(base + stage_off(stage), Tile::kSlabBytes);
#pragma unroll
      for (int kk = 0; kk < (kExactP ? 8 : 4); ++kk) {
        OpaqueDescriptors(vd);
        Wgmma<256, WgmmaA::kRegs>::Run<true>(o, kk < 4 ? p_hi[kk] : p_lo[kk - 4], vd, true);
        vd = kk == 3 ? vd - (3 * 2048 >> 4) : DescAdvance(vd, 2048);  // k-steps 0..3 twice
      }
      WgmmaCommit();
    };
    // Online softmax of the completed S: masked slots -inf, row max over the quad, the rescale
    // factor alpha, P in place of S, the row sums.
    auto softmax = [&](int stage) {
      const uint64_t mask =
          *reinterpret_cast<const uint64_t*>(smem + Tile::kMaskOffset + 8 * stage);
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = 8 * j + cq + (e & 1);
          if (((mask >> col) & 1u) == 0) s[4 * j + e] = -INFINITY;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
        }
      }
      WgmmaSoftmaxStep<32, !kExactP>(s, mx, a.scale_log2, m_run, l_run, alpha);
    };
    // P = hi + lo as A fragments; then (once WG1 is done with the previous ones) to shared
    // memory with alpha, and WG1 is told.
    auto publish_p = [&](int stage) {
      WgmmaPackP<4, kExactP>(s, p_hi, p_lo);
      NamedBarSync(kBarPFree, 256);
      uint8_t* p_hi_s = smem + Tile::PHiOffset(stage);
      uint8_t* p_lo_s = smem + Tile::kPLoOffset;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int row = r0 + 8 * (q & 1);
          const uint32_t off = SwizzledOffset(row, 2 * kk + (q >> 1)) + 4 * (lane % 4);
          *reinterpret_cast<uint32_t*>(p_hi_s + off) = p_hi[kk][q];
          if (kExactP) *reinterpret_cast<uint32_t*>(p_lo_s + off) = p_lo[kk][q];
        }
      }
      if (lane % 4 == 0) {
        alpha_s[r0] = alpha[0];
        alpha_s[r0 + 8] = alpha[1];
      }
      FenceProxyAsync();  // P (generic stores) before WG1's wgmma reads it
      NamedBarArrive(kBarPReady, 256);
    };

    if (n_blocks > 0) {
      // Block 0 (O is still zero: nothing to rescale).
      MbarWait(q_bar, 0);
      MbarWait(full_bar, 0);
      FenceProxyAsync();  // the cp.async fills (generic proxy) before wgmma reads them
      WgmmaFence();
      issue_qk(0);
      WgmmaWait<0>();
      FenceAccumulators(s);
      softmax(0);
      publish_p(0);
      // Block b: Q·Kᵀ of b and P·V_L of b - 1 in flight, softmax of b under the latter.
      // Block b: P·V_L of b - 1 first, so that its stage is released (and the gather of b + 1
      // starts) as early as possible; then Q·Kᵀ and softmax of b.
      for (int b = 1; b < n_blocks; ++b) {
        const int stage = b & 1;
        WgmmaFence();
        issue_pv(stage ^ 1);
        WgmmaWait<0>();
        FenceAccumulators(o);
        if (lane == 0) {
          MbarArrive(empty_bar + 8 * (stage ^ 1));
          if (pair == 2) MbarArriveRemote(peer_base + (empty_bar - base) + 8 * (stage ^ 1));
        }
        MbarWait(full_bar + 8 * stage, (b >> 1) & 1);
        FenceProxyAsync();
        WgmmaFence();
        issue_qk(stage);
        WgmmaWait<0>();
        FenceAccumulators(s);
        softmax(stage);
        // FAST's lazy max: most tiles leave every row's max (alpha exactly 1); a warp skips the
        // rescale when none of its rows moved. No accumulator is in flight here.
        if (kExactP || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
          for (int j = 0; j < 32; ++j) {
            o[4 * j + 0] *= alpha[0];
            o[4 * j + 1] *= alpha[0];
            o[4 * j + 2] *= alpha[1];
            o[4 * j + 3] *= alpha[1];
          }
        }
        publish_p(stage);
      }
      WgmmaFence();
      issue_pv((n_blocks - 1) & 1);
      WgmmaWait<0>();
      FenceAccumulators(o);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l_run[i] += ::attnd::gpu::ShflXor(l_run[i], 1);
      l_run[i] += ::attnd::gpu::ShflXor(l_run[i], 2);
    }
    if (lane % 4 == 0) {
      sum_s[r0] = l_run[0];
      sum_s[r0 + 8] = l_run[1];
      max_s[r0] = m_run[0];
      max_s[r0 + 8] = m_run[1];
    }
    NamedBarSync(kBarStats, 256);
    Src::StoreO(a, w, o, r0, cq, l_run);
    if (lane % 4 == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) Src::StoreLse(a, w, r0 + 8 * i, m_run[i], l_run[i]);
    }
  } else {
    // setmaxnreg.inc may not lower the count (illegal instruction): FP8's WG1 gives registers
    // to the producer, below the launch's kLaunchRegs.
    if constexpr (kFp8) {
      SetMaxRegsDec<Tile::kPvRegsFp8>();
    } else {
      SetMaxRegsInc<Tile::kPvRegs>();
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    const uint64_t p_lo_desc = SmemDescKMajor(base + Tile::kPLoOffset);
    for (int b = 0; b < n_blocks; ++b) {
      const int stage = b & 1;
      NamedBarArrive(kBarPFree, 256);
      NamedBarSync(kBarPReady, 256);
      FenceProxyAsync();  // the stage's fills, acquired through WG0, before wgmma reads them
      const float alpha0 = alpha_s[r0], alpha1 = alpha_s[r0 + 8];
      if (kExactP || __any_sync(0xffffffffu, alpha0 != 1.0f || alpha1 != 1.0f)) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          o[4 * j + 0] *= alpha0;
          o[4 * j + 1] *= alpha0;
          o[4 * j + 2] *= alpha1;
          o[4 * j + 3] *= alpha1;
        }
      }
      const uint32_t kv_off = Tile::kKvOffset + stage * Tile::kStageBytes;
      uint64_t vd = SmemDescMnMajor(base + kv_off + 4 * Tile::kSlabBytes, Tile::kSlabBytes);
      uint64_t pd = SmemDescKMajor(base + Tile::PHiOffset(stage));
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < (kExactP ? 8 : 4); ++kk) {  // k-steps 0..3 with P hi, then P lo
        OpaqueDescriptors(pd, vd);
        Wgmma<256, WgmmaA::kSmem>::Run<true>(o, pd, vd, true);
        pd = kk == 3 ? p_lo_desc : DescAdvance(pd, 32);
        vd = kk == 3 ? vd - (3 * 2048 >> 4) : DescAdvance(vd, 2048);
      }
      WgmmaCommit();
      WgmmaWait<0>();
      FenceAccumulators(o);
      if (lane == 0) {
        MbarArrive(empty_bar + 8 * stage);
        if (pair == 2) MbarArriveRemote(peer_base + (empty_bar - base) + 8 * stage);
      }
    }
    NamedBarSync(kBarStats, 256);
    const float l[2] = {sum_s[r0], sum_s[r0 + 8]};
    Src::StoreO(a, w, o, r0, kDimV / 2 + 2 * (lane % 4), l);
  }
  if (pair == 2) ClusterSync();  // the producer's matching sync is at the end of its loop
#else
  __trap();  // sm_90a only: GpuSupports refuses other devices
#endif
}

// WgmmaAttention's Src for sparse MLA: CTA blockIdx.x = token t x 64-head group, blockIdx.y =
// split; rows from t's index list (SplitSlots, LoadRow: masked when out of [0, S)).
struct SparseRows {
  using Args = KernelArgs;
  using Row = int32_t;                      // KV row, -1: masked
  static constexpr bool kTmaPages = false;  // rows from an index list: no TMA
  struct Work {
    int64_t t;
    int h0, split;
    SlotRange range;
  };
  static __device__ __forceinline__ Work Begin(const Args& a) {
    const int groups = a.heads / WgmmaTile<512>::kBlockM;
    Work w;
    w.t = blockIdx.x / groups;
    w.h0 = static_cast<int>(blockIdx.x % groups) * WgmmaTile<512>::kBlockM;
    w.split = blockIdx.y;
    w.range = SplitSlots(a, w.t, w.split);
    return w;
  }
  static __device__ __forceinline__ int Blocks(const Work& w) {
    constexpr int kN = WgmmaTile<512>::kBlockN;
    return static_cast<int>((w.range.end - w.range.begin + kN - 1) / kN);
  }
  static __device__ __forceinline__ const uint16_t* QueryBase(const Args& a, const Work& w) {
    return a.q + w.t * a.q_stride_t + static_cast<int64_t>(w.h0) * a.q_stride_h;
  }
  static __device__ __forceinline__ int64_t QueryStride(const Args& a) { return a.q_stride_h; }
  static constexpr bool kPaddedRows = false;  // every block has 64 rows (H % 64 == 0)
  // Every row of the block is a head (H is a multiple of 64).
  static __device__ __forceinline__ const uint16_t* QueryRowPtr(const Args& a, const Work& w,
                                                                int r) {
    return QueryBase(a, w) + static_cast<int64_t>(r) * a.q_stride_h;
  }
  static __device__ __forceinline__ Row LoadRow(const Args& a, const Work& w, int64_t block_begin,
                                                int r) {
    return ::attnd::kernels::sparse_mla::gpu::LoadRow(a, w.range, w.range.begin + block_begin + r);
  }
  static __device__ __forceinline__ const uint16_t* RowPtr(const Args& a, Row row, int col) {
    return a.kv + static_cast<int64_t>(row) * a.kv_stride + col;
  }
  static __device__ __forceinline__ bool PrefetchL2(const Args& a) { return a.prefetch_l2; }
  static __device__ __forceinline__ void StoreO(const Args& a, const Work& w, const float (&o)[128],
                                                int r, int col0, const float (&l)[2]) {
    wgmma_internal::StoreO(a, o, w.t, w.split, w.h0 + r, col0, l);
  }
  static __device__ __forceinline__ void StoreLse(const Args& a, const Work& w, int r,
                                                  float max_log2, float sum) {
    StoreRowLse(a, w.split, w.t, w.h0 + r, max_log2, sum);
  }
};

template <int kDqk, bool kExactP, bool kFp8>
__global__ void __launch_bounds__(384, 1) SparseMlaWgmmaKernel(const KernelArgs a) {
  WgmmaAttention<kDqk, kExactP, kFp8, SparseRows>(a);
}

// One instance's launch (main kernel only) and its shape on the current device.
template <int kDqk, bool kExactP = true, bool kFp8 = false>
::attnd::gpu::Error LaunchWgmmaInstance(const KernelArgs& a, ::attnd::gpu::Stream stream) {
  using Tile = WgmmaTile<kDqk>;
  const void* fn = reinterpret_cast<const void*>(&SparseMlaWgmmaKernel<kDqk, kExactP, kFp8>);
  const ::attnd::gpu::Error e = ::attnd::gpu::AllowDynamicSmem(fn, Tile::kSmemBytes);
  if (e != ::attnd::gpu::kSuccess) return e;
  const int groups = a.heads / Tile::kBlockM;
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(a.tokens) * groups),
                  static_cast<unsigned>(a.splits));
  if (kFp8 && groups % 2 == 0) {
    // The FP8 cache in CTA pairs: blockIdx.x 2i and 2i + 1 are one token's neighbouring head
    // groups (WgmmaAttention's `pair`).
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(Tile::kThreads, 1, 1);
    config.dynamicSmemBytes = static_cast<size_t>(Tile::kSmemBytes);
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, SparseMlaWgmmaKernel<kDqk, kExactP, kFp8>, a);
  }
  SparseMlaWgmmaKernel<kDqk, kExactP, kFp8><<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(a);
  return ::attnd::gpu::GetLastError();
}

template <int kDqk, bool kFp8 = false>
KernelShape WgmmaInstanceShape() {
  using Tile = WgmmaTile<kDqk>;
  KernelShape s;
  s.block_m = Tile::kBlockM;
  s.smem_bytes = Tile::kSmemBytes;
  s.ctas_per_sm = ::attnd::gpu::BlocksPerSm(
      reinterpret_cast<const void*>(&SparseMlaWgmmaKernel<kDqk, true, kFp8>), Tile::kThreads,
      Tile::kSmemBytes);
  return s;
}

// Both precisions of one d_qk (HIGH: kExactP true; FAST: false).
#define ATTND_SPARSE_MLA_WGMMA_INSTANCE(EXTERN, D)                                                \
  EXTERN template ::attnd::gpu::Error LaunchWgmmaInstance<D, true, false>(const KernelArgs&,      \
                                                                          ::attnd::gpu::Stream);  \
  EXTERN template ::attnd::gpu::Error LaunchWgmmaInstance<D, false, false>(const KernelArgs&,     \
                                                                           ::attnd::gpu::Stream); \
  EXTERN template KernelShape WgmmaInstanceShape<D, false>();
// The FP8 cache (d_qk 576), both precisions.
#define ATTND_SPARSE_MLA_WGMMA_FP8_INSTANCE(EXTERN)                                                \
  EXTERN template ::attnd::gpu::Error LaunchWgmmaInstance<576, true, true>(const KernelArgs&,      \
                                                                           ::attnd::gpu::Stream);  \
  EXTERN template ::attnd::gpu::Error LaunchWgmmaInstance<576, false, true>(const KernelArgs&,     \
                                                                            ::attnd::gpu::Stream); \
  EXTERN template KernelShape WgmmaInstanceShape<576, true>();

}  // namespace attnd::kernels::sparse_mla::gpu
