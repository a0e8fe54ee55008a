// The paged operator's Hopper kernel (sm_90a wgmma, fp8): the model's shape, D = 128 and cache
// blocks of 64 tokens, any H <= 128 (padded to 32, 64 or 128 heads with zero q and weights).
// CUDA only: compiles to nothing in the HIP check, and to a trap in the portable PTX.
//
// CTA: one warpgroup (128 threads) owns one request and a span of its cache blocks. q of the
// request's next_n tokens (fp8) and their weights sit in shared memory; cache blocks stream through
// a kStages-deep ring of 16-B cp.async copies (8 KB of keys and 256 B of scales per block). Per
// block and token: S = K·qᵀ on the tensor cores, wgmma m64nHk32 × 4 (keys on M, heads on N, both
// operands read from shared memory in the no-swizzle K-major core-matrix layout: 8 rows × 16 B
// contiguous, rows of a block of 8 at 1024-B apart, chunks along D at 128 B), then relu · weight
// summed over a thread's heads, a quad shuffle-sum over the rest, × the key's scale, stored.
// Positions at or past the token's visible length, and keys of masked pages, get -inf; blocks of
// the span past the longest visible length are filled with -inf without being read.
#if defined(ATTND_GPU_CUDA)

#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>

#include "kernels/common/gpu/wgmma.cuh"
#include "kernels/common/math.h"
#include "kernels/common/supports.h"
#include "kernels/indexer_logits/gpu/device_info.h"
#include "kernels/indexer_logits/gpu/ptx.cuh"
#include "kernels/indexer_logits_paged/gpu/launch.h"

namespace attnd::kernels::indexer_logits_paged::gpu {
namespace {

using indexer_logits::gpu::CpAsync16;
using indexer_logits::gpu::CpAsyncCommit;
using indexer_logits::gpu::CpAsyncWait;
using indexer_logits::gpu::CurrentDeviceSmCount;
using indexer_logits::gpu::SharedAddress;

constexpr int kThreads = 128;  // one warpgroup
constexpr int kBlock = 64;     // tokens per cache block: the MMA's M
constexpr int kDim = 128;
constexpr int kKeyBytes = kBlock * kDim;             // 8192
constexpr int kStageBytes = kKeyBytes + 4 * kBlock;  // keys then scales, as in the cache
constexpr int kStages = 4;
constexpr int kMaxQBytes = 64 * 1024;  // next_n · padded H · D
constexpr int64_t kMinSpan = 8;        // cache blocks per CTA, at least (where there are)

struct WgmmaProblem {
  const uint8_t* q;
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  const uint8_t* cache;
  int64_t cache_stride, num_pages;
  const int32_t* block_table;
  int64_t table_stride;
  const int32_t* context_lens;
  int64_t context_stride;
  const float* weights;
  int64_t weights_stride;
  float* logits;
  int64_t ld, num_cols, visible_cap;
  int next_n, heads;
  int64_t col_blocks;  // ceil(num_cols / 64)
  int64_t span;        // cache blocks per CTA
  int64_t spans;       // CTAs per request
};

// Shared memory: the ring, then q (fp8, core-matrix layout) and the weights (f32, zero-padded).
__host__ __device__ constexpr int QOffset() { return kStages * kStageBytes; }
__host__ __device__ constexpr int QBytes(int next_n, int hp) { return next_n * hp * kDim; }
__host__ __device__ constexpr int SmemBytes(int next_n, int hp) {
  return QOffset() + QBytes(next_n, hp) + 4 * next_n * hp;
}

#if ATTND_SM90A

using ::attnd::gpu::wgmma::FenceAccumulators;
using ::attnd::gpu::wgmma::FenceProxyAsync;
using ::attnd::gpu::wgmma::WgmmaCommit;
using ::attnd::gpu::wgmma::WgmmaFence;
using ::attnd::gpu::wgmma::WgmmaWait;

// Byte offset of row r (key or head), 16-B chunk c in the core-matrix layout.
__device__ __forceinline__ int CoreOffset(int r, int c) {
  return (r >> 3) * 1024 + c * 128 + (r & 7) * 16;
}

// Shared-memory matrix descriptor, no swizzle: LBO = 128 B (next 16-B chunk along K), SBO =
// 1024 B (next 8 rows along M or N).
__device__ __forceinline__ uint64_t Descriptor(const void* smem) {
  const uint64_t address = SharedAddress(smem);
  return ((address & 0x3ffff) >> 4) | (uint64_t{128 >> 4} << 16) | (uint64_t{1024 >> 4} << 32);
}

// d[N / 2] += A(64×32, e4m3, shared) · B(N×32, e4m3, shared)ᵀ, f32 accumulators.
__device__ __forceinline__ void Wgmma32(float* d, uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(1));
}

__device__ __forceinline__ void Wgmma64(float* d, uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(1));
}

