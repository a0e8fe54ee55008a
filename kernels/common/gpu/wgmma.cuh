// Hopper (sm_90a) PTX layer for warpgroup kernels, CUDA-only: shared-memory matrix descriptors
// (128-byte swizzle, K-major and MN-major), bf16 wgmma m64nNk16 (N = 64, 128, 256; A from shared
// memory or registers) with f32 accumulators, wgmma fence / commit / wait and accumulator fences,
// mbarriers, 16-byte cp.async with zero fill and mbarrier completion, 3-D TMA tile loads, DSMEM
// stores (st.async) and remote mbarrier arrivals (cluster.cuh has the cluster ranks, barrier and
// address mapping), named barriers, setmaxnreg and the generic -> async proxy fence. Everything
// that needs sm_90a compiles only where ATTND_SM90A is 1 (the build also embeds compute_80 PTX,
// whose kernels must trap there).
//   const uint64_t da = SmemDescKMajor(q_tile), db = SmemDescKMajor(k_tile);
//   WgmmaFence();  Wgmma<64, WgmmaA::kSmem>::Run<false>(s, da, db, /*accumulate=*/false);
//   WgmmaCommit();  WgmmaWait<0>();  FenceAccumulators(s);
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/common/gpu/wgmma.cuh is CUDA-only"
#endif

#include <stdint.h>
#if defined(ATTND_DEBUG_HANG_TRAP)
#include <stdio.h>
#endif

#include "kernels/common/gpu/cluster.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTND_SM90A 1
#else
#define ATTND_SM90A 0
#endif

namespace attnd::gpu::wgmma {

// ---- Shared-memory matrix descriptors (128-byte swizzle) ----
// A tile is stored as 64-column (bf16) slabs; slab rows are 128 bytes and 8 rows form a 1024-byte
// swizzle atom (atoms 1024-byte aligned) in which 16-byte chunk c of row r sits at chunk
// c ^ (r % 8). SwizzledOffset gives that byte offset inside one slab.
inline constexpr uint32_t kSwizzleRowBytes = 128;
inline constexpr uint32_t kSwizzleAtomBytes = 1024;

__host__ __device__ constexpr uint32_t SwizzledOffset(uint32_t row, uint32_t chunk) {
  return row * kSwizzleRowBytes + (((chunk ^ row) & 7u) << 4);
}

// Descriptor fields: bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride
// byte offset >> 4, 49-51 base offset (0: atoms 1024-byte aligned), 62-63 swizzle (1: 128 B).
__host__ __device__ constexpr uint64_t SmemDesc(uint32_t smem_addr, uint32_t lbo_bytes,
                                                uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3ffffu) >> 4) |
         (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3fffu) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3fffu) << 32) | (uint64_t{1} << 62);
}

// K-major operand (A M x 16 or B N x 16, K contiguous): rows of one slab, 8-row groups 1024 B
// apart (stride byte offset); the leading byte offset is unused with 128-byte swizzle. The k16
// step j (j < 4) of a slab starts 32·j bytes in; slab s starts s·(rows·128) bytes in.
__host__ __device__ constexpr uint64_t SmemDescKMajor(uint32_t smem_addr) {
  return SmemDesc(smem_addr, 16, kSwizzleAtomBytes);
}

// MN-major operand (B 16 x N with N contiguous, read with imm-trans-b = 1): K rows of 128 bytes
// (64 N-elements), 8-row K groups 1024 B apart (stride byte offset), consecutive 64-element N
// blocks `mn_block_bytes` apart (leading byte offset: the slab size). The k16 step j starts
// 2048·j bytes in (two 8-row groups).
__host__ __device__ constexpr uint64_t SmemDescMnMajor(uint32_t smem_addr,
                                                       uint32_t mn_block_bytes) {
  return SmemDesc(smem_addr, mn_block_bytes, kSwizzleAtomBytes);
}

