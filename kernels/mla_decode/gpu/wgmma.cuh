// The Hopper dense MLA decode kernel (CUDA sm_90a): the sparse MLA wgmma kernel
// (kernels/sparse_mla/gpu/wgmma.cuh, WgmmaAttention) with its rows taken from the paged cache
// instead of an index list. A CTA takes one request, 64 query rows (one MTP token's 64 heads: H
// is a multiple of 64, so a row block never straddles two tokens and shares one causal limit;
// or, in the padded instances, up to 64 rows of s_q · H < 64 where every row sees the same
// positions, PaddedRows) and one split of the positions the block sees, in 64-position blocks;
// position j of request b is row j % page_size of page block_table[b][j / page_size]. Untrusted
// data is masked as docs/CONTRACTS.md "Untrusted data" says: cache_seqlens clamped to [0,
// max_pages·page_size] (DecodeWorkItem), a page id outside [0, num_pages) masks its positions
// (never read, score -inf), nothing past the work item's end is read (block table entries
// included). Split-K partials and the combine are the mla_decode ones (common.cuh, combine.cu).
// Instantiated in wgmma_d512.cu / wgmma_d576.cu (padded: wgmma_pad_d512.cu / wgmma_pad_d576.cu);
// launched by wgmma.cu.
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/mla_decode/gpu/wgmma.cuh is CUDA-only"
#endif

#include <cuda.h>
#include <math.h>
#include <stdint.h>

#include <string>
#include <type_traits>

#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/tma.h"
#include "kernels/common/gpu/wgmma.cuh"
#include "kernels/mla_decode/gpu/common.cuh"
#include "kernels/mla_decode/gpu/plan.h"
#include "kernels/sparse_mla/gpu/wgmma.cuh"

namespace attnd::kernels::mla_decode::gpu {

inline constexpr int kWgmmaBlockM = 64;  // query rows per CTA: one wgmma M
inline constexpr int kWgmmaBlockN = 64;  // positions per KV block (and split unit)

// WgmmaAttention's Src for the paged cache (its interface: kernels/sparse_mla/gpu/wgmma.cuh).
// CTA blockIdx.x as DecodeWorkItem numbers it.
struct PagedRows {
  using Args = DecodeArgs;
  using Row = int64_t;  // element offset of the position's cache row, -1: masked
  using Work = WorkItem;
  static constexpr bool kTmaPages = false;
  static constexpr bool kPaddedRows = false;  // PaddedRows below: blocks of fewer than 64 rows
  static __device__ __forceinline__ Work Begin(const Args& a) {
    return DecodeWorkItem(a, blockIdx.x, kWgmmaBlockN);
  }
  static __device__ __forceinline__ int Blocks(const Work& w) {
    return static_cast<int>((w.end - w.begin + kWgmmaBlockN - 1) / kWgmmaBlockN);
  }
  // The block's rows are heads h0..h0 + 63 of one MTP token.
  static __device__ __forceinline__ const uint16_t* QueryBase(const Args& a, const Work& w) {
    return QueryRow(a, w.b, w.row0);
  }
  static __device__ __forceinline__ int64_t QueryStride(const Args& a) { return a.q_stride_h; }
  // Row r of the block, of any (MTP token, head) (the ping-pong kernel's form, which also takes
  // blocks of fewer than 64 rows when H < 64: rows past w.nrows are padding, null).
  static __device__ __forceinline__ const uint16_t* QueryRowPtr(const Args& a, const Work& w,
                                                                int r) {
    return r < w.nrows ? QueryRow(a, w.b, w.row0 + r) : nullptr;
  }
  // Position begin + block_begin + r: masked past the work item's end (the block table is then
  // not read: end <= seqlen <= max_pages·page_size keeps the entry inside the request's row)
  // and when its page id is out of [0, num_pages).
  static __device__ __forceinline__ Row LoadRow(const Args& a, const Work& w, int64_t block_begin,
                                                int r) {
    const int64_t pos = w.begin + block_begin + r;
    if (pos >= w.end) return -1;
    int64_t page, slot;
    if (a.page_size == 64) {  // the model's page: no 64-bit division
      page = pos >> 6;
      slot = pos & 63;
    } else {
      page = pos / a.page_size;
      slot = pos - page * a.page_size;
    }
    const int64_t id = a.block_table[w.b * a.table_stride_b + page * a.table_stride_page];
    if (id < 0 || id >= a.num_pages) return -1;
    return id * a.kv_stride_page + slot * a.kv_stride_slot;
  }
  static __device__ __forceinline__ const uint16_t* RowPtr(const Args& a, Row row, int col) {
    return a.kv + row + col;
  }
  static __device__ __forceinline__ bool PrefetchL2(const Args& a) { return a.prefetch_l2; }
  // O / l of this thread's block rows r, r + 8 and 128 columns from col0 (wgmma accumulator
  // layout) to out (bf16; w.direct) or the split's partial (f32, rows with l > 0 only).
  // kPaddedRows: rows past w.nrows are padding and not stored (PaddedRows below).
  template <bool kPaddedRows = false>
  static __device__ __forceinline__ void StoreO(const Args& a, const Work& w, const float (&o)[128],
                                                int r, int col0, const float (&l)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (kPaddedRows && r + 8 * i >= w.nrows) continue;
      const int32_t row = w.row0 + r + 8 * i;
      const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
      if (w.direct) {
        uint16_t* dst = OutRow(a, w.b, row) + col0;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          *reinterpret_cast<uint32_t*>(dst + 8 * j) =
              ::attnd::gpu::ptx::PackBf16x2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
        }
      } else if (l[i] > 0.0f) {
        float* dst = a.partial_o + PartialRow(a, w.split, w.b, row) * kDimV + col0;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          *reinterpret_cast<float2*>(dst + 8 * j) =
              make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
        }
      }
    }
  }
  // Block row r's LSE: the split's partial (log2, -inf when empty) or lse (natural log, -inf
  // when empty; skipped when absent).
  static __device__ __forceinline__ void StoreLse(const Args& a, const Work& w, int r,
                                                  float max_log2, float sum) {
    const int32_t row = w.row0 + r;
    const float lse2 = sum > 0.0f ? max_log2 + log2f(sum) : -INFINITY;
    if (!w.direct) {
      a.partial_lse[PartialRow(a, w.split, w.b, row)] = lse2;
    } else if (a.lse != nullptr) {
      *LseAt(a, w.b, row) = sum > 0.0f ? lse2 * kLn2 : -INFINITY;
    }
  }
};

