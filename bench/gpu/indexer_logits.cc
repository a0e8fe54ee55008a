// GPU benchmark cases of indexer_logits (prefill) and indexer_logits_paged (decode): the
// DeepSeek-V3.2 (H64) and GLM-5 (H32) presets of docs/BENCHMARKS.md "Anchors and ceilings" with
// causal windows as DeepGEMM's benchmark sets them (ks = 0, ke = N − M + i + 1), clean_logits on;
// the prefill cases in each precision an implementation runs ("op/preset/impl/precision").
// FLOPs = 2·H·D·valid pairs and logical bytes are computed on the host from the shapes (Count
// would read device data).
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gpu/gpu_bench.h"
#include "kernels/common/gpu/runtime.h"
#include "kernels/common/status.h"
#include "kernels/common/tensor.h"
#include "kernels/indexer_logits/gpu/launch.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"
#include "kernels/topk/gpu/filter.h"
#include "kernels/topk/topk.h"

namespace attnd::bench {
namespace {

using kernels::DType;
using kernels::MakeTensor;
using kernels::WorkCount;

constexpr int64_t kDim = 128;
constexpr int64_t kBlockSize = 64;

// The GPU implementations a case runs, in order (cuda_wgmma2p: the paged operator's opt-in form;
// FindImpl finds it there only).
std::vector<std::string> GpuImpls() {
  return {"cuda_wgmma", "cuda_wgmma2p", "cuda_mma", "cuda_simt"};
}

bool Wanted(const std::string& filter, const std::string& op, const std::string& preset,
            const std::vector<std::string>& impls) {
  if (filter.empty()) return true;
  for (const auto& impl : impls) {
    if (MayMatch(absl::StrCat(op, "/", preset, "/", impl), filter)) return true;
  }
  return false;
}

// Whether Params has the `precision` option (both indexer ops have it now; kept generic).
template <class Params, class = void>
struct HasPrecision : std::false_type {};
template <class Params>
struct HasPrecision<Params, std::void_t<decltype(std::declval<Params&>().precision)>>
    : std::true_type {};

// Each implementation in each precision it supports (both ops: cuda_wgmma FAST only,
// cuda_mma and cuda_simt both, the same kernel: their FAST is HIGH's exact sums); the precision
// is the JSON line's "precision" and the name's last part. The SIMT path is a portable fallback
// (~30× slower at these shapes): timed on the small presets only, so a full run stays short.
template <class Params>
void AddCases(const std::string& op, const std::string& preset, const Params& base,
              const WorkCount& work, bool with_simt, const std::shared_ptr<DeviceArena>& arena,
              const std::vector<kernels::Impl<Params>>& impls, std::vector<GpuBenchCase>* out) {
  std::vector<Params> variants;
  if constexpr (HasPrecision<Params>::value) {
    for (const kernels::Precision precision : kBenchPrecisions) {
      variants.push_back(base);
      variants.back().precision = precision;
    }
  } else {
    variants.push_back(base);
  }
  for (const std::string& name : GpuImpls()) {
    if (name == "cuda_simt" && !with_simt) continue;
    const kernels::Impl<Params>* impl = FindImpl(impls, name);
    if (impl == nullptr) continue;
    for (const Params& p : variants) {
      std::string why;
      if (impl->supports && !impl->supports(p, &why)) continue;
      GpuBenchCase c;
      c.op = op;
      c.preset = preset;
      c.impl = name;
      if constexpr (HasPrecision<Params>::value) c.precision = kernels::PrecisionName(p.precision);
      c.work = work;
      c.peak = PeakKind::kFp8;
      c.arena = arena;
      c.launch = [impl, p](gpu::Stream stream) {
        kernels::ExecContext ctx;
        ctx.backend = kernels::Backend::kCuda;
        ctx.stream = stream;
        return impl->run(p, ctx);
      };
      out->push_back(std::move(c));
    }
  }
}

// The prefill indexer followed by top-2048 over its rows, FAST (op "indexer_topk", issue 13's
// fused pair; docs/KERNELS.md "Indexer → top-k candidates"): "cuda_unfused" is the wgmma indexer
// writing the logits, then the top-k the dispatcher picks reading them; "cuda_fused" the same
// indexer writing each row's candidates (no logits), then the select on them ("cuda_fused_hw":
// the appends on the producer warpgroup's helper warps). The work is the indexer's (the FLOPs of
// its valid pairs).
absl::Status AddIndexerTopkCases(const std::string& preset, kernels::indexer_logits::Params p,
                                 const WorkCount& work, const std::shared_ptr<DeviceArena>& arena,
                                 std::vector<GpuBenchCase>* out) {
  namespace il = kernels::indexer_logits;
  namespace tk = kernels::topk;
  constexpr int64_t kTopk = 2048;
  const int64_t m = p.q.dim(0), n = p.k.dim(0);
  p.precision = kernels::Precision::kFast;
  std::string why;
  if (!il::gpu::WgmmaSupports(p, &why)) return absl::OkStatus();  // no Hopper device
  auto indices = arena->Alloc(4 * m * kTopk);
  auto entries = arena->Alloc(8 * m * n);
  auto counts = arena->Alloc(4 * m);
  auto floors = arena->Alloc(4 * m);
  for (const auto* r : {&indices, &entries, &counts, &floors}) {
    if (!r->ok()) return r->status();
  }
  tk::Params tp;
  tp.logits = p.logits;
  tp.ks = p.ks;
  tp.ke = p.ke;
  tp.k = kTopk;
  tp.indices = MakeTensor(*indices, DType::kI32, {m, kTopk});
  ATTND_RETURN_IF_ERROR(tk::Validate(tp));
  const kernels::Impl<tk::Params>* topk = nullptr;
  {
    kernels::ExecContext query;
    query.backend = kernels::Backend::kCuda;
    topk = kernels::SelectImpl(tk::Implementations(), tp, query, &why);
  }
  if (topk == nullptr) return absl::UnimplementedError(absl::StrCat("indexer_topk: ", why));
  const absl::StatusOr<Workspace> topk_ws = WorkspaceFor(*topk, tp, *arena);
  if (!topk_ws.ok()) return topk_ws.status();
  const kernels::Impl<il::Params>* wgmma = FindImpl(il::Implementations(), "cuda_wgmma");
  if (wgmma == nullptr) return absl::OkStatus();
  GpuBenchCase unfused;
  unfused.op = "indexer_topk";
  unfused.preset = preset + "_k2048";
  unfused.impl = "cuda_unfused";
  unfused.precision = kernels::PrecisionName(p.precision);
  unfused.work = work;
  unfused.peak = PeakKind::kFp8;
  unfused.arena = arena;
  unfused.launch = [wgmma, topk, p, tp, w = *topk_ws](gpu::Stream stream) {
    kernels::ExecContext ctx;
    ctx.backend = kernels::Backend::kCuda;
    ctx.stream = stream;
    ATTND_RETURN_IF_ERROR(wgmma->run(p, ctx));
    return RunImpl(*topk, tp, w, stream);
  };
  out->push_back(unfused);
  il::Params fp = p;
  fp.logits = kernels::Tensor{};
  if (!il::gpu::WgmmaCandidatesSupports(fp, kTopk, &why) ||
      !tk::gpu::SupportsTopkFromCandidates(tp, &why)) {
    return absl::UnimplementedError(absl::StrCat("indexer_topk/cuda_fused: ", why));
  }
  il::gpu::WgmmaCandidates c;
  c.entries = static_cast<uint32_t*>(*entries);
  c.ld = n;
  c.counts = static_cast<uint32_t*>(*counts);
  c.floors = static_cast<uint32_t*>(*floors);
  c.k = kTopk;
  tk::gpu::TopkCandidateRows rows;
  rows.entries = c.entries;
  rows.ld = c.ld;
  rows.counts = c.counts;
  rows.floors = c.floors;
  // One case per form of the pair: the candidate launch options and the select's rows.
  const auto add = [&](std::string impl, const il::gpu::WgmmaCandidates& cand,
                       const tk::gpu::TopkCandidateRows& select) {
    GpuBenchCase fused = unfused;
    fused.impl = std::move(impl);
    fused.launch = [fp, tp, cand, select](gpu::Stream stream) -> absl::Status {
      GPU_RETURN_IF_ERROR(il::gpu::LaunchWgmmaCandidates(fp, cand, stream));
      GPU_RETURN_IF_ERROR(tk::gpu::LaunchTopkFromCandidates(tp, select, stream));
      return absl::OkStatus();
    };
    out->push_back(std::move(fused));
  };
  add("cuda_fused", c, rows);
  // The select's CTA size forced the other way (the default takes 256 threads at k 2048).
  tk::gpu::TopkCandidateRows wide = rows;
  wide.threads = 512;
  add("cuda_fused_t512", c, wide);
  // The appends, histograms and floors on the producer warpgroup's helper warps.
  il::gpu::WgmmaCandidates helped = c;
  helped.helpers = true;
  add("cuda_fused_hw", helped, rows);
  // The floors raised every 2 and every 4 tiles instead of the default 8 (fewer candidates for
  // more consumer time; with helpers, for more helper time).
  for (const uint32_t every : {2u, 4u}) {
    il::gpu::WgmmaCandidates often = c;
    often.floor_every = every;
    add(absl::StrCat("cuda_fused_f", every), often, rows);
    often.helpers = true;
    add(absl::StrCat("cuda_fused_hw_f", every), often, rows);
  }
  return absl::OkStatus();
}

struct PrefillPreset {
  const char* model;
  int64_t heads, m, n;
};

absl::StatusOr<std::vector<GpuBenchCase>> MakePrefillCases(const std::string& filter) {
  namespace il = kernels::indexer_logits;
  static constexpr PrefillPreset kPresets[] = {
      {"deepseek_v32", 64, 4096, 4096},  {"deepseek_v32", 64, 4096, 32768},
      {"deepseek_v32", 64, 2048, 65536}, {"deepseek_v32", 64, 8192, 8192},
      {"glm5", 32, 4096, 4096},          {"glm5", 32, 4096, 32768},
      {"glm5", 32, 2048, 65536},         {"glm5", 32, 8192, 8192},
  };
  std::vector<GpuBenchCase> cases;
  uint64_t seed = 1;
  for (const PrefillPreset& s : kPresets) {
    const std::string preset =
        absl::StrCat(s.model, "_h", s.heads, "_m", s.m, "_n", s.n, "_causal");
    const bool small = s.n <= 4096;
    if (!Wanted(filter, "indexer_logits", preset, GpuImpls()) &&
        !Wanted(filter, "indexer_topk", preset + "_k2048",
                {"cuda_unfused", "cuda_fused", "cuda_fused_t512", "cuda_fused_hw", "cuda_fused_f2",
                 "cuda_fused_f4", "cuda_fused_hw_f2", "cuda_fused_hw_f4"})) {
      continue;
    }
    auto arena = std::make_shared<DeviceArena>();
    std::vector<int32_t> ks(s.m, 0), ke(s.m);
    for (int64_t i = 0; i < s.m; ++i) ke[i] = static_cast<int32_t>(s.n - s.m + i + 1);
    auto q = arena->Random(DType::kFp8E4M3, s.m * s.heads * kDim, 1.0f, seed++);
    auto k = arena->Random(DType::kFp8E4M3, s.n * kDim, 1.0f, seed++);
    auto k_scale = arena->Random(DType::kF32, s.n, 0.05f, seed++);
    auto weights = arena->Random(DType::kF32, s.m * s.heads, 1.0f, seed++);
    auto ks_d = arena->Upload(ks.data(), 4 * s.m);
    auto ke_d = arena->Upload(ke.data(), 4 * s.m);
    auto logits = arena->Alloc(4 * s.m * s.n);
    for (const auto* r : {&q, &k, &k_scale, &weights, &ks_d, &ke_d, &logits}) {
      if (!r->ok()) return r->status();
    }
    il::Params p;
    p.q = MakeTensor(*q, DType::kFp8E4M3, {s.m, s.heads, kDim});
    p.k = MakeTensor(*k, DType::kFp8E4M3, {s.n, kDim});
    p.k_scale = MakeTensor(*k_scale, DType::kF32, {s.n});
    p.weights = MakeTensor(*weights, DType::kF32, {s.m, s.heads});
    p.ks = MakeTensor(*ks_d, DType::kI32, {s.m});
    p.ke = MakeTensor(*ke_d, DType::kI32, {s.m});
    p.logits = MakeTensor(*logits, DType::kF32, {s.m, s.n});
    p.clean_logits = true;
    ATTND_RETURN_IF_ERROR(il::Validate(p));
    // Valid pairs: Σ_i (N − M + i + 1).
    const double pairs = static_cast<double>(s.m) * static_cast<double>(s.n - s.m) +
                         static_cast<double>(s.m) * static_cast<double>(s.m + 1) / 2;
    WorkCount work;
    work.flops = 2.0 * static_cast<double>(s.heads * kDim) * pairs;
    work.bytes = static_cast<double>(s.m * s.heads * kDim) + static_cast<double>(s.n * (kDim + 4)) +
                 4.0 * static_cast<double>(s.m * s.heads) + 8.0 * static_cast<double>(s.m) +
                 4.0 * static_cast<double>(s.m * s.n);
    AddCases("indexer_logits", preset, p, work, small, arena, il::Implementations(), &cases);
    if (s.heads == 64) {
      ATTND_RETURN_IF_ERROR(AddIndexerTopkCases(preset, p, work, arena, &cases));
    }
  }
  return cases;
}

struct PagedPreset {
  int64_t heads, batch, context, next_n;
  // Lengths uniform in [next_n, context] (seeded) instead of all `context`: the work split
  // reads the shapes only, so a ragged batch waits for its longest request (docs/KERNELS.md
  // "A schedule from the lengths" has the decode's form of it). Work counted over them.
  bool ragged = false;
};

absl::StatusOr<std::vector<GpuBenchCase>> MakePagedCases(const std::string& filter) {
  namespace ilp = kernels::indexer_logits_paged;
  // B132 H64 next_n 1: 264 CTAs, exactly two per SM of an H200 (B128 leaves 8 of 264 CTA slots
  // empty), so B132 / B128 tells how much of B128's time is that imbalance.
  static constexpr PagedPreset kPresets[] = {
      {64, 64, 32768, 1},  {64, 128, 32768, 1},      {64, 64, 32768, 2}, {64, 128, 32768, 2},
      {64, 64, 32768, 4},  {64, 128, 32768, 4},      {32, 64, 32768, 1}, {32, 128, 32768, 1},
      {32, 64, 32768, 2},  {32, 128, 32768, 2},      {32, 64, 32768, 4}, {32, 128, 32768, 4},
      {64, 132, 32768, 1}, {64, 128, 32768, 1, true}};
  // A reference to the static list: the cases keep pointers into it until they run.
  const std::vector<kernels::Impl<ilp::Params>>& impls = ilp::Implementations();
  std::vector<GpuBenchCase> cases;
  uint64_t seed = 101;
  std::mt19937_64 rng(7);
  for (const PagedPreset& s : kPresets) {
    const std::string preset =
        absl::StrCat("deepseek_v32_h", s.heads, "_b", s.batch, "_ctx", s.context, "_next", s.next_n,
                     s.ragged ? "_ragged" : "");
    if (!Wanted(filter, "indexer_logits_paged", preset, GpuImpls())) {
      continue;
    }
    const int64_t max_blocks = s.context / kBlockSize, pages = s.batch * max_blocks;
    const int64_t rows = s.batch * s.next_n, block_bytes = kBlockSize * (kDim + 4);
    // Each request gets its own pages in shuffled order (a fragmented cache).
    std::vector<int32_t> table(pages);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<int32_t> contexts(s.batch, static_cast<int32_t>(s.context));
    if (s.ragged) {
      for (int32_t& c : contexts) {
        c = static_cast<int32_t>(s.next_n +
                                 rng() % static_cast<uint64_t>(s.context - s.next_n + 1));
      }
    }
    auto arena = std::make_shared<DeviceArena>();
    auto q = arena->Random(DType::kFp8E4M3, rows * s.heads * kDim, 1.0f, seed++);
    auto cache = arena->Random(DType::kFp8E4M3, pages * block_bytes, 1.0f, seed++);
    auto weights = arena->Random(DType::kF32, rows * s.heads, 1.0f, seed++);
    auto table_d = arena->Upload(table.data(), 4 * pages);
    auto contexts_d = arena->Upload(contexts.data(), 4 * s.batch);
    auto logits = arena->Alloc(4 * rows * s.context);
    for (const auto* r : {&q, &cache, &weights, &table_d, &contexts_d, &logits}) {
      if (!r->ok()) return r->status();
    }
    ilp::Params p;
    p.q = MakeTensor(*q, DType::kFp8E4M3, {s.batch, s.next_n, s.heads, kDim});
    p.kv_cache = MakeTensor(*cache, DType::kU8, {pages, block_bytes});
    p.block_size = kBlockSize;
    p.block_table = MakeTensor(*table_d, DType::kI32, {s.batch, max_blocks});
    p.context_lens = MakeTensor(*contexts_d, DType::kI32, {s.batch});
    p.weights = MakeTensor(*weights, DType::kF32, {rows, s.heads});
    p.logits = MakeTensor(*logits, DType::kF32, {rows, s.context});
    ATTND_RETURN_IF_ERROR(ilp::Validate(p));
    // Row j of a request sees context − next_n + j + 1 positions; keys are read once.
    double pairs = 0, keys = 0;
    for (const int32_t c : contexts) {
      for (int64_t j = 0; j < s.next_n; ++j) pairs += static_cast<double>(c - s.next_n + j + 1);
      keys += c;
    }
    WorkCount work;
    work.flops = 2.0 * static_cast<double>(s.heads * kDim) * pairs;
    work.bytes = static_cast<double>(rows * s.heads * kDim) + keys * static_cast<double>(kDim + 4) +
                 4.0 * pages + 4.0 * s.batch + 4.0 * static_cast<double>(rows * s.heads) +
                 4.0 * static_cast<double>(rows * s.context);
    const bool with_simt = s.batch <= 64 && s.heads == 64 && s.next_n <= 2;
    AddCases("indexer_logits_paged", preset, p, work, with_simt, arena, impls, &cases);
  }
  return cases;
}

}  // namespace
}  // namespace attnd::bench

ATTND_REGISTER_GPU_BENCH(indexer_logits, attnd::bench::MakePrefillCases);
ATTND_REGISTER_GPU_BENCH(indexer_logits_paged, attnd::bench::MakePagedCases);