// A descriptor advanced by `bytes` (a multiple of 16; the address field cannot overflow below
// 256 KiB of shared memory).
__host__ __device__ constexpr uint64_t DescAdvance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

#if ATTND_SM90A

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- wgmma ----
// Orders this warpgroup's earlier register accesses (accumulators, A fragments) before the
// wgmma.mma_async that follow: needed before the first MMA of a batch.
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending of this warpgroup's committed groups are in flight (groups
// complete in commit order).
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  static_assert(kPending >= 0 && kPending <= 7, "wgmma.wait_group takes 0..7");
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of these registers across the surrounding
// wgmma issue / wait (an empty asm that "modifies" each one).
template <int kN>
__device__ __forceinline__ void FenceAccumulators(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void FenceRegisters(uint32_t (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// D (64 x N f32, accumulate ? D + A·B : A·B) with A 64 x 16 bf16 and B 16 x N bf16.
// Accumulator layout (thread t of the warpgroup, warp w = t / 32, lane l): d[4j + 0..1] hold
// row 16w + l/4, columns 8j + 2(l%4) + 0..1; d[4j + 2..3] the same columns of row + 8.
// A in registers (kRegs) uses the mma.sync m16n8k16 A fragment of the warp's 16 rows:
// a[0] = (row l/4, k 2(l%4) + 0..1), a[1] = row + 8, a[2] = k + 8, a[3] = row + 8 and k + 8 —
// exactly an accumulator's d[8i .. 8i+7] packed pairwise to bf16x2 for k-step i.
// B from a descriptor: K-major (kTransB false) or MN-major (kTransB true).
enum class WgmmaA { kSmem, kRegs };
template <int kN, WgmmaA kA>
struct Wgmma;

// One specialisation per N and A source, spelled by ATTND_WGMMA_SPECIALISATION below: bf16 x
// bf16 -> f32, scale-d from `accumulate`, imm-scale-a/b 1, imm-trans-a 0 (A K-major),
// imm-trans-b kTransB. The asm operands: the N/2 accumulators %0.., then (kSmem) desc_a, desc_b,
// accumulate, kTransB or (kRegs) a[0..3], desc_b, accumulate, kTransB.
#define ATTND_WGMMA_D8(i)                                                                     \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define ATTND_WGMMA_D32(i) \
  ATTND_WGMMA_D8(i), ATTND_WGMMA_D8(i + 8), ATTND_WGMMA_D8(i + 16), ATTND_WGMMA_D8(i + 24)
#define ATTND_WGMMA_D64 ATTND_WGMMA_D32(0), ATTND_WGMMA_D32(32)
#define ATTND_WGMMA_D128 ATTND_WGMMA_D64, ATTND_WGMMA_D32(64), ATTND_WGMMA_D32(96)
#define ATTND_WGMMA_P32                                                    \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
// Kept by hand: clang-format 14 alternates between two layouts of these continuations.
// clang-format off
#define ATTND_WGMMA_P64                                                                    \
  ATTND_WGMMA_P32 ", "                                                                     \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "       \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define ATTND_WGMMA_P128                                                                   \
  ATTND_WGMMA_P64 ", "                                                                     \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "       \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "       \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "   \
  "%125, %126, %127"
// clang-format on
// kN, accumulator count, their placeholders and operands, and the placeholders of the operands
// after them ("%R" spelled as strings: the preprocessor cannot add).
#define ATTND_WGMMA_SPECIALISATION(kN, kRegsN, P, D, R0, R1, R2, R3, R4, R5, R6)              \
  template <>                                                                                 \
  struct Wgmma<kN, WgmmaA::kSmem> {                                                           \
    template <bool kTransB>                                                                   \
    static __device__ __forceinline__ void Run(float (&d)[kRegsN], uint64_t desc_a,           \
                                               uint64_t desc_b, bool accumulate) {            \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" R2                                    \
                   ", 0;\n"                                                                   \
                   "wgmma.mma_async.sync.aligned.m64n" #kN "k16.f32.bf16.bf16 {" P "}, %" R0  \
                   ", %" R1 ", p, 1, 1, 0, %" R3 ";\n}\n"                                     \
                   : D                                                                        \
                   : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)),             \
                     "n"(kTransB ? 1 : 0));                                                   \
    }                                                                                         \
  };                                                                                          \
  template <>                                                                                 \
  struct Wgmma<kN, WgmmaA::kRegs> {                                                           \
    template <bool kTransB>                                                                   \
    static __device__ __forceinline__ void Run(float (&d)[kRegsN], const uint32_t (&a)[4],    \
                                               uint64_t desc_b, bool accumulate) {            \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" R5                                    \
                   ", 0;\n"                                                                   \
                   "wgmma.mma_async.sync.aligned.m64n" #kN "k16.f32.bf16.bf16 {" P "}, {%" R0 \
                   ", %" R1 ", %" R2 ", %" R3 "}, %" R4 ", p, 1, 1, %" R6 ";\n}\n"            \
                   : D                                                                        \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b),                 \
                     "r"(static_cast<int>(accumulate)), "n"(kTransB ? 1 : 0));                \
    }                                                                                         \
  };