// PagedRows with whole pages by TMA (page size 64; docs/KERNELS.md "Dense MLA decode by TMA"):
// the kernel's tensor map is the cache as [num_pages][64][d_qk] bf16 with its strides, boxes of
// 64 columns x 64 slots x 1 page, 128-byte swizzle (the stage's layout), out-of-range boxes read
// as zeros. A block that is one whole page of valid positions (block_begin 64-aligned, all 64
// positions before the work item's end) comes as kSlabs boxes at (64·slab, 0, page id); an id
// outside [0, num_pages) is sent as -1, a box wholly out of range, so the stage is zeros and
// its validity bits are 0, as the cp.async fill leaves a masked row. Other blocks (the split's
// last, partial one; a work item not 64-aligned) take the cp.async fill.
struct PagedRowsTma : PagedRows {
  static constexpr bool kTmaPages = true;
  static __device__ __forceinline__ bool WholePageBlock(const Args& a, const Work& w,
                                                        int64_t block_begin) {
    const int64_t pos = w.begin + block_begin;
    return a.page_size == 64 && (pos & 63) == 0 && pos + 64 <= w.end;
  }
  // One thread: the validity bits, the expect-tx arrival on `full_bar` for the whole stage, then
  // the boxes (their bytes complete the barrier's transaction count).
  static __device__ __forceinline__ void TmaBlock(const Args& a, const Work& w, int64_t block_begin,
                                                  const void* kv_map, uint32_t stage_addr,
                                                  int slabs, uint32_t slab_bytes, uint32_t full_bar,
                                                  uint8_t* mask) {
#if ATTND_SM90A  // the wgmma PTX layer is sm_90a-only (WgmmaAttention traps elsewhere)
    using namespace ::attnd::gpu::wgmma;
    const int64_t page = (w.begin + block_begin) >> 6;  // < max_pages: pos + 64 <= end <= capacity
    const int64_t id = a.block_table[w.b * a.table_stride_b + page * a.table_stride_page];
    const bool valid = id >= 0 && id < a.num_pages;
    *reinterpret_cast<uint64_t*>(mask) = valid ? ~uint64_t{0} : uint64_t{0};
    MbarArriveExpectTx(full_bar, static_cast<uint32_t>(slabs) * slab_bytes);
    const int32_t c2 = valid ? static_cast<int32_t>(id) : -1;  // num_pages < 2^31 (host check)
    for (int sl = 0; sl < slabs; ++sl) {
      TmaLoad3d(stage_addr + static_cast<uint32_t>(sl) * slab_bytes, kv_map, full_bar, 64 * sl, 0,
                c2);
    }
#endif
  }
  // The ping-pong kernel's half stage (kernels/sparse_mla/gpu/wgmma_pp.cuh): `slabs` boxes of
  // columns from 64·first_slab into `dst`, one thread's expect-tx arrival on `full_bar` for
  // them; no validity bits (the caller takes them from LoadRow).
  static __device__ __forceinline__ void TmaSlabs(const Args& a, const Work& w, int64_t block_begin,
                                                  const void* kv_map, uint32_t dst, int first_slab,
                                                  int slabs, uint32_t slab_bytes,
                                                  uint32_t full_bar) {
#if ATTND_SM90A
    using namespace ::attnd::gpu::wgmma;
    const int64_t page = (w.begin + block_begin) >> 6;
    const int64_t id = a.block_table[w.b * a.table_stride_b + page * a.table_stride_page];
    const int32_t c2 = id >= 0 && id < a.num_pages ? static_cast<int32_t>(id) : -1;
    MbarArriveExpectTx(full_bar, static_cast<uint32_t>(slabs) * slab_bytes);
    for (int sl = 0; sl < slabs; ++sl) {
      TmaLoad3d(dst + static_cast<uint32_t>(sl) * slab_bytes, kv_map, full_bar,
                64 * (first_slab + sl), 0, c2);
    }
#endif
  }
};

