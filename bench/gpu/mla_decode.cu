// Dense MLA decode on the GPU (attn_gpu_bench): DeepSeek d576 latent cache, page 64, s_q 1, for B
// 1/32/128 x context 4K/32K x H 16/64/128 (FlashMLA's anchors: docs/BENCHMARKS.md
// "Anchors and ceilings"). Each request owns its pages, shuffled over the cache. Work counted on
// the host from the shape: FLOPs 2·B·s_q·H·L·(d_qk + 512); bytes = q + the cache rows read once
// (2·d_qk·B·L) + out + lse + block table + seqlens. Every case in both precisions (FAST, HIGH).
// Each shape also with vLLM's per-tensor FP8 cache (preset suffix "_fp8": u8 e4m3 codes, kv_scale
// 0.037, d_qk bytes per row read). With the bf16 cache also cuda_wgmma (both precisions; H 16
// rows padded to 64), cuda_wgmma_pp and cuda_wgmma_sf (FAST only), and the launch-option
// variants of cuda_wgmma and cuda_wgmma_sf (FindDecodeImpl: "_bal", "_pf", "_sched"). Presets
// "..._ragged" (B 32 and 128, H 64 and 128, 32K, bf16): lengths drawn from [1, 32768], the
// work counted over them.
// The split-K sweep (op mla_decode_splits, below) runs only when --filter names it.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench/gpu/gpu_bench.h"
#include "kernels/mla_decode/mla_decode.h"

#include "kernels/mla_decode/gpu/launch.h"