ATTND_WGMMA_SPECIALISATION(64, 32, ATTND_WGMMA_P32, ATTND_WGMMA_D32(0), "32", "33", "34", "35",
                           "36", "37", "38")
ATTND_WGMMA_SPECIALISATION(128, 64, ATTND_WGMMA_P64, ATTND_WGMMA_D64, "64", "65", "66", "67", "68",
                           "69", "70")
ATTND_WGMMA_SPECIALISATION(256, 128, ATTND_WGMMA_P128, ATTND_WGMMA_D128, "128", "129", "130", "131",
                           "132", "133", "134")
#undef ATTND_WGMMA_SPECIALISATION
#undef ATTND_WGMMA_P128
#undef ATTND_WGMMA_P64
#undef ATTND_WGMMA_P32
#undef ATTND_WGMMA_D128
#undef ATTND_WGMMA_D64
#undef ATTND_WGMMA_D32
#undef ATTND_WGMMA_D8
// D = A·Bᵀ over kSlabs 64-column slabs of K-major A (64 rows) and B (kN rows), both from
// shared memory: 4 k16 steps per slab (32 bytes apart), the next slab `slab_bytes` on (the same
// for A and B); one wgmma per step, the first overwriting D (kAccumulate: adding to it, for a
// product split over two calls). Issues only: the caller fences
// before and commits after. The empty asm keeps one live descriptor pair instead of letting the
// compiler precompute every step's pair (dozens of 64-bit registers).
template <int kN, int kSlabs, bool kAccumulate = false>
__device__ __forceinline__ void WgmmaSsOverSlabs(float (&d)[kN / 2], uint64_t a_desc,
                                                 uint64_t b_desc, uint32_t slab_bytes) {
#pragma unroll
  for (int sl = 0; sl < kSlabs; ++sl) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      asm volatile("" : "+l"(a_desc), "+l"(b_desc));
      Wgmma<kN, WgmmaA::kSmem>::template Run<false>(d, a_desc, b_desc, kAccumulate || sl + kk > 0);
      const uint32_t step = kk < 3 ? 32 : slab_bytes - 3 * 32;
      a_desc = DescAdvance(a_desc, step);
      b_desc = DescAdvance(b_desc, step);
    }
  }
}