// The cache as a tensor map for PagedRowsTma (wgmma.cuh): page size 64, fewer than 2^31 pages
// (the kernel's page coordinate is an int32), bf16 [num_pages][64][d_qk] with the innermost
// dimension dense; the strides (bytes) multiples of 16, which GpuSupports' alignment rules
// already give. False (the cp.async kernel runs) when any of that fails or the driver refuses.
inline bool EncodeWgmmaKvMap(const Params& p, CUtensorMap* map) {
  const Tensor& kv = p.kv_cache;
  if (kv.dim(1) != 64 || kv.dim(0) < 1 || kv.dim(0) > int64_t{0x7fffffff} || kv.stride(2) != 1) {
    return false;
  }
  // One page: its stride means nothing (any value, 0 included), the packed one is mapped.
  const int64_t page_stride = kv.dim(0) == 1 ? 64 * kv.stride(1) : kv.stride(0);
  const uint64_t slot_bytes = static_cast<uint64_t>(kv.stride(1)) * 2;
  const uint64_t page_bytes = static_cast<uint64_t>(page_stride) * 2;
  if (kv.stride(1) <= 0 || page_stride <= 0 || slot_bytes % 16 != 0 || page_bytes % 16 != 0) {
    return false;
  }
  std::string why;
  return ::attnd::gpu::EncodeBf16Map3d(
      map, kv.data, {static_cast<uint64_t>(kv.dim(2)), 64, static_cast<uint64_t>(kv.dim(0))},
      {slot_bytes, page_bytes}, {64, 64, 1}, &why);
}

// A row source whose blocks may hold fewer than 64 rows (H < 64: the ping-pong kernel,
// kernels/sparse_mla/gpu/wgmma_pp.cuh, and the padded wgmma instances): rows past w.nrows are
// padding, their Q zero-filled (QueryRowPtr null; WgmmaAttention reads Q row by row where
// kPaddedRows), their O and LSE not stored. `Rows`: PagedRows or PagedRowsTma (whose own
// instances keep the unguarded epilogue and the strided Q load).
template <class Rows>
struct PaddedRows : Rows {
  static constexpr bool kPaddedRows = true;
  using Args = typename Rows::Args;
  using Work = typename Rows::Work;
  static __device__ __forceinline__ void StoreO(const Args& a, const Work& w, const float (&o)[128],
                                                int r, int col0, const float (&l)[2]) {
    Rows::template StoreO<true>(a, w, o, r, col0, l);
  }
  static __device__ __forceinline__ void StoreLse(const Args& a, const Work& w, int r,
                                                  float max_log2, float sum) {
    if (r < w.nrows) Rows::StoreLse(a, w, r, max_log2, sum);
  }
};

