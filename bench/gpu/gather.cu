// GPU gather ceilings (docs/BENCHMARKS.md "Gather ceilings"; what bounds the sparse MLA kernels'
// KV gathers): random 1024-B and 1152-B row gathers (d512 / d576 bf16 KV rows) from an
// L2-resident 32 MiB pool and from a 4 GiB HBM pool, and a streaming read of a 32 MiB (L2) and a
// 4 GiB (HBM) buffer.
// 2^22 rows per launch (T2048 x K2048); row ids uniform in the pool, read from an i32 array as
// sparse MLA reads its selection. Bytes counted: the row bytes gathered (or streamed) only.
// Variants (impl), every one summing what it reads so nothing is optimised away:
//   warp_x1   a warp per row, 16-B loads, one row in flight per warp;
//   warp_x8   a warp per 8 rows, all 16-B loads issued before any is summed (8 rows in flight);
//   cpasync_sSrR  one 256-thread CTA per SM, cp.async 16 B into a ring of S stages of R-row
//             tiles (the sparse MLA kernels' mechanism), row ids loaded two issues ahead, one
//             chunk per thread read back per stage;
//   bulk_sSrR the same ring filled by the bulk copy engine: one cp.async.bulk per row issued
//             by a lane of warp 0, completion on a per-stage mbarrier (sm_90).
// The stream reads bypass L1 (ld.global.cg): the 32 MiB buffer re-read 32 times per launch
// must come from L2.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gpu/gpu_bench.h"
#include "kernels/common/gpu/mma_sync.cuh"
#include "kernels/common/gpu/vendor.h"