// ---- Proxy fence ----
// Makes this thread's generic-proxy shared-memory accesses (ordinary stores, or data it has
// acquired through a barrier, cp.async fills included) visible to later async-proxy accesses
// (wgmma operands, bulk copies), and vice versa.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- mbarrier (64-bit, in shared memory) ----
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes barrier initialisation visible before other threads (and the async proxy) use them.
__device__ __forceinline__ void FenceMbarInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrive (release semantics: this thread's earlier memory accesses are visible to a thread whose
// wait observes the phase completion).
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrive and add `bytes` to the transaction count of the current phase (< 2^20).
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Whether the phase with parity `parity` has completed (acquire semantics when true).
__device__ __forceinline__ bool MbarTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// Blocks until the phase with parity `parity` has completed. Phase k of a barrier has parity
// k % 2; a waiter for phase k must not fall two phases behind.
// A build with ATTND_DEBUG_HANG_TRAP (CMake option of that name, docs/KERNELS.md "Finding a
// hang") gives up after 4 s: it prints the block, thread, barrier and parity, then traps.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
#if defined(ATTND_DEBUG_HANG_TRAP)
  uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (!MbarTryWait(bar, parity)) {
    uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > 4000000000ull) {
      printf("attnd hang trap: block (%d,%d,%d) thread %d mbarrier smem 0x%x parity %u\n",
             blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, bar, parity);
      __trap();
    }
  }
#else
  while (!MbarTryWait(bar, parity)) {
  }
#endif
}

// ---- cp.async (16 bytes, L2 only) ----
// Copies 16 bytes global -> shared; `src_bytes` 16 or 0 (0: writes 16 zero bytes, reads
// nothing; the address must still be a valid generic address).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
// No form with an `L2::cache_hint` operand: CUDA 13.0's ptxas makes an instruction of it that
// faults at run time (docs/KERNELS.md "Sparse MLA in ping-pong"; scripts/lint.sh refuses it).
// One arrival on `bar` once all of this thread's earlier cp.async have completed. noinc: the
// arrival is one of the barrier's initial expected count (init with one per such thread).
__device__ __forceinline__ void CpAsyncArriveNoinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// ---- TMA (cp.async.bulk.tensor, tile mode) ----
// Loads the box of a 3-D tensor map at element coordinates (c0 innermost, c1, c2) into shared
// memory at `dst` (1024-byte aligned for the 128-byte swizzle); the box's bytes complete on the
// transaction count of `bar` (the whole box counts, its out-of-range part read as zeros).
// `tensor_map`: the generic address of a __grid_constant__ kernel parameter (CUtensorMap).
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const void* tensor_map, uint32_t bar,
                                          int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// Brings a tensor map (kernel parameter) into the descriptor cache ahead of its first use.
__device__ __forceinline__ void PrefetchTensorMap(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}

// ---- L2 prefetch (bulk, asynchronous: nothing waits for it) ----
// Asks the L2 to fetch `bytes` (a multiple of 16) at `src` (16-byte aligned); a later load of
// the range may then hit in L2 instead of waiting on HBM. A hint: it changes no data.
__device__ __forceinline__ void PrefetchL2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// ---- DSMEM stores and remote mbarriers (addresses from cluster.cuh's MapShared) ----
// 16 bytes to `dst` in another CTA's shared memory (a MapShared address); the store completes
// 16 bytes of the transaction count of that CTA's mbarrier `bar` (also a MapShared address),
// whose waiters then see the bytes.
__device__ __forceinline__ void StAsync16(uint32_t dst, const uint4& v, uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(dst),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
      : "memory");
}
// Arrive on another CTA's mbarrier (a MapShared address). Release at CTA scope (PTX's
// default): enough to order this thread's completed shared-memory reads (a consumer freeing a
// stage) before the peer's refill; a .cluster-scope release compiles to a GPU-wide memory
// barrier (MEMBAR.ALL.GPU) on every call.
__device__ __forceinline__ void MbarArriveRemote(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// ---- Named barriers (ids 1..15; 0 is __syncthreads) ----
// `threads` counts every thread that arrives or syncs on the barrier (a multiple of 32).
__device__ __forceinline__ void NamedBarSync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarArrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- Register reallocation (whole warpgroup; kernel needs __launch_bounds__(threads, 1)) ----
template <int kRegs>
__device__ __forceinline__ void SetMaxRegsInc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "8k in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxRegsDec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "8k in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

#endif  // ATTND_SM90A

}  // namespace attnd::gpu::wgmma