__device__ __forceinline__ void Wgmma128(float* d, uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%"
      "48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(a), "l"(b), "r"(1));
}

template <int kHp>
__device__ __forceinline__ void Mma(float* d, uint64_t a, uint64_t b) {
  if constexpr (kHp == 32) {
    Wgmma32(d, a, b);
  } else if constexpr (kHp == 64) {
    Wgmma64(d, a, b);
  } else {
    Wgmma128(d, a, b);
  }
}

constexpr float kNegInf = -INFINITY;

__device__ __forceinline__ int64_t Visible(const WgmmaProblem& p, int64_t context, int j) {
  const int64_t l = context - p.next_n + j + 1;
  return l < 0 ? 0 : (l > p.visible_cap ? p.visible_cap : l);
}

// Issues the copies of cache block `blk` of request b into `stage`: keys into the core-matrix
// layout, scales as they are; zero fill (nothing read) when the table entry is masked.
__device__ __forceinline__ void LoadBlock(const WgmmaProblem& p, int64_t b, int64_t blk,
                                          uint8_t* stage) {
  const int32_t page = p.block_table[b * p.table_stride + blk];
  const bool ok = page >= 0 && page < p.num_pages;
  const uint8_t* src = p.cache + (ok ? static_cast<int64_t>(page) : 0) * p.cache_stride;
  // 8 consecutive threads fill one 128-B row of core matrices (no bank conflicts).
#pragma unroll
  for (int it = 0; it < kKeyBytes / 16 / kThreads; ++it) {
    const int idx = it * kThreads + static_cast<int>(threadIdx.x);
    const int key = (idx & 7) | ((idx >> 6) << 3), chunk = (idx >> 3) & 7;
    CpAsync16(stage + CoreOffset(key, chunk), src + key * kDim + chunk * 16, ok);
  }
  if (threadIdx.x < 4 * kBlock / 16) {
    CpAsync16(stage + kKeyBytes + 16 * threadIdx.x, src + kKeyBytes + 16 * threadIdx.x, ok);
  }
}

#endif  // ATTND_SM90A

