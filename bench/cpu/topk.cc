// Top-k CPU benchmarks: the model's k = 2048 over prefill-like rows (64 × 32K), few long rows
// (8 × 128K), values in [1, 2) (one fp32 octave), decode batches with the KV-slot mapping, and a
// std::nth_element baseline on packed (key, column) words for comparison.
#include "kernels/topk/topk.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "bench/cpu/bench_util.h"
#include "kernels/common/tensor.h"
#include "kernels/topk/row_select.h"

namespace attnd::bench {
namespace {

using kernels::DType;
namespace topk = kernels::topk;

struct TopKInputs {
  std::vector<float> logits;
  std::vector<int32_t> lengths;
  std::vector<int32_t> indices;
  std::vector<float> values;
  std::vector<int32_t> block_table;
  topk::Params p;
};

// Full-width windows; logits N(0, 1) or U[1, 2).
void MakeInputs(TopKInputs& in, int64_t m, int64_t n, int64_t k, bool one_octave, int64_t page) {
  std::mt19937_64 rng(42);
  if (one_octave) {
    in.logits = RandomF32(m * n, rng, 1.0f, 2.0f);
  } else {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    in.logits.resize(static_cast<size_t>(m * n));
    for (auto& x : in.logits) x = normal(rng);
  }
  in.lengths.assign(static_cast<size_t>(m), static_cast<int32_t>(n));
  in.indices.resize(static_cast<size_t>(m * k));
  in.values.resize(static_cast<size_t>(m * k));
  in.p.logits = kernels::MakeTensor(in.logits.data(), DType::kF32, {m, n});
  in.p.lengths = kernels::MakeTensor(in.lengths.data(), DType::kI32, {m});
  in.p.k = k;
  in.p.indices = kernels::MakeTensor(in.indices.data(), DType::kI32, {m, k});
  in.p.values = kernels::MakeTensor(in.values.data(), DType::kF32, {m, k});
  if (page > 0) {
    const int64_t blocks = (n + page - 1) / page;
    in.block_table.resize(static_cast<size_t>(m * blocks));
    for (size_t i = 0; i < in.block_table.size(); ++i) in.block_table[i] = static_cast<int32_t>(i);
    in.p.block_table = kernels::MakeTensor(in.block_table.data(), DType::kI32, {m, blocks});
    in.p.page_size = page;
  }
}

void SetCounters(benchmark::State& state, const topk::Params& p) {
  SetWorkCounters(state, topk::Count(p));
  state.counters["rows/s"] = benchmark::Counter(
      static_cast<double>(p.logits.dim(0)) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

// Args: M, N, k, one_octave (0/1), page_size (0 = no mapping).
void BM_TopK(benchmark::State& state) {
  TopKInputs in;
  MakeInputs(in, state.range(0), state.range(1), state.range(2), state.range(3) != 0,
             state.range(4));
  const kernels::ExecContext ctx = CpuContext();
  for (auto _ : state) {
    const absl::Status s = topk::Run(in.p, ctx);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::DoNotOptimize(in.indices.data());
  }
  SetCounters(state, in.p);
}
BENCHMARK(BM_TopK)
    ->ArgNames({"M", "N", "k", "octave", "page"})
    ->Args({64, 32768, 2048, 0, 0})
    ->Args({8, 131072, 2048, 0, 0})
    ->Args({8, 131072, 2048, 1, 0})
    ->Args({128, 32768, 2048, 0, 64})
    ->Args({4096, 4096, 2048, 0, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// One thread, one cache-resident row: RowSelector alone (sample, filter, radix select, collect).
// Args: N, k, one_octave (0/1).
void BM_TopKRowSelect(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1);
  std::mt19937_64 rng(7);
  std::vector<float> row;
  if (state.range(2) != 0) {
    row = RandomF32(n, rng, 1.0f, 2.0f);
  } else {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    row.resize(static_cast<size_t>(n));
    for (auto& x : row) x = normal(rng);
  }
  topk::RowSelector selector;
  for (auto _ : state) benchmark::DoNotOptimize(selector.Select(row.data(), 0, n, k));
  state.counters["GB/s"] =
      benchmark::Counter(4e-9 * static_cast<double>(n) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_TopKRowSelect)
    ->ArgNames({"N", "k", "octave"})
    ->Args({32768, 2048, 0})
    ->Args({131072, 2048, 0})
    ->Args({131072, 2048, 1})
    ->Unit(benchmark::kMicrosecond);

// Baseline: per row, std::nth_element on (key << 32 | ~column) words, then the k best written
// out; same threads. What RowSelector is measured against.
void BM_TopKNthElementBaseline(benchmark::State& state) {
  TopKInputs in;
  MakeInputs(in, state.range(0), state.range(1), state.range(2), state.range(3) != 0, 0);
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const kernels::ExecContext ctx = CpuContext();
  for (auto _ : state) {
    kernels::ParallelFor(ctx.pool, m, 1, [&](int64_t begin, int64_t end) {
      std::vector<uint64_t> packed(static_cast<size_t>(n));
      for (int64_t r = begin; r < end; ++r) {
        const float* row = in.logits.data() + r * n;
        for (int64_t j = 0; j < n; ++j) {
          packed[static_cast<size_t>(j)] = (uint64_t{topk::LogitKey(row[j])} << 32) |
                                           static_cast<uint32_t>(~static_cast<uint32_t>(j));
        }
        std::nth_element(packed.begin(), packed.begin() + (k - 1), packed.end(),
                         std::greater<uint64_t>());
        int32_t* out = in.indices.data() + r * k;
        for (int64_t j = 0; j < k; ++j) {
          out[j] = static_cast<int32_t>(~static_cast<uint32_t>(packed[static_cast<size_t>(j)]));
        }
      }
    });
    benchmark::DoNotOptimize(in.indices.data());
  }
  in.p.values = kernels::Tensor{};
  SetCounters(state, in.p);
}
BENCHMARK(BM_TopKNthElementBaseline)
    ->ArgNames({"M", "N", "k", "octave"})
    ->Args({64, 32768, 2048, 0})
    ->Args({8, 131072, 2048, 0})
    ->Args({8, 131072, 2048, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace attnd::bench
