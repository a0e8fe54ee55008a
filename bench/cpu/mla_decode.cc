// Dense MLA decode on the CPU backend: DeepSeek's d576 latent cache (page 64) at a 4K context,
// few requests with 128 heads (compute-heavy rows) and many with 16 heads, plus MTP (s_q 2).
#include "kernels/mla_decode/mla_decode.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/cpu/bench_util.h"

namespace attnd::bench {
namespace {

using kernels::DType;
namespace mla_decode = kernels::mla_decode;

void BM_MlaDecode(benchmark::State& state) {
  const int64_t batch = state.range(0), s_q = state.range(1), heads = state.range(2),
                ctx_len = state.range(3), d_qk = state.range(4);
  const int64_t page = 64, max_pages = (ctx_len + page - 1) / page, num_pages = batch * max_pages;
  std::mt19937_64 rng(42);
  std::vector<uint16_t> q = RandomBf16(batch * s_q * heads * d_qk, rng);
  std::vector<uint16_t> kv = RandomBf16(num_pages * page * d_qk, rng);
  std::vector<int32_t> table(static_cast<size_t>(num_pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int32_t> seqlens(static_cast<size_t>(batch), static_cast<int32_t>(ctx_len));
  std::vector<uint16_t> out(static_cast<size_t>(batch * s_q * heads * mla_decode::kDv));
  std::vector<float> lse(static_cast<size_t>(batch * s_q * heads));

  mla_decode::Params p;
  p.q = kernels::MakeTensor(q.data(), DType::kBF16, {batch, s_q, heads, d_qk});
  p.kv_cache = kernels::MakeTensor(kv.data(), DType::kBF16, {num_pages, page, d_qk});
  p.block_table = kernels::MakeTensor(table.data(), DType::kI32, {batch, max_pages});
  p.cache_seqlens = kernels::MakeTensor(seqlens.data(), DType::kI32, {batch});
  p.out = kernels::MakeTensor(out.data(), DType::kBF16, {batch, s_q, heads, mla_decode::kDv});
  p.lse = kernels::MakeTensor(lse.data(), DType::kF32, {batch, s_q, heads});
  p.sm_scale = 1.0f / 24.0f;
  p.causal = s_q > 1;
  const kernels::ExecContext ctx = CpuContext();
  for (auto _ : state) {
    const absl::Status status = mla_decode::Run(p, ctx);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  SetWorkCounters(state, mla_decode::Count(p));
}

// Args: B, s_q, H, context, d_qk.
BENCHMARK(BM_MlaDecode)
    ->Name("mla_decode/B4_sq1_H128_ctx4096_d576")
    ->Args({4, 1, 128, 4096, 576})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_MlaDecode)
    ->Name("mla_decode/B32_sq1_H16_ctx4096_d576")
    ->Args({32, 1, 16, 4096, 576})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_MlaDecode)
    ->Name("mla_decode/B8_sq2_H64_ctx4096_d576_mtp")
    ->Args({8, 2, 64, 4096, 576})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_MlaDecode)
    ->Name("mla_decode/B1_sq1_H16_ctx32768_d512_split")
    ->Args({1, 1, 16, 32768, 512})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace attnd::bench