template <int kHp>
__global__ void __launch_bounds__(kThreads) PagedWgmmaKernel(const WgmmaProblem p) {
#if ATTND_SM90A
  extern __shared__ __align__(128) uint8_t smem[];
  const int64_t b = blockIdx.x / p.spans;
  const int64_t blk0 = (blockIdx.x % p.spans) * p.span;
  const int64_t blk1 = blk0 + p.span < p.col_blocks ? blk0 + p.span : p.col_blocks;
  const int64_t context = p.context_lens[b * p.context_stride];
  const int64_t longest = Visible(p, context, p.next_n - 1);
  int64_t load_end = (longest + kBlock - 1) / kBlock;
  load_end = load_end < blk1 ? load_end : blk1;
  load_end = load_end > blk0 ? load_end : blk0;
  {  // -inf on the span's columns past the longest visible length (their blocks are not read)
    const int64_t c0 = load_end * kBlock,
                  c1 = blk1 * kBlock < p.num_cols ? blk1 * kBlock : p.num_cols;
    for (int j = 0; j < p.next_n; ++j) {
      float* row = p.logits + (b * p.next_n + j) * p.ld;
      for (int64_t n = c0 + threadIdx.x; n < c1; n += kThreads) row[n] = kNegInf;
    }
  }
  if (blk0 >= load_end) return;
  const int64_t num = load_end - blk0;

  // kStages-deep ring: block i lands in stage i % kStages; one commit group per block (empty past
  // the last) so that wait_group<kStages - 1> always means "block i has landed".
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num) LoadBlock(p, b, blk0 + s, smem + s * kStageBytes);
    CpAsyncCommit();
  }

  // q (zero heads past H) and the weights (zero past H), staged once.
  uint8_t* qs = smem + QOffset();
  float* ws = reinterpret_cast<float*>(qs + QBytes(p.next_n, kHp));
  const int q_chunks = p.next_n * kHp * (kDim / 16);
  for (int idx = threadIdx.x; idx < q_chunks; idx += kThreads) {
    const int j = idx / (kHp * 8), rem = idx % (kHp * 8);
    const int h = (rem & 7) | ((rem >> 6) << 3), c = (rem >> 3) & 7;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h < p.heads) {
      v = *reinterpret_cast<const uint4*>(p.q + b * p.q_batch_stride + j * p.q_row_stride +
                                          h * p.q_head_stride + 16 * c);
    }
    *reinterpret_cast<uint4*>(qs + j * kHp * kDim + CoreOffset(h, c)) = v;
  }
  for (int idx = threadIdx.x; idx < p.next_n * kHp; idx += kThreads) {
    const int j = idx / kHp, h = idx % kHp;
    ws[idx] = h < p.heads ? p.weights[(b * p.next_n + j) * p.weights_stride + h] : 0.0f;
  }
  FenceProxyAsync();  // q is read by the tensor cores; the loop's first barrier orders it

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Accumulator rows of this thread: keys 16·warp + g and + 8; lane t = 0 stores the first, t = 1
  // the second (the quad sum leaves both in every lane of the quad).
  const int my_key = 16 * warp + g + ((t & 1) ? 8 : 0);
  const bool storer = t < 2;
  for (int64_t i = 0; i < num; ++i) {
    const int64_t ahead = i + kStages - 1;  // its stage held block i - 1, finished last round
    if (ahead < num) {
      LoadBlock(p, b, blk0 + ahead, smem + static_cast<int>(ahead % kStages) * kStageBytes);
    }
    CpAsyncCommit();
    CpAsyncWait<kStages - 1>();
    FenceProxyAsync();  // this thread's copies, read next by the tensor cores
    __syncthreads();
    const uint8_t* stage = smem + static_cast<int>(i % kStages) * kStageBytes;
    const int64_t blk = blk0 + i;
    const int32_t page = p.block_table[b * p.table_stride + blk];
    const bool page_ok = page >= 0 && page < p.num_pages;
    const float scale = reinterpret_cast<const float*>(stage + kKeyBytes)[my_key];
    const int64_t n = blk * kBlock + my_key;
    const bool in_cols = storer && n < p.num_cols;
#pragma unroll 1
    for (int j = 0; j < p.next_n; ++j) {
      const int64_t visible = Visible(p, context, j);
      float* out = p.logits + (b * p.next_n + j) * p.ld + n;
      if (blk * kBlock >= visible) {  // CTA-uniform: nothing of this block is visible to j
        if (in_cols) *out = kNegInf;
        continue;
      }
      float acc[kHp / 2];
#pragma unroll
      for (int r = 0; r < kHp / 2; ++r) acc[r] = 0.0f;
      FenceAccumulators(acc);
      const uint8_t* qj = qs + j * kHp * kDim;
      WgmmaFence();
#pragma unroll
      for (int s = 0; s < kDim / 32; ++s) {
        Mma<kHp>(acc, Descriptor(stage + 256 * s), Descriptor(qj + 256 * s));
      }
      WgmmaCommit();
      WgmmaWait<0>();
      FenceAccumulators(acc);
      // acc[4k + {0, 1}]: key 16·warp + g, heads 8k + 2t + {0, 1}; acc[4k + {2, 3}]: key + 8.
      const float2* wj = reinterpret_cast<const float2*>(ws + j * kHp);
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int k = 0; k < kHp / 8; ++k) {
        const float2 w = wj[4 * k + t];
        s0 += w.x * fmaxf(acc[4 * k], 0.0f) + w.y * fmaxf(acc[4 * k + 1], 0.0f);
        s1 += w.x * fmaxf(acc[4 * k + 2], 0.0f) + w.y * fmaxf(acc[4 * k + 3], 0.0f);
      }
      s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
      s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
      if (in_cols) *out = page_ok && n < visible ? ((t & 1) ? s1 : s0) * scale : kNegInf;
    }
    __syncthreads();  // stage free for the copies issued next round
  }
#else
  __trap();  // launched only on compute capability 9.0, which runs the sm_90a code
#endif
}

WgmmaProblem MakeProblem(const Params& p) {
  WgmmaProblem x{};
  x.q = p.q.ptr<const uint8_t>();
  x.q_batch_stride = p.q.stride(0);
  x.q_row_stride = p.q.stride(1);
  x.q_head_stride = p.q.stride(2);
  x.cache = p.kv_cache.ptr<const uint8_t>();
  x.cache_stride = p.kv_cache.stride(0);
  x.num_pages = p.kv_cache.dim(0);
  x.block_table = p.block_table.ptr<const int32_t>();
  x.table_stride = p.block_table.stride(0);
  x.context_lens = p.context_lens.ptr<const int32_t>();
  x.context_stride = p.context_lens.stride(0);
  x.weights = p.weights.ptr<const float>();
  x.weights_stride = p.weights.stride(0);
  x.logits = p.logits.ptr<float>();
  x.ld = p.logits.stride(0);
  x.num_cols = p.logits.dim(1);
  const int64_t max_blocks = p.block_table.dim(1);
  x.visible_cap =
      max_blocks > x.num_cols / kBlock ? x.num_cols : std::min(x.num_cols, max_blocks * kBlock);
  x.next_n = static_cast<int>(p.q.dim(1));
  x.heads = static_cast<int>(p.q.dim(2));
  x.col_blocks = CeilDiv(x.num_cols, int64_t{kBlock});
  return x;
}