namespace attnd::bench {
namespace {

constexpr int64_t kRows = int64_t{1} << 22;  // rows gathered per launch
constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t Fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

__device__ __forceinline__ uint4 Load16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// L2 only (no L1 allocation): a streamed buffer re-read by the same SM must not hit in L1.
__device__ __forceinline__ uint4 Load16L2(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// A warp per kRowsInFlight rows: each lane loads chunks lane, lane + 32, ... of every row, all
// loads issued before any is folded. `sink` is written only for an impossible value.
template <int kRowsInFlight>
__global__ void __launch_bounds__(kThreads)
    GatherWarpKernel(const uint8_t* pool, const int32_t* rows, int64_t n, int row_bytes,
                     uint32_t* sink) {
  constexpr int kWarp = 32;
  const int lane = threadIdx.x % kWarp;
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int chunks = row_bytes / 16;  // 64 or 72
  uint32_t acc = 0;
  for (int64_t r0 = warp * kRowsInFlight; r0 < n; r0 += warps * kRowsInFlight) {
    int32_t id = 0;
    if (lane < kRowsInFlight && r0 + lane < n) id = rows[r0 + lane];
    uint4 v[kRowsInFlight][3];
#pragma unroll
    for (int r = 0; r < kRowsInFlight; ++r) {
      const int32_t row = gpu::Shfl(id, r);
      const uint8_t* src = pool + static_cast<int64_t>(row) * row_bytes;
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        const int chunk = lane + kWarp * c;
        v[r][c] =
            (r0 + r < n && chunk < chunks) ? Load16(src + chunk * 16) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsInFlight; ++r) {
#pragma unroll
      for (int c = 0; c < 3; ++c) acc += Fold(v[r][c]);
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// cp.async into a ring of `stages` tiles of `tile_rows` rows (the sparse MLA kernels'
// mechanism), one CTA per SM: CTA b takes tiles b, b + gridDim.x, ... Thread i copies chunks
// i, i + 256, ... of a tile. The row ids of a tile are loaded into registers two issues ahead
// (two alternating arrays), as the kernels keep theirs in shared memory ahead of time, so an
// issue does not wait on an index load. After a stage lands each thread folds one 16-B chunk.
constexpr int kMaxChunksPerThread = 18;  // 64 rows x 72 chunks / 256 threads

__global__ void __launch_bounds__(kThreads)
    GatherCpAsyncKernel(const uint8_t* pool, const int32_t* rows, int64_t n, int row_bytes,
                        int stages, int tile_rows, uint32_t* sink) {
  using namespace ::attnd::gpu::ptx;
  extern __shared__ __align__(128) uint8_t smem[];
  const int chunks = row_bytes / 16;
  const int tile_bytes = tile_rows * row_bytes;
  const int tile_chunks = tile_rows * chunks;
  const int64_t tiles = (n + tile_rows - 1) / tile_rows;
  const int64_t step = gridDim.x;
  auto tile_of = [&](int64_t k) { return blockIdx.x + k * step; };
  uint32_t acc = 0;
  auto load_ids = [&](int32_t(&id)[kMaxChunksPerThread], int64_t tile) {
#pragma unroll
    for (int j = 0; j < kMaxChunksPerThread; ++j) {
      const int e = threadIdx.x + kThreads * j;
      const int64_t i = tile * tile_rows + e / chunks;
      id[j] = (e < tile_chunks && tile < tiles && i < n) ? rows[i] : -1;
    }
  };
  auto issue = [&](const int32_t(&id)[kMaxChunksPerThread], int stage) {
#pragma unroll
    for (int j = 0; j < kMaxChunksPerThread; ++j) {
      const int e = threadIdx.x + kThreads * j;
      if (id[j] >= 0) {
        CpAsync16(SmemAddr(smem + stage * tile_bytes + e * 16),
                  pool + static_cast<int64_t>(id[j]) * row_bytes + (e % chunks) * 16, true);
      }
    }
    CpAsyncCommit();
  };
  auto consume = [&](int64_t k) {
    switch (stages) {  // groups newer than tile k: stages - 1
      case 2: CpAsyncWait<1>(); break;
      case 3: CpAsyncWait<2>(); break;
      case 4: CpAsyncWait<3>(); break;
      default: CpAsyncWait<5>(); break;
    }
    __syncthreads();
    acc += Fold(*reinterpret_cast<const uint4*>(smem + (k % stages) * tile_bytes +
                                                (threadIdx.x % tile_chunks) * 16));
    __syncthreads();  // the stage is refilled next iteration
  };
  int32_t ida[kMaxChunksPerThread], idb[kMaxChunksPerThread];
  for (int s = 0; s < stages - 1; ++s) {
    load_ids(ida, tile_of(s));
    issue(ida, s);
  }
  load_ids(ida, tile_of(stages - 1));
  load_ids(idb, tile_of(stages));
  for (int64_t k = 0; tile_of(k) < tiles; k += 2) {
    issue(ida, static_cast<int>((k + stages - 1) % stages));
    load_ids(ida, tile_of(k + stages + 1));
    consume(k);
    if (tile_of(k + 1) >= tiles) break;
    issue(idb, static_cast<int>((k + stages) % stages));
    load_ids(idb, tile_of(k + stages + 2));
    consume(k + 1);
  }
  CpAsyncWait<0>();
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// The Hopper bulk copy engine instead: one 1-D cp.async.bulk per row (a lane of warp 0 per row,
// completing on the stage's mbarrier), a ring of `stages` tiles of `tile_rows` rows, row ids
// loaded two issues ahead. sm_90 only (compiles to a trap elsewhere).
__device__ __forceinline__ void MbarInit(uint32_t bar, int count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void MbarExpectTx(uint32_t bar, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void BulkRow(uint32_t dst, const void* src, int bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#else
  __trap();
#endif
}

constexpr int kBulkMaxStages = 6;

__global__ void __launch_bounds__(kThreads)
    GatherBulkKernel(const uint8_t* pool, const int32_t* rows, int64_t n, int row_bytes, int stages,
                     int tile_rows, uint32_t* sink) {
  using namespace ::attnd::gpu::ptx;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tile_bytes = tile_rows * row_bytes;
  const uint32_t bars = SmemAddr(smem + stages * tile_bytes);  // u64 [stages]
  const int64_t tiles = (n + tile_rows - 1) / tile_rows;
  const int64_t step = gridDim.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  auto tile_of = [&](int64_t k) { return blockIdx.x + k * step; };
  if (threadIdx.x < stages) MbarInit(bars + 8 * threadIdx.x, 1);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
  __syncthreads();
  uint32_t acc = 0;
  // Warp 0, lane l: rows l and l + 32 of a tile (tile_rows <= 64).
  auto load_ids = [&](int32_t(&id)[2], int64_t tile) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = lane + 32 * j;
      const int64_t i = tile * tile_rows + r;
      id[j] = (r < tile_rows && tile < tiles && i < n) ? rows[i] : -1;
    }
  };
  auto issue = [&](const int32_t(&id)[2], int stage, int64_t tile) {
    if (warp != 0 || tile >= tiles) return;
    const int64_t valid = min(static_cast<int64_t>(tile_rows), n - tile * tile_rows);
    if (lane == 0) MbarExpectTx(bars + 8 * stage, static_cast<int>(valid) * row_bytes);
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (id[j] >= 0) {
        BulkRow(SmemAddr(smem + stage * tile_bytes + (lane + 32 * j) * row_bytes),
                pool + static_cast<int64_t>(id[j]) * row_bytes, row_bytes, bars + 8 * stage);
      }
    }
  };
  auto consume = [&](int64_t k) {
    const int stage = static_cast<int>(k % stages);
    MbarWait(bars + 8 * stage, static_cast<uint32_t>((k / stages) & 1));
    acc += Fold(*reinterpret_cast<const uint4*>(smem + stage * tile_bytes +
                                                (threadIdx.x % (tile_bytes / 16)) * 16));
    __syncthreads();  // the stage is refilled next
  };
  int32_t ida[2], idb[2];
  for (int s = 0; s < stages - 1; ++s) {
    load_ids(ida, tile_of(s));
    issue(ida, s, tile_of(s));
  }
  load_ids(ida, tile_of(stages - 1));
  load_ids(idb, tile_of(stages));
  for (int64_t k = 0; tile_of(k) < tiles; k += 2) {
    issue(ida, static_cast<int>((k + stages - 1) % stages), tile_of(k + stages - 1));
    load_ids(ida, tile_of(k + stages + 1));
    consume(k);
    if (tile_of(k + 1) >= tiles) break;
    issue(idb, static_cast<int>((k + stages) % stages), tile_of(k + stages));
    load_ids(idb, tile_of(k + stages + 2));
    consume(k + 1);
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// Streams `bytes` of `buf`, `passes` times (16-B loads, 4 in flight per thread).
__global__ void __launch_bounds__(kThreads)
    StreamKernel(const uint8_t* buf, int64_t bytes, int passes, uint32_t* sink) {
  const int64_t n16 = bytes / 16;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  for (int p = 0; p < passes; ++p) {
    for (int64_t i = tid; i < n16; i += 4 * stride) {
      uint4 v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t k = i + j * stride;
        v[j] = k < n16 ? Load16L2(buf + k * 16) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) acc += Fold(v[j]);
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

int SmCount() {
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) n = 132;
  return n;
}

std::string Mib(int64_t bytes) {
  return bytes >= (int64_t{1} << 30) ? absl::StrCat(bytes >> 30, "GiB")
                                     : absl::StrCat(bytes >> 20, "MiB");
}

// One case; `arena` holds the pool (shared by the cases over the same pool).
GpuBenchCase GatherCase(const std::string& impl, int row_bytes, int64_t pool_bytes,
                        const uint8_t* pool, const int32_t* rows, uint32_t* sink,
                        std::shared_ptr<DeviceArena> arena) {
  GpuBenchCase c;
  c.op = "gather";
  c.preset = absl::StrCat("rows4M_row", row_bytes, "_pool", Mib(pool_bytes));
  c.impl = impl;
  c.peak = PeakKind::kMemory;
  c.work.flops = 0;
  c.work.bytes = static_cast<double>(kRows) * row_bytes;
  c.arena = std::move(arena);
  const int sms = SmCount();
  if (impl.rfind("bulk", 0) == 0) {  // bulk_s<stages>r<rows>
    const int stages = impl[6] - '0', tile_rows = std::atoi(impl.c_str() + 8);
    const int smem = stages * tile_rows * row_bytes + 8 * kBulkMaxStages;
    c.launch = [=](gpu::Stream stream) -> absl::Status {
      GPU_RETURN_IF_ERROR(cudaFuncSetAttribute(GatherBulkKernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      GatherBulkKernel<<<sms, kThreads, smem, stream>>>(pool, rows, kRows, row_bytes, stages,
                                                        tile_rows, sink);
      GPU_RETURN_IF_ERROR(cudaGetLastError());
      return absl::OkStatus();
    };
  } else if (impl.rfind("cpasync", 0) == 0) {  // cpasync_s<stages>r<rows>
    const int stages = impl[9] - '0', tile_rows = std::atoi(impl.c_str() + 11);
    const int smem = stages * tile_rows * row_bytes;
    c.launch = [=](gpu::Stream stream) -> absl::Status {
      GPU_RETURN_IF_ERROR(cudaFuncSetAttribute(GatherCpAsyncKernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      GatherCpAsyncKernel<<<sms, kThreads, smem, stream>>>(pool, rows, kRows, row_bytes, stages,
                                                           tile_rows, sink);
      GPU_RETURN_IF_ERROR(cudaGetLastError());
      return absl::OkStatus();
    };
  } else {
    const bool x8 = impl == "warp_x8";
    c.launch = [=](gpu::Stream stream) -> absl::Status {
      if (x8) {
        GatherWarpKernel<8><<<8 * sms, kThreads, 0, stream>>>(pool, rows, kRows, row_bytes, sink);
      } else {
        GatherWarpKernel<1><<<8 * sms, kThreads, 0, stream>>>(pool, rows, kRows, row_bytes, sink);
      }
      GPU_RETURN_IF_ERROR(cudaGetLastError());
      return absl::OkStatus();
    };
  }
  return c;
}

GpuBenchCase StreamCase(int64_t bytes, int passes, const uint8_t* buf, uint32_t* sink,
                        std::shared_ptr<DeviceArena> arena) {
  GpuBenchCase c;
  c.op = "gather";
  c.preset = passes > 1 ? absl::StrCat("stream_", Mib(bytes), "_x", passes)
                        : absl::StrCat("stream_", Mib(bytes));
  c.impl = "stream_x4";
  c.peak = PeakKind::kMemory;
  c.work.flops = 0;
  c.work.bytes = static_cast<double>(bytes) * passes;
  c.arena = std::move(arena);
  const int sms = SmCount();
  c.launch = [=](gpu::Stream stream) -> absl::Status {
    StreamKernel<<<8 * sms, kThreads, 0, stream>>>(buf, bytes, passes, sink);
    GPU_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  };
  return c;
}

bool Wanted(const std::string& filter, const std::string& preset, const std::string& impl) {
  return filter.empty() ||
         absl::StrCat("gather/", preset, "/", impl).find(filter) != std::string::npos;
}

// Pools: 32 MiB (L2-resident) and 4 GiB (HBM), random bf16 bits, each allocated once and only
// when a case over it passes the filter; the row-id arrays per (pool, row size).
absl::StatusOr<std::vector<GpuBenchCase>> MakeGatherCases(const std::string& filter) {
  std::vector<GpuBenchCase> cases;
  uint64_t seed = 900;
  // cpasync_s<stages>r<rows>: 2 x 64 rows is the sparse MLA kernels' ring; deeper rings keep
  // more bytes in flight per SM (one CTA per SM in all).
  // bulk_s<stages>r<rows>: the same rings filled by one cp.async.bulk per row (sm_90).
  const char* kImpls[] = {"warp_x1",       "warp_x8",    "cpasync_s2r64", "cpasync_s3r64",
                          "cpasync_s6r32", "bulk_s2r64", "bulk_s3r64",    "bulk_s6r32"};
  for (int64_t pool_bytes : {int64_t{32} << 20, int64_t{4} << 30}) {
    bool any = Wanted(filter, absl::StrCat("stream_", Mib(pool_bytes)), "stream_x4");
    for (int row_bytes : {1024, 1152}) {
      for (const char* impl : kImpls) {
        any = any ||
              Wanted(filter, absl::StrCat("rows4M_row", row_bytes, "_pool", Mib(pool_bytes)), impl);
      }
    }
    if (!any) continue;
    auto arena = std::make_shared<DeviceArena>();
    auto pool = arena->Random(kernels::DType::kBF16, pool_bytes / 2, 1.0f, seed += 2);
    if (!pool.ok()) return pool.status();
    auto sink = arena->Alloc(64);
    if (!sink.ok()) return sink.status();
    const auto* p = static_cast<const uint8_t*>(*pool);
    auto* s = static_cast<uint32_t*>(*sink);
    for (int row_bytes : {1024, 1152}) {
      const int64_t pool_rows = pool_bytes / row_bytes;
      auto rows = arena->RandomInt(kRows, 0, static_cast<int32_t>(pool_rows - 1), seed += 2);
      if (!rows.ok()) return rows.status();
      for (const char* impl : kImpls) {
        cases.push_back(GatherCase(impl, row_bytes, pool_bytes, p,
                                   static_cast<const int32_t*>(*rows), s, arena));
      }
    }
    const int passes = pool_bytes < (int64_t{1} << 30) ? 32 : 1;  // >= 1 GiB per launch
    cases.push_back(StreamCase(pool_bytes, passes, p, s, arena));
  }
  return cases;
}

}  // namespace
}  // namespace attnd::bench

ATTND_REGISTER_GPU_BENCH(gather, attnd::bench::MakeGatherCases);
