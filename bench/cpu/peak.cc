// The machine's ceilings for the CPU backend: f32 FMA throughput (independent accumulator
// chains, all threads) and the shared GEMM micro-kernel on an L1/L2-resident problem. The
// per-op figures are read against these.
#include <vector>

#include "bench/cpu/bench_util.h"
#include "kernels/common/cpu/gemm.h"

namespace attnd::bench {
namespace {

typedef float V8 __attribute__((vector_size(32)));

// 12 independent 8-wide FMA chains per thread: enough to cover FMA latency on two ports.
__attribute__((target("avx2,fma"))) double FmaLoop(int64_t iters) {
  V8 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = V8{} + static_cast<float>(i) * 1e-3f;
  const V8 a = V8{} + 0.999999f, b = V8{} + 1e-7f;
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) {
      acc[i] = acc[i] * a + b;  // contracted to one FMA; chains stay independent
    }
  }
  double s = 0;
  for (int i = 0; i < 12; ++i) s += acc[i][0];
  return s;
}

void BM_Peak_FmaF32(benchmark::State& state) {
  auto* pool = BenchPool();
  const int64_t iters = 1 << 20;
  for (auto _ : state) {
    pool->ParallelFor(pool->num_threads(), 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) benchmark::DoNotOptimize(FmaLoop(iters));
    });
  }
  kernels::WorkCount w;
  w.flops = 2.0 * 8 * 12 * static_cast<double>(iters) * pool->num_threads();
  SetWorkCounters(state, w);
  state.counters["threads"] = pool->num_threads();
}
BENCHMARK(BM_Peak_FmaF32)->UseRealTime()->Unit(benchmark::kMillisecond);

// The 6×16 micro-kernel GEMM on one thread per core: C[96,256] = A[96,512]·B[512,256].
void BM_Peak_GemmF32(benchmark::State& state) {
  auto* pool = BenchPool();
  const int64_t m = 96, n = 256, k = 512;
  std::mt19937_64 rng(1);
  const auto a = RandomF32(m * k, rng, -1, 1), b = RandomF32(k * n, rng, -1, 1);
  std::vector<std::vector<float>> c(pool->num_threads(), std::vector<float>(m * n));
  std::vector<std::vector<float>> pack(pool->num_threads(),
                                       std::vector<float>(kernels::cpu::GemmPackSize(k)));
  for (auto _ : state) {
    pool->ParallelFor(pool->num_threads(), 1, [&](int64_t s, int64_t e) {
      for (int64_t t = s; t < e; ++t) {
        kernels::cpu::GemmF32(m, n, k, a.data(), k, b.data(), n, false, c[t].data(), n, false,
                              pack[t].data());
      }
    });
  }
  kernels::WorkCount w;
  w.flops = 2.0 * m * n * k * pool->num_threads();
  SetWorkCounters(state, w);
}
BENCHMARK(BM_Peak_GemmF32)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace attnd::bench
