// Paged (decode) indexer-logits CPU benchmarks: B requests of the same context in vLLM's cache
// layout (64-token blocks, pages shuffled), DeepSeek-V3.2's H64 and GLM-5's H32 at D 128,
// next_n 1 and 2 (MTP).
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
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
namespace ilp = kernels::indexer_logits_paged;

constexpr int64_t kBlock = 64;

struct Inputs {
  std::vector<uint8_t> q, kv_cache;
  std::vector<int32_t> block_table, context_lens;
  std::vector<float> weights, logits;
  ilp::Params p;
};

void MakeInputs(Inputs& in, int64_t batch, int64_t next_n, int64_t context, int64_t h, int64_t d) {
  std::mt19937_64 rng(42);
  const int64_t max_blocks = (context + kBlock - 1) / kBlock, num_blocks = batch * max_blocks;
  const int64_t block_bytes = kBlock * (d + 4), rows = batch * next_n;
  in.q = RandomFp8(batch * next_n * h * d, rng);
  in.kv_cache = RandomFp8(num_blocks * block_bytes, rng);
  const std::vector<float> scales = RandomF32(num_blocks * kBlock, rng, 0.01f, 0.1f);
  for (int64_t b = 0; b < num_blocks; ++b) {
    std::memcpy(in.kv_cache.data() + b * block_bytes + kBlock * d, scales.data() + b * kBlock,
                kBlock * sizeof(float));
  }
  in.block_table.resize(static_cast<size_t>(num_blocks));
  std::iota(in.block_table.begin(), in.block_table.end(), 0);
  std::shuffle(in.block_table.begin(), in.block_table.end(), rng);
  in.context_lens.assign(static_cast<size_t>(batch), static_cast<int32_t>(context));
  in.weights = RandomF32(rows * h, rng, -1.0f, 1.0f);
  in.logits.resize(static_cast<size_t>(rows * context));
  in.p.q = kernels::MakeTensor(in.q.data(), DType::kFp8E4M3, {batch, next_n, h, d});
  in.p.kv_cache = kernels::MakeTensor(in.kv_cache.data(), DType::kU8, {num_blocks, block_bytes});
  in.p.block_size = kBlock;
  in.p.block_table = kernels::MakeTensor(in.block_table.data(), DType::kI32, {batch, max_blocks});
  in.p.context_lens = kernels::MakeTensor(in.context_lens.data(), DType::kI32, {batch});
  in.p.weights = kernels::MakeTensor(in.weights.data(), DType::kF32, {rows, h});
  in.p.logits = kernels::MakeTensor(in.logits.data(), DType::kF32, {rows, context});
}

// Args: B, next_n, context, H, D.
void BM_IndexerLogitsPaged(benchmark::State& state) {
  Inputs in;
  MakeInputs(in, state.range(0), state.range(1), state.range(2), state.range(3), state.range(4));
  const kernels::ExecContext ctx = CpuContext();
  const double cpu_start = ProcessCpuSeconds();
  for (auto _ : state) {
    const absl::Status s = ilp::Run(in.p, ctx);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(in.logits.data());
  }
  const double cpu_seconds = ProcessCpuSeconds() - cpu_start;
  const kernels::WorkCount work = ilp::Count(in.p);
  SetWorkCounters(state, work);
  // Per CPU-second of all pool threads: the figure other processes on the machine do not move.
  state.counters["GFLOP/cpu-s"] =
      work.flops * 1e-9 * static_cast<double>(state.iterations()) / cpu_seconds;
}
BENCHMARK(BM_IndexerLogitsPaged)
    ->ArgNames({"B", "next_n", "ctx", "H", "D"})
    ->Args({8, 1, 8192, 64, 128})
    ->Args({8, 2, 8192, 64, 128})
    ->Args({8, 1, 8192, 32, 128})
    ->Args({1, 1, 32768, 64, 128})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace attnd::bench
