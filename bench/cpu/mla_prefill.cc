// Dense MLA prefill on the CPU backend: DeepSeek's non-absorbed qk 192 / v 128 heads, a causal
// 1K prompt, a packed batch of shorter prompts, and a chunk of 512 queries over a 4K prefix.
#include "kernels/mla_prefill/mla_prefill.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench/cpu/bench_util.h"

namespace attnd::bench {
namespace {

using kernels::DType;
namespace mla_prefill = kernels::mla_prefill;

void BM_MlaPrefill(benchmark::State& state) {
  const int64_t batch = state.range(0), lq = state.range(1), lk = state.range(2),
                heads = state.range(3), d_qk = state.range(4), d_v = state.range(5);
  const bool causal = state.range(6) != 0;
  const int64_t total_q = batch * lq, total_k = batch * lk;
  std::mt19937_64 rng(42);
  std::vector<uint16_t> q = RandomBf16(total_q * heads * d_qk, rng);
  std::vector<uint16_t> k = RandomBf16(total_k * heads * d_qk, rng);
  std::vector<uint16_t> v = RandomBf16(total_k * heads * d_v, rng);
  std::vector<int32_t> cu_q(static_cast<size_t>(batch + 1)), cu_k(static_cast<size_t>(batch + 1));
  for (int64_t b = 0; b <= batch; ++b) {
    cu_q[b] = static_cast<int32_t>(b * lq);
    cu_k[b] = static_cast<int32_t>(b * lk);
  }
  std::vector<uint16_t> out(static_cast<size_t>(total_q * heads * d_v));
  std::vector<float> lse(static_cast<size_t>(total_q * heads));

  mla_prefill::Params p;
  p.q = kernels::MakeTensor(q.data(), DType::kBF16, {total_q, heads, d_qk});
  p.k = kernels::MakeTensor(k.data(), DType::kBF16, {total_k, heads, d_qk});
  p.v = kernels::MakeTensor(v.data(), DType::kBF16, {total_k, heads, d_v});
  p.cu_seqlens_q = kernels::MakeTensor(cu_q.data(), DType::kI32, {batch + 1});
  p.cu_seqlens_k = kernels::MakeTensor(cu_k.data(), DType::kI32, {batch + 1});
  p.out = kernels::MakeTensor(out.data(), DType::kBF16, {total_q, heads, d_v});
  p.lse = kernels::MakeTensor(lse.data(), DType::kF32, {total_q, heads});
  p.sm_scale = 0.0721688f;  // 1/sqrt(192)
  p.causal = causal;
  const kernels::ExecContext ctx = CpuContext();
  for (auto _ : state) {
    const absl::Status status = mla_prefill::Run(p, ctx);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  SetWorkCounters(state, mla_prefill::Count(p));
}

// Args: B, Lq, Lk, H (= H_kv), d_qk, d_v, causal.
BENCHMARK(BM_MlaPrefill)
    ->Name("mla_prefill/causal_B1_L1024_H16_d192_128")
    ->Args({1, 1024, 1024, 16, 192, 128, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_MlaPrefill)
    ->Name("mla_prefill/causal_B4_L256_H16_d192_128")
    ->Args({4, 256, 256, 16, 192, 128, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_MlaPrefill)
    ->Name("mla_prefill/chunk_causal_B1_Lq512_Lk4096_H16_d192_128")
    ->Args({1, 512, 4096, 16, 192, 128, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace attnd::bench