// kExactP: Precision::kHigh (P hi + lo); false: kFast (bf16 P). kPadded: H < 64, rows padded
// (PaddedRows).
template <int kDqk, bool kExactP, bool kPadded = false>
__global__ void __launch_bounds__(384, 1) MlaDecodeWgmmaKernel(const DecodeArgs a) {
  using Rows = std::conditional_t<kPadded, PaddedRows<PagedRows>, PagedRows>;
  ::attnd::kernels::sparse_mla::gpu::WgmmaAttention<kDqk, kExactP, false, Rows>(a);
}
// The same with whole pages by TMA through `kv_map` (PagedRowsTma).
template <int kDqk, bool kExactP, bool kPadded = false>
__global__ void __launch_bounds__(384, 1)
    MlaDecodeWgmmaTmaKernel(const DecodeArgs a, const __grid_constant__ CUtensorMap kv_map) {
  using Rows = std::conditional_t<kPadded, PaddedRows<PagedRowsTma>, PagedRowsTma>;
  ::attnd::kernels::sparse_mla::gpu::WgmmaAttention<kDqk, kExactP, false, Rows>(a, &kv_map);
}

// The shape of a wgmma decode kernel whose CTA is `Tile` (wgmma.cuh's or the ping-pong one's).
template <class Tile>
KernelShape WgmmaKernelShape(const void* kernel) {
  static_assert(Tile::kBlockM == kWgmmaBlockM && Tile::kBlockN == kWgmmaBlockN, "tile shape");
  KernelShape s;
  s.kernel = kernel;
  s.block_m = kWgmmaBlockM;
  s.block_n = kWgmmaBlockN;
  s.threads = Tile::kThreads;
  s.smem_bytes = Tile::kSmemBytes;
  s.blocks_per_sm = ::attnd::gpu::BlocksPerSm(s.kernel, s.threads, s.smem_bytes);
  return s;
}

// A wgmma decode launch: the instance `shape_of(true)` (whole pages by TMA, the kernel's second
// argument the cache's tensor map) where EncodeWgmmaKvMap takes the cache, else
// `shape_of(false)` (cp.async).
template <class ShapeOf>
::attnd::gpu::Error LaunchWgmmaDecode(const Params& p, ShapeOf shape_of, int splits,
                                      void* workspace, ::attnd::gpu::Stream stream,
                                      const DecodeLaunchOptions& options = {}) {
  CUtensorMap map;
  if (EncodeWgmmaKvMap(p, &map)) {
    return LaunchDecode(p, shape_of(true), splits, workspace, stream, &map, options);
  }
  return LaunchDecode(p, shape_of(false), splits, workspace, stream, nullptr, options);
}

// kTma: MlaDecodeWgmmaTmaKernel (launched with its tensor map as the second argument).
template <int kDqk, bool kExactP, bool kTma, bool kPadded = false>
KernelShape WgmmaDecodeShape() {
  return WgmmaKernelShape<::attnd::kernels::sparse_mla::gpu::WgmmaTile<kDqk>>(
      kTma ? reinterpret_cast<const void*>(&MlaDecodeWgmmaTmaKernel<kDqk, kExactP, kPadded>)
           : reinterpret_cast<const void*>(&MlaDecodeWgmmaKernel<kDqk, kExactP, kPadded>));
}

// Both precisions of one d_qk, with and without TMA (P: true for the padded instances).
#define ATTND_MLA_DECODE_WGMMA_INSTANCE_P(EXTERN, D, P)               \
  EXTERN template KernelShape WgmmaDecodeShape<D, true, false, P>();  \
  EXTERN template KernelShape WgmmaDecodeShape<D, false, false, P>(); \
  EXTERN template KernelShape WgmmaDecodeShape<D, true, true, P>();   \
  EXTERN template KernelShape WgmmaDecodeShape<D, false, true, P>();
#define ATTND_MLA_DECODE_WGMMA_INSTANCE(EXTERN, D) \
  ATTND_MLA_DECODE_WGMMA_INSTANCE_P(EXTERN, D, false)

}  // namespace attnd::kernels::mla_decode::gpu