int PaddedHeads(int64_t h) { return h <= 32 ? 32 : (h <= 64 ? 64 : 128); }

bool Empty(const Params& p) { return p.q.dim(0) == 0 || p.logits.dim(1) == 0; }

// Splits each request's columns into spans of at least kMinSpan blocks so that the grid is about
// one wave of resident CTAs (`resident` per SM); shapes only, so every replay of a captured graph
// gets the same split.
void ChooseSpans(WgmmaProblem* x, int64_t batch, int64_t resident) {
  const int64_t target = int64_t{CurrentDeviceSmCount()} * resident;
  int64_t spans = std::max<int64_t>(1, target / std::max<int64_t>(batch, 1));
  spans = std::min(spans, std::max<int64_t>(x->col_blocks, 1));
  x->span = std::max<int64_t>(kMinSpan, CeilDiv(x->col_blocks, spans));
  x->spans = std::max<int64_t>(1, CeilDiv(x->col_blocks, x->span));
}

template <int kHp>
::attnd::gpu::Error LaunchPadded(const Params& p, ::attnd::gpu::Stream stream) {
  WgmmaProblem x = MakeProblem(p);
  const int bytes = SmemBytes(x.next_n, kHp);
  const auto kernel = PagedWgmmaKernel<kHp>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  int resident = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, bytes);
  if (e != cudaSuccess) return e;
  ChooseSpans(&x, p.q.dim(0), std::max(resident, 1));
  kernel<<<static_cast<unsigned>(p.q.dim(0) * x.spans), kThreads, bytes, stream>>>(x);
  return cudaGetLastError();
}

}  // namespace

bool WgmmaSupports(const Params& p, std::string* why) {
  const int64_t next_n = p.q.dim(1), h = p.q.dim(2), d = p.q.dim(3);
  if (d != kDim) return Refuse(why, "D is ", d, ", want ", kDim);
  if (p.block_size != kBlock) return Refuse(why, "block_size is ", p.block_size, ", want ", kBlock);
  if (h > 128) return Refuse(why, "H is ", h, ", want <= 128");
  if (next_n * PaddedHeads(h) * kDim > kMaxQBytes) {
    return Refuse(why, "next_n · padded H is ", next_n * PaddedHeads(h),
                  ", want <= ", kMaxQBytes / kDim);
  }
  if (!Aligned(p.q.data, 16) || p.q.stride(0) % 16 != 0 || p.q.stride(1) % 16 != 0 ||
      p.q.stride(2) % 16 != 0 || !Aligned(p.kv_cache.data, 16) || p.kv_cache.stride(0) % 16 != 0) {
    return Refuse(why, "q and kv_cache must be 16-byte aligned (pointers and row strides)");
  }
  if (p.kv_cache.dim(0) < 1) {
    return Refuse(why, "kv_cache has no blocks");  // cp.async needs a mapped fallback address
  }
  const int capability = indexer_logits::gpu::CurrentDeviceCapability();
  if (capability != 90) return Refuse(why, "compute capability ", capability, ", want 90");
  // One CTA per request at least, and at most col_blocks per request.
  if (!Empty(p) && p.q.dim(0) * CeilDiv(p.logits.dim(1), int64_t{kBlock}) >= (int64_t{1} << 31)) {
    return Refuse(why, "grid does not fit one dimension");
  }
  return true;
}

::attnd::gpu::Error LaunchWgmma(const Params& p, ::attnd::gpu::Stream stream) {
  if (Empty(p)) return cudaSuccess;
  switch (PaddedHeads(p.q.dim(2))) {
    case 32: return LaunchPadded<32>(p, stream);
    case 64: return LaunchPadded<64>(p, stream);
    default: return LaunchPadded<128>(p, stream);
  }
}

}  // namespace attnd::kernels::indexer_logits_paged::gpu

#endif  // defined(ATTND_GPU_CUDA)
