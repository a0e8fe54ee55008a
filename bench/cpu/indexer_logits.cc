// Prefill indexer-logits CPU benchmarks: the last M queries of one N-token request (causal, the
// shape of a chunked prefill), DeepSeek-V3.2's H64 and GLM-5's H32 at D 128, with and without
// the -inf fill, and a few queries against a long context.
#include "kernels/indexer_logits/indexer_logits.h"

#include <time.h>

#include <cstdint>
#include <random>
#include <vector>

#include "bench/cpu/bench_util.h"
#include "kernels/common/tensor.h"

namespace attnd::bench {
namespace {

double ProcessCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

using kernels::DType;
namespace il = kernels::indexer_logits;

struct Inputs {
  std::vector<uint8_t> q, k;
  std::vector<float> k_scale, weights, logits;
  std::vector<int32_t> ks, ke;
  il::Params p;
};

// Row m sees [0, N - M + m + 1): the M queries are the request's last M tokens.
void MakeInputs(Inputs& in, int64_t m, int64_t n, int64_t h, int64_t d, bool clean) {
  std::mt19937_64 rng(42);
  in.q = RandomFp8(m * h * d, rng);
  in.k = RandomFp8(n * d, rng);
  in.k_scale = RandomF32(n, rng, 0.01f, 0.1f);
  in.weights = RandomF32(m * h, rng, -1.0f, 1.0f);
  in.logits.resize(static_cast<size_t>(m * n));
  in.ks.assign(static_cast<size_t>(m), 0);
  in.ke.resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) in.ke[i] = static_cast<int32_t>(n - m + i + 1);
  in.p.q = kernels::MakeTensor(in.q.data(), DType::kFp8E4M3, {m, h, d});
  in.p.k = kernels::MakeTensor(in.k.data(), DType::kFp8E4M3, {n, d});
  in.p.k_scale = kernels::MakeTensor(in.k_scale.data(), DType::kF32, {n});
  in.p.weights = kernels::MakeTensor(in.weights.data(), DType::kF32, {m, h});
  in.p.ks = kernels::MakeTensor(in.ks.data(), DType::kI32, {m});
  in.p.ke = kernels::MakeTensor(in.ke.data(), DType::kI32, {m});
  in.p.clean_logits = clean;
  in.p.logits = kernels::MakeTensor(in.logits.data(), DType::kF32, {m, n});
}

// Args: M, N, H, D, clean_logits (0/1).
void BM_IndexerLogits(benchmark::State& state) {
  Inputs in;
  MakeInputs(in, state.range(0), state.range(1), state.range(2), state.range(3),
             state.range(4) != 0);
  const kernels::ExecContext ctx = CpuContext();
  const double cpu_start = ProcessCpuSeconds();
  for (auto _ : state) {
    const absl::Status s = il::Run(in.p, ctx);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(in.logits.data());
  }
  const double cpu_seconds = ProcessCpuSeconds() - cpu_start;
  const kernels::WorkCount work = il::Count(in.p);
  SetWorkCounters(state, work);
  // Per CPU-second of all pool threads: the figure other processes on the machine do not move.
  state.counters["GFLOP/cpu-s"] =
      work.flops * 1e-9 * static_cast<double>(state.iterations()) / cpu_seconds;
}
BENCHMARK(BM_IndexerLogits)
    ->ArgNames({"M", "N", "H", "D", "clean"})
    ->Args({256, 8192, 64, 128, 1})
    ->Args({256, 8192, 32, 128, 1})
    ->Args({256, 8192, 64, 128, 0})
    ->Args({4, 32768, 64, 128, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace attnd::bench
