// Sparse MLA on the CPU backend: a low-head decode-size H16/d512 shape (GLM-5.x) and
// DeepSeek-V3.2's H128/d576 prefill shape, each query selecting K = 2048 random rows of a 32K-row
// cache.
#include "kernels/sparse_mla/sparse_mla.h"

#include <cstdint>
#include <random>
#include <vector>

#include "bench/cpu/bench_util.h"

namespace attnd::bench {
namespace {

using kernels::DType;
namespace sparse_mla = kernels::sparse_mla;

void BM_SparseMla(benchmark::State& state) {
  const int64_t t = state.range(0), h = state.range(1), k = state.range(2), d_qk = state.range(3),
                s = state.range(4);
  std::mt19937_64 rng(42);
  std::vector<uint16_t> q = RandomBf16(t * h * d_qk, rng);
  std::vector<uint16_t> kv = RandomBf16(s * d_qk, rng);
  std::vector<int32_t> indices(static_cast<size_t>(t * k));
  std::uniform_int_distribution<int32_t> row(0, static_cast<int32_t>(s - 1));
  for (auto& x : indices) x = row(rng);
  std::vector<uint16_t> out(static_cast<size_t>(t * h * sparse_mla::kDimV));
  std::vector<float> lse(static_cast<size_t>(t * h));

  sparse_mla::Params p;
  p.q = kernels::MakeTensor(q.data(), DType::kBF16, {t, h, d_qk});
  p.kv = kernels::MakeTensor(kv.data(), DType::kBF16, {s, d_qk});
  p.indices = kernels::MakeTensor(indices.data(), DType::kI32, {t, k});
  p.sm_scale = 0.0416667f;
  p.out = kernels::MakeTensor(out.data(), DType::kBF16, {t, h, sparse_mla::kDimV});
  p.lse = kernels::MakeTensor(lse.data(), DType::kF32, {t, h});
  const kernels::ExecContext ctx = CpuContext();
  for (auto _ : state) {
    const absl::Status status = sparse_mla::Run(p, ctx);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  SetWorkCounters(state, sparse_mla::Count(p));
}

// Args: T, H, K, d_qk, S.
BENCHMARK(BM_SparseMla)
    ->Name("sparse_mla/decode_T64_H16_K2048_d512")
    ->Args({64, 16, 2048, 512, 32768})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_SparseMla)
    ->Name("sparse_mla/deepseek_T256_H128_K2048_d576")
    ->Args({256, 128, 2048, 576, 32768})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2)
    ->UseRealTime();
BENCHMARK(BM_SparseMla)
    ->Name("sparse_mla/glm_T256_H64_K2048_d512")
    ->Args({256, 64, 2048, 512, 32768})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2)
    ->UseRealTime();

}  // namespace
}  // namespace attnd::bench