namespace attnd::bench {
namespace {

using kernels::DType;
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

using Caches = std::map<std::tuple<int64_t, int64_t, bool>, Cache>;

// The cache of (batch, ctx, fp8), made on first use (seed advanced).
absl::StatusOr<const Cache*> CacheFor(Caches* caches, int64_t batch, int64_t ctx, bool fp8,
                                      uint64_t* seed) {
  auto it = caches->find({batch, ctx, fp8});
  if (it == caches->end()) {
    auto cache = MakeCache(batch, ctx, fp8, ++*seed);
    if (!cache.ok()) return cache.status();
    it = caches->emplace(std::make_tuple(batch, ctx, fp8), *cache).first;
  }
  return &it->second;
}

// One call's buffers and Params over `cache` (s_q 1, every request `ctx` long), without an
// implementation, and its work counted from the shape.
struct Call {
  mla_decode::Params p;
  std::shared_ptr<DeviceArena> arena;  // q, out, lse (and the cases' workspaces)
  kernels::WorkCount work;
};

absl::StatusOr<Call> MakeCall(const Cache& cache, int64_t batch, int64_t ctx, int64_t heads,
                              bool fp8, uint64_t seed, bool ragged = false) {
  Call call;
  call.arena = std::make_shared<DeviceArena>();
  // ragged: lengths uniform in [1, ctx] from `seed` (the table and cache as for ctx), in their
  // own buffer; the work counts their sum.
  double positions = static_cast<double>(batch) * ctx;
  void* seqlens = cache.seqlens;
  if (ragged) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> lens(static_cast<size_t>(batch));
    positions = 0;
    for (int32_t& l : lens) {
      l = static_cast<int32_t>(1 + rng() % static_cast<uint64_t>(ctx));
      positions += l;
    }
    auto l = call.arena->Upload(lens.data(), batch * 4);
    if (!l.ok()) return l.status();
    seqlens = *l;
  }
  auto q = call.arena->Random(DType::kBF16, batch * heads * kDqk, 1.0f, seed);
  auto out = call.arena->Alloc(batch * heads * mla_decode::kDv * 2);
  auto lse = call.arena->Alloc(batch * heads * 4);
  if (!q.ok() || !out.ok() || !lse.ok()) return absl::ResourceExhaustedError("q, out, lse");
  mla_decode::Params& p = call.p;
  const int64_t max_pages = ctx / kPage;
  p.q = kernels::MakeTensor(*q, DType::kBF16, {batch, 1, heads, kDqk});
  p.kv_cache = kernels::MakeTensor(cache.kv, fp8 ? DType::kU8 : DType::kBF16,
                                   {batch * max_pages, kPage, kDqk});
  if (fp8) p.kv_scale = kFp8KvScale;
  p.block_table = kernels::MakeTensor(cache.table, DType::kI32, {batch, max_pages});
  p.cache_seqlens = kernels::MakeTensor(seqlens, DType::kI32, {batch});
  p.out = kernels::MakeTensor(*out, DType::kBF16, {batch, 1, heads, mla_decode::kDv});
  p.lse = kernels::MakeTensor(*lse, DType::kF32, {batch, 1, heads});
  p.sm_scale = 1.0f / 24.0f;
  const double rows = static_cast<double>(batch) * heads;
  call.work.flops = 2.0 * heads * positions * (kDqk + mla_decode::kDv);
  const double kv_row_bytes = (fp8 ? 1.0 : 2.0) * kDqk;
  call.work.bytes = 2.0 * rows * kDqk + kv_row_bytes * positions + 2.0 * rows * mla_decode::kDv +
                    4.0 * rows + 4.0 * batch * (max_pages + 1);
  return call;
}

// Launch-option variants of the wgmma kernels, by name: "<impl>_bal" runs the wave-balanced
// split plan (launch.h DecodeLaunchOptions::balanced; even splits where it does not apply),
// "<impl>_sched" the length-aware schedule (DecodeLaunchOptions::schedule), "<impl>_pf" turns
// the L2 prefetch on (off by default since 2026-12-08; docs/KERNELS.md "Wave-balanced splits",
// "A schedule from the lengths"), "<impl>_ctl" the default options again (listed last: a
// control of an A/B, whose figure should match the plain impl's). The registered
// implementation's supports; its launcher's `...With` form.
const kernels::Impl<mla_decode::Params>* FindDecodeImpl(const std::string& name) {
  static const auto* variants = [] {
    auto* v = new std::map<std::string, kernels::Impl<mla_decode::Params>>();
    using mla_decode::gpu::GpuKernel;
    for (const auto& [base, kernel] :
         {std::pair<std::string, GpuKernel>{"cuda_wgmma", GpuKernel::kWgmma},
          {"cuda_wgmma_sf", GpuKernel::kWgmmaSf}}) {
      const auto* impl = FindImpl(mla_decode::Implementations(), base);
      if (impl == nullptr) continue;
      for (const char* form : {"_bal", "_pf", "_sched", "_ctl"}) {
        mla_decode::gpu::DecodeLaunchOptions options;
        options.balanced = form == std::string("_bal");
        options.schedule = form == std::string("_sched");
        options.prefetch_l2 = form == std::string("_pf") ? 1 : -1;
        auto splits_of = [kernel = kernel, options](const mla_decode::Params& p) {
          const int bal = options.balanced ? mla_decode::gpu::BalancedSplits(p, kernel) : 0;
          return bal > 0 ? bal : mla_decode::gpu::GpuSplits(p, kernel);
        };
        auto bytes_of = [kernel = kernel, options, splits_of](const mla_decode::Params& p) {
          const int64_t sched =
              options.schedule ? mla_decode::gpu::ScheduleWorkspaceBytes(p, kernel) : 0;
          return sched > 0 ? sched : mla_decode::gpu::SplitWorkspaceBytes(p, splits_of(p));
        };
        kernels::Impl<mla_decode::Params> variant = *impl;
        variant.name = base + form;
        variant.workspace = bytes_of;
        variant.run = [splits_of, bytes_of, kernel = kernel, options](
                          const mla_decode::Params& p, const kernels::ExecContext& ctx) {
          const int splits = splits_of(p);
          if (bytes_of(p) > ctx.workspace_bytes) return absl::ResourceExhaustedError("workspace");
          const auto stream = static_cast<gpu::Stream>(ctx.stream);
          mla_decode::gpu::DecodeLaunchOptions sized = options;
          sized.workspace_bytes = ctx.workspace_bytes;
          GPU_RETURN_IF_ERROR(mla_decode::gpu::LaunchMlaDecodeWith(kernel, p, splits, ctx.workspace,
                                                                   stream, sized));
          return absl::OkStatus();
        };
        v->emplace(variant.name, std::move(variant));
      }
    }
    return v;
  }();
  const auto it = variants->find(name);
  if (it != variants->end()) return &it->second;
  return FindImpl(mla_decode::Implementations(), name);
}

absl::StatusOr<std::vector<GpuBenchCase>> MakeCases(const std::string& filter) {
  std::vector<GpuBenchCase> cases;
  Caches caches;
  uint64_t seed = 1;
  for (const bool fp8 : {false, true}) {
    for (const int64_t batch : {1, 32, 128}) {
      for (const int64_t ctx : {4096, 32768}) {
        for (const int64_t heads : {16, 64, 128}) {
          for (const bool ragged : {false, true}) {
            // "_ragged": the same table with lengths drawn from [1, ctx] (MakeCall), where a
            // plan from the shapes alone waits for the longest request (bf16, B >= 32, 32K).
            if (ragged && (fp8 || ctx != 32768 || batch < 32 || heads == 16)) continue;
            const std::string preset =
                absl::StrCat("dense_decode_b", batch, "_ctx", ctx, "_h", heads, "_d576",
                             fp8 ? "_fp8" : "", ragged ? "_ragged" : "");
            std::vector<std::string> impls = {"cuda_mma"};
            // The sm_90a wgmma kernels where they apply (bf16 cache; H < 64 with rows padded to
            // 64); skipped below on other devices. cuda_wgmma_pp: FAST only (skipped at HIGH).
            if (!fp8) impls.insert(impls.begin(), "cuda_wgmma_pp");
            // cuda_wgmma_sf: the same calls (FAST) with no producer, stages by TMA (page size 64).
            if (!fp8) impls.insert(impls.begin(), "cuda_wgmma_sf");
            if (!fp8) impls.insert(impls.begin(), "cuda_wgmma");
            if (ctx == 4096)
              impls.push_back("cuda_simt");             // the portable path, at the short context
            if (!fp8 && ctx == 32768 && batch >= 32) {  // launch-option variants (FindDecodeImpl)
              for (const char* v :
                   {"cuda_wgmma_bal", "cuda_wgmma_pf", "cuda_wgmma_sched", "cuda_wgmma_sf_bal",
                    "cuda_wgmma_sf_pf", "cuda_wgmma_sf_sched", "cuda_wgmma_ctl"}) {
                impls.push_back(v);
              }
            }
            bool wanted = false;
            for (const std::string& impl : impls) {
              wanted |= MayMatch(absl::StrCat("mla_decode/", preset, "/", impl), filter) ||
                        MayMatch(absl::StrCat("mla_decode/", preset, "_invariant/", impl), filter);
            }
            if (!wanted) continue;
            auto cache = CacheFor(&caches, batch, ctx, fp8, &seed);
            if (!cache.ok()) return cache.status();
            auto call = MakeCall(**cache, batch, ctx, heads, fp8, ++seed, ragged);
            if (!call.ok()) return absl::ResourceExhaustedError(preset);
            const auto& arena = call->arena;
            const kernels::WorkCount& work = call->work;
            // The batch-invariant plan beside the default one (preset "<shape>_invariant"; docs/
            // BENCHMARKS.md "Batch invariance"): the compute-bound B32 H128 32K and the
            // launch-bound B1 H128 4K shapes, bf16 cache.
            const bool with_invariant =
                !fp8 && !ragged && heads == 128 &&
                ((batch == 32 && ctx == 32768) || (batch == 1 && ctx == 4096));
            for (const bool invariant : {false, true}) {
              if (invariant && !with_invariant) continue;
              const std::string case_preset = invariant ? preset + "_invariant" : preset;
              for (const std::string& name : impls) {
                if (!MayMatch(absl::StrCat("mla_decode/", case_preset, "/", name), filter))
                  continue;
                const bool variant = absl::EndsWith(name, "_bal") || absl::EndsWith(name, "_pf") ||
                                     absl::EndsWith(name, "_sched") || absl::EndsWith(name, "_ctl");
                if (invariant && variant) continue;  // the invariant plan has its own splits
                const auto* impl = FindDecodeImpl(name);
                mla_decode::Params p = call->p;
                p.batch_invariant = invariant;
                std::string why;
                if (absl::StartsWith(name, "cuda_wgmma") && impl != nullptr &&
                    !impl->supports(p, &why)) {
                  continue;
                }
                if (impl == nullptr || !impl->supports(p, &why)) {
                  return absl::FailedPreconditionError(absl::StrCat(preset, " ", name, ": ", why));
                }
                const absl::StatusOr<Workspace> ws = WorkspaceFor(*impl, p, *arena);
                if (!ws.ok()) return ws.status();
                for (const kernels::Precision precision : kBenchPrecisions) {
                  mla_decode::Params at = p;
                  at.precision = precision;
                  if (!impl->supports(at, &why)) continue;  // cuda_wgmma_pp / _sf at HIGH
                  GpuBenchCase c;
                  c.op = "mla_decode";
                  c.preset = case_preset;
                  c.impl = name;
                  c.precision = kernels::PrecisionName(precision);
                  c.work = work;
                  c.peak = PeakKind::kBf16;
                  c.arena = arena;
                  auto keep_cache = (*cache)->arena;
                  mla_decode::Params pp = p;
                  pp.precision = precision;
                  c.launch = [impl, pp, w = *ws, keep_cache](gpu::Stream stream) {
                    return RunImpl(*impl, pp, w, stream);
                  };
                  cases.push_back(std::move(c));
                }
              }
            }
          }
        }
      }
    }
  }
  return cases;
}

// Split-K sweep: how far the split count GpuSplits picks is from the best per shape
// (docs/BENCHMARKS.md "Dense MLA decode: split-K sweep"). Op "mla_decode_splits", built only when
// --filter contains "mla_decode_splits" (the default run and --filter=mla_decode skip it):
//   attn_gpu_bench --replays=20 --filter=mla_decode_splits/dense_decode_b1_ctx4096_h64
// Each shape runs its kernel through launch.h's launcher (no Supports or plan in between) at
// explicit split counts s from kSweepSplits up to the shape's max_splits (which may pass the
// plan's cap of two tiles per split: s = ctx / 64 gives every split one tile) and at the count
// GpuSplits picks, in both precisions; one workspace per shape sized SplitWorkspaceBytes(p,
// largest s). Preset "<shape>_s<s>", "-heuristic" appended at the pick.
struct SweepShape {
  int64_t batch, ctx, heads;
  mla_decode::gpu::GpuKernel kernel;
  int max_splits;  // items · max_splits stays within a few waves of 132 SMs
};

constexpr mla_decode::gpu::GpuKernel kSweepWgmma = mla_decode::gpu::GpuKernel::kWgmma;
constexpr mla_decode::gpu::GpuKernel kSweepMma = mla_decode::gpu::GpuKernel::kMma;
constexpr SweepShape kSweepShapes[] = {
    {32, 32768, 128, kSweepWgmma, 8}, {128, 32768, 64, kSweepWgmma, 4},
    {128, 32768, 16, kSweepMma, 4},   {1, 4096, 64, kSweepWgmma, 64},
    {1, 4096, 128, kSweepWgmma, 64},  {1, 4096, 16, kSweepMma, 64},
};
constexpr int kSweepSplits[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};

absl::Status LaunchWithSplits(const mla_decode::Params& p, mla_decode::gpu::GpuKernel kernel,
                              int splits, void* workspace, gpu::Stream stream) {
  if (kernel == kSweepWgmma) {
    GPU_RETURN_IF_ERROR(mla_decode::gpu::LaunchMlaDecodeWgmma(p, splits, workspace, stream));
  } else {
    GPU_RETURN_IF_ERROR(mla_decode::gpu::LaunchMlaDecodeMma(p, splits, workspace, stream));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<GpuBenchCase>> MakeSplitSweepCases(const std::string& filter) {
  std::vector<GpuBenchCase> cases;
  if (filter.find("mla_decode_splits") == std::string::npos) return cases;
  Caches caches;
  uint64_t seed = 7000;
  for (const SweepShape& shape : kSweepShapes) {
    seed += 3;
    const std::string name =
        absl::StrCat("dense_decode_b", shape.batch, "_ctx", shape.ctx, "_h", shape.heads, "_d576");
    const std::string prefix = absl::StrCat("mla_decode_splits/", name);
    if (filter.find(prefix) == std::string::npos && prefix.find(filter) == std::string::npos) {
      continue;  // the filter names another shape
    }
    const char* impl = shape.kernel == kSweepWgmma ? "cuda_wgmma" : "cuda_mma";
    auto cache = CacheFor(&caches, shape.batch, shape.ctx, /*fp8=*/false, &seed);
    if (!cache.ok()) return cache.status();
    auto call = MakeCall(**cache, shape.batch, shape.ctx, shape.heads, /*fp8=*/false, seed + 1);
    if (!call.ok()) return call.status();
    std::string why;
    if (!mla_decode::gpu::GpuSupports(shape.kernel, call->p, &why)) {
      std::cerr << "skipping " << prefix << ": " << impl << ": " << why << "\n";
      continue;
    }
    for (const kernels::Precision precision : kBenchPrecisions) {
      mla_decode::Params p = call->p;
      p.precision = precision;
      const int heuristic = mla_decode::gpu::GpuSplits(p, shape.kernel);
      std::vector<int> splits = {heuristic};  // the pick, even where the list lacks it
      for (int s : kSweepSplits) {
        if (s <= shape.max_splits && s <= mla_decode::gpu::kMaxSplits && s != heuristic) {
          splits.push_back(s);
        }
      }
      std::sort(splits.begin(), splits.end());
      void* workspace = nullptr;
      if (splits.back() > 1) {
        auto ws = call->arena->Alloc(mla_decode::gpu::SplitWorkspaceBytes(p, splits.back()));
        if (!ws.ok()) return ws.status();
        workspace = *ws;
      }
      for (int s : splits) {
        GpuBenchCase c;
        c.op = "mla_decode_splits";
        c.preset = absl::StrCat(name, "_s", s, s == heuristic ? "-heuristic" : "");
        c.impl = impl;
        c.precision = kernels::PrecisionName(precision);
        c.peak = PeakKind::kBf16;
        c.work = call->work;
        c.arena = call->arena;
        c.launch = [p, kernel = shape.kernel, s, workspace,
                    keep = (*cache)->arena](gpu::Stream stream) {
          return LaunchWithSplits(p, kernel, s, workspace, stream);
        };
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

ATTND_REGISTER_GPU_BENCH(mla_decode, MakeCases);
ATTND_REGISTER_GPU_BENCH(mla_decode_splits, MakeSplitSweepCases);

}  // namespace
}  // namespace attnd::bench
