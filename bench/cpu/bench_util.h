// Shared helpers for the CPU benchmarks: a thread pool sized to the machine, random buffers,
// and the FLOP/byte counters every case reports.
//   SetWorkCounters(state, work);  // adds GFLOP/s and GB/s columns
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"
#include "kernels/common/registry.h"
#include "kernels/common/thread_pool.h"

namespace attnd::bench {

inline kernels::ThreadPool* BenchPool() {
  static kernels::ThreadPool* pool = new kernels::ThreadPool(0);
  return pool;
}

inline kernels::ExecContext CpuContext() {
  kernels::ExecContext ctx;
  ctx.backend = kernels::Backend::kCpu;
  ctx.pool = BenchPool();
  return ctx;
}

inline void SetWorkCounters(benchmark::State& state, const kernels::WorkCount& work) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(work.flops * 1e-9 * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["GB/s"] =
      benchmark::Counter(work.bytes * 1e-9 * state.iterations(), benchmark::Counter::kIsRate);
}

inline std::vector<uint16_t> RandomBf16(int64_t n, std::mt19937_64& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = kernels::FloatToBf16(dist(rng));
  return v;
}

inline std::vector<uint8_t> RandomFp8(int64_t n, std::mt19937_64& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = kernels::FloatToFp8E4M3(dist(rng));
  return v;
}

inline std::vector<float> RandomF32(int64_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace attnd::bench
