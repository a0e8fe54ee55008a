// The fused DSA layer on the CPU backend: a 256-token prefill chunk after an 8192-token prefix
// (causal windows), DeepSeek-V3.2's indexer (H_i 64, D_i 128, top-2048) and attention (H 128,
// d_qk 576). Reports the whole layer's time, FLOPs and logical bytes.
#include "kernels/dsa/dsa.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench/cpu/bench_util.h"

namespace attnd::bench {
namespace {

using kernels::DType;
namespace dsa = kernels::dsa;

void BM_DsaLayer(benchmark::State& state) {
  const int64_t t = state.range(0), prefix = state.range(1), h_i = state.range(2),
                d_i = state.range(3), h = state.range(4), d_qk = state.range(5), k = 2048;
  const int64_t n = prefix + t;
  std::mt19937_64 rng(7);
  std::vector<uint8_t> index_q = RandomFp8(t * h_i * d_i, rng);
  std::vector<uint8_t> index_k = RandomFp8(n * d_i, rng);
  std::vector<float> k_scale = RandomF32(n, rng, 0.01f, 0.1f);
  std::vector<float> weights = RandomF32(t * h_i, rng, -1.0f, 1.0f);
  std::vector<int32_t> ks(static_cast<size_t>(t), 0), ke(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) ke[i] = static_cast<int32_t>(prefix + i + 1);
  std::vector<uint16_t> q = RandomBf16(t * h * d_qk, rng);
  std::vector<uint16_t> kv = RandomBf16(n * d_qk, rng);
  std::vector<uint16_t> out(static_cast<size_t>(t * h * 512));
  std::vector<float> lse(static_cast<size_t>(t * h));
  std::vector<int32_t> indices(static_cast<size_t>(t * k));

  dsa::Params p;
  p.index_q = kernels::MakeTensor(index_q.data(), DType::kFp8E4M3, {t, h_i, d_i});
  p.index_k = kernels::MakeTensor(index_k.data(), DType::kFp8E4M3, {n, d_i});
  p.index_k_scale = kernels::MakeTensor(k_scale.data(), DType::kF32, {n});
  p.index_weights = kernels::MakeTensor(weights.data(), DType::kF32, {t, h_i});
  p.ks = kernels::MakeTensor(ks.data(), DType::kI32, {t});
  p.ke = kernels::MakeTensor(ke.data(), DType::kI32, {t});
  p.topk = k;
  p.q = kernels::MakeTensor(q.data(), DType::kBF16, {t, h, d_qk});
  p.kv = kernels::MakeTensor(kv.data(), DType::kBF16, {n, d_qk});
  p.sm_scale = 0.0416667f;
  p.out = kernels::MakeTensor(out.data(), DType::kBF16, {t, h, 512});
  p.lse = kernels::MakeTensor(lse.data(), DType::kF32, {t, h});
  p.indices = kernels::MakeTensor(indices.data(), DType::kI32, {t, k});
  const kernels::ExecContext ctx = CpuContext();
  for (auto _ : state) {
    const absl::Status status = dsa::Run(p, ctx);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  SetWorkCounters(state, dsa::Count(p));
}

// Args: T, prefix, H_i, D_i, H, d_qk.
BENCHMARK(BM_DsaLayer)
    ->Name("dsa/layer_T256_N8448_Hi64_Di128_top2048_H128_d576")
    ->Args({256, 8192, 64, 128, 128, 576})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->UseRealTime();

}  // namespace
}  // namespace attnd::bench
