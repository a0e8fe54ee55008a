// Dense MLA decode on the GPU (attn_gpu_bench): DeepSeek d576 latent cache, page 64, s_q 1, for B
// 1/32/128 x context 4K/32K x H 16/64/128 (FlashMLA's anchors: docs/BENCHMARKS.md
// "Anchors and ceilings"). Each request owns its pages, shuffled over the cache. Work counted on
// the host from the shape: FLOPs 2·B·s_q·H·L·(d_qk + 512); bytes = q + the cache rows read once
// (2·d_qk·B·L) + out + lse + block table + seqlens. Every case in both precisions (FAST, HIGH).
// Each shape also with vLLM's per-tensor FP8 cache (preset suffix "_fp8": u8 e4m3 codes, kv_scale
// 0.037, d_qk bytes per row read). cuda_wgmma beside cuda_mma where it applies (bf16, H 64 / 128).
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gpu/gpu_bench.h"
#include "kernels/mla_decode/mla_decode.h"

namespace attnd::bench {
namespace {

using kernels::DType;
using kernels::ExecContext;
namespace mla_decode = kernels::mla_decode;

constexpr int64_t kPage = 64, kDqk = 576;
constexpr float kFp8KvScale = 0.037f;  // not a power of two, like a calibrated k_scale

struct Cache {  // the pages of B requests of `ctx` positions, shared by every H
  std::shared_ptr<DeviceArena> arena;
  void* kv = nullptr;
  void* table = nullptr;
  void* seqlens = nullptr;
};

// fp8: the per-tensor FP8 cache (random e4m3 codes, viewed as u8), else bf16.
absl::StatusOr<Cache> MakeCache(int64_t batch, int64_t ctx, bool fp8, uint64_t seed) {
  Cache c;
  c.arena = std::make_shared<DeviceArena>();
  const int64_t pages_per_req = ctx / kPage, pages = batch * pages_per_req;
  auto kv = c.arena->Random(fp8 ? DType::kFp8E4M3 : DType::kBF16, pages * kPage * kDqk, 1.0f, seed);
  if (!kv.ok()) return kv.status();
  c.kv = *kv;
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(table.begin(), table.end(), rng);
  auto t = c.arena->Upload(table.data(), static_cast<int64_t>(table.size()) * 4);
  if (!t.ok()) return t.status();
  c.table = *t;
  const std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(ctx));
  auto l = c.arena->Upload(lens.data(), batch * 4);
  if (!l.ok()) return l.status();
  c.seqlens = *l;
  return c;
}

absl::StatusOr<std::vector<GpuBenchCase>> MakeCases(const std::string& filter) {
  std::vector<GpuBenchCase> cases;
  std::map<std::tuple<int64_t, int64_t, bool>, Cache> caches;
  uint64_t seed = 1;
  for (const bool fp8 : {false, true}) {
    for (const int64_t batch : {1, 32, 128}) {
      for (const int64_t ctx : {4096, 32768}) {
        for (const int64_t heads : {16, 64, 128}) {
          const std::string preset = absl::StrCat("dense_decode_b", batch, "_ctx", ctx, "_h", heads,
                                                  "_d576", fp8 ? "_fp8" : "");
          std::vector<std::string> impls = {"cuda_mma"};
          // The sm_90a wgmma kernel where it applies (bf16 cache, H a multiple of 64); skipped
          // below on other devices.
          if (!fp8 && heads % 64 == 0) impls.insert(impls.begin(), "cuda_wgmma");
          if (ctx == 4096) impls.push_back("cuda_simt");  // the portable path, at the short context
          bool wanted = false;
          for (const std::string& impl : impls) {
            wanted |= MayMatch(absl::StrCat("mla_decode/", preset, "/", impl), filter);
          }
          if (!wanted) continue;
          auto it = caches.find({batch, ctx, fp8});
          if (it == caches.end()) {
            auto cache = MakeCache(batch, ctx, fp8, ++seed);
            if (!cache.ok()) return cache.status();
            it = caches.emplace(std::make_tuple(batch, ctx, fp8), *cache).first;
          }
          const Cache& cache = it->second;
          auto arena = std::make_shared<DeviceArena>();
          auto q = arena->Random(DType::kBF16, batch * heads * kDqk, 1.0f, ++seed);
          auto out = arena->Alloc(batch * heads * mla_decode::kDv * 2);
          auto lse = arena->Alloc(batch * heads * 4);
          if (!q.ok() || !out.ok() || !lse.ok()) return absl::ResourceExhaustedError(preset);
          mla_decode::Params p;
          const int64_t max_pages = ctx / kPage;
          p.q = kernels::MakeTensor(*q, DType::kBF16, {batch, 1, heads, kDqk});
          p.kv_cache = kernels::MakeTensor(cache.kv, fp8 ? DType::kU8 : DType::kBF16,
                                           {batch * max_pages, kPage, kDqk});
          if (fp8) p.kv_scale = kFp8KvScale;
          p.block_table = kernels::MakeTensor(cache.table, DType::kI32, {batch, max_pages});
          p.cache_seqlens = kernels::MakeTensor(cache.seqlens, DType::kI32, {batch});
          p.out = kernels::MakeTensor(*out, DType::kBF16, {batch, 1, heads, mla_decode::kDv});
          p.lse = kernels::MakeTensor(*lse, DType::kF32, {batch, 1, heads});
          p.sm_scale = 1.0f / 24.0f;
          kernels::WorkCount work;
          const double rows = static_cast<double>(batch) * heads;
          work.flops = 2.0 * rows * ctx * (kDqk + mla_decode::kDv);
          const double kv_row_bytes = (fp8 ? 1.0 : 2.0) * kDqk;
          work.bytes = 2.0 * rows * kDqk + kv_row_bytes * batch * ctx +
                       2.0 * rows * mla_decode::kDv + 4.0 * rows + 4.0 * batch * (max_pages + 1);
          for (const std::string& name : impls) {
            const auto* impl = FindImpl(mla_decode::Implementations(), name);
            std::string why;
            if (name == "cuda_wgmma" && impl != nullptr && !impl->supports(p, &why)) continue;
            if (impl == nullptr || !impl->supports(p, &why)) {
              return absl::FailedPreconditionError(absl::StrCat(preset, " ", name, ": ", why));
            }
            const int64_t ws_bytes = impl->workspace ? impl->workspace(p) : 0;
            void* ws = nullptr;
            if (ws_bytes > 0) {
              auto w = arena->Alloc(ws_bytes);
              if (!w.ok()) return w.status();
              ws = *w;
            }
            for (const kernels::Precision precision : kBenchPrecisions) {
              GpuBenchCase c;
              c.op = "mla_decode";
              c.preset = preset;
              c.impl = name;
              c.precision = kernels::PrecisionName(precision);
              c.work = work;
              c.peak = PeakKind::kBf16;
              c.arena = arena;
              auto keep_cache = cache.arena;
              mla_decode::Params pp = p;
              pp.precision = precision;
              c.launch = [impl, pp, ws, ws_bytes, keep_cache](gpu::Stream stream) {
                ExecContext ctx;
                ctx.backend = kernels::Backend::kCuda;
                ctx.stream = stream;
                ctx.workspace = ws;
                ctx.workspace_bytes = ws_bytes;
                return impl->run(pp, ctx);
              };
              cases.push_back(std::move(c));
            }
          }
        }
      }
    }
  }
  return cases;
}

ATTND_REGISTER_GPU_BENCH(mla_decode, MakeCases);

}  // namespace
}  // namespace attnd::bench
