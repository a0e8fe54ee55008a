// GPU benchmarks of top-k (k = 2048, N(0, 1) logits): prefill 4096 rows with causal windows over
// a 32K context and decode 128 × 32K (their budgets: docs/BENCHMARKS.md "Anchors and ceilings"),
// plain and mapped to KV slots (page 64), and 8 rows of 128K; prefill over a 64K context and one
// row of 128K and of 256K (the long-row targets in docs/BENCHMARKS.md). Byte counts come from the
// host-side shapes and windows. Besides the registered implementations, "sweep_stream_*" forces the
// streaming kernel's launch choices (threads, cluster size, speculation) and "sweep_filter_*" the
// threshold-filter kernel's (threads, cluster size, L2 prefetch).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench/gpu/gpu_bench.h"
#include "kernels/topk/gpu/filter.h"
#include "kernels/topk/gpu/stream.h"
#include "kernels/topk/topk.h"

namespace attnd::bench {
namespace {

using kernels::DType;
namespace topk = kernels::topk;

struct Preset {
  const char* name;
  int64_t m, n, k;
  bool causal;   // ks = 0, ke = n - m + row + 1 (the last m positions of an n context)
  int64_t page;  // > 0: map to KV slots through a [m, n / page] block table
};

constexpr Preset kPresets[] = {
    {"prefill_m4096_n32768_causal_k2048", 4096, 32768, 2048, true, 0},
    {"prefill_m4096_n65536_causal_k2048", 4096, 65536, 2048, true, 0},
    {"decode_b128_n32768_k2048", 128, 32768, 2048, false, 0},
    {"decode_b128_n32768_k2048_slots_p64", 128, 32768, 2048, false, 64},
    {"long_m8_n131072_k2048", 8, 131072, 2048, false, 0},
    {"single_m1_n131072_k2048", 1, 131072, 2048, false, 0},
    {"single_m1_n262144_k2048", 1, 262144, 2048, false, 0},
};

// Forced launch choices of the streaming kernel (impl "sweep_stream_*"; the registered
// implementations are "cuda_*"), so one run compares them on every preset.
struct Variant {
  const char* name;
  topk::gpu::StreamConfig config;
};

const std::vector<kernels::Impl<topk::Params>>& SweepImpls() {
  static const auto* impls = [] {
    auto* v = new std::vector<kernels::Impl<topk::Params>>();
    const Variant variants[] = {
        {"t512", {512, 0, true}}, {"nospec", {256, 0, false}}, {"c1", {256, 1, true}},
        {"c2", {256, 2, true}},   {"c4", {256, 4, true}},      {"c8", {256, 8, true}},
    };
    for (const Variant& var : variants) {
      const topk::gpu::StreamConfig config = var.config;
      v->emplace_back(
          absl::StrCat("sweep_stream_", var.name), kernels::Backend::kCuda, nullptr,
          [config](const topk::Params& p, const kernels::ExecContext& ctx) -> absl::Status {
            GPU_RETURN_IF_ERROR(
                topk::gpu::LaunchTopkStreamWith(p, config, static_cast<gpu::Stream>(ctx.stream)));
            return absl::OkStatus();
          });
    }
    struct FilterVariant {
      const char* name;
      topk::gpu::FilterConfig config;
    };
    const FilterVariant filter_variants[] = {
        {"t256", {256, 0, true, false}},
        {"t256_coarse", {256, 0, true, false, false}},
        {"t512", {512, 0, true, false}},
        {"t1024", {1024, 0, true, false}},
        {"prefetch", {0, 0, true, true}},
        {"noprefetch", {0, 0, true, false}},
        {"c1", {1024, 1, true, false}},
        {"c2", {1024, 2, true, false}},
        {"c4", {1024, 4, true, false}},
        {"c8", {1024, 8, true, false}},
        {"sigma3", {0, 0, true, false, true, 3.0f}},
        {"sigma4", {0, 0, true, false, true, 4.0f}},
        {"sigma5", {0, 0, true, false, true, 5.0f}},
    };
    for (const FilterVariant& var : filter_variants) {
      const topk::gpu::FilterConfig config = var.config;
      v->emplace_back(
          absl::StrCat("sweep_filter_", var.name), kernels::Backend::kCuda, nullptr,
          [config](const topk::Params& p, const kernels::ExecContext& ctx) -> absl::Status {
            GPU_RETURN_IF_ERROR(
                topk::gpu::LaunchTopkFilterWith(p, config, static_cast<gpu::Stream>(ctx.stream)));
            return absl::OkStatus();
          });
    }
    return v;
  }();
  return *impls;
}

absl::StatusOr<GpuBenchCase> MakeCase(const Preset& preset, const kernels::Impl<topk::Params>& impl,
                                      uint64_t seed) {
  auto arena = std::make_shared<DeviceArena>();
  const int64_t m = preset.m, n = preset.n, k = preset.k;
  topk::Params p;
  auto logits = arena->Random(DType::kF32, m * n, 1.0f, seed);
  if (!logits.ok()) return logits.status();
  p.logits = kernels::MakeTensor(*logits, DType::kF32, {m, n});
  p.k = k;
  double valid = 0;
  std::vector<int32_t> ks(static_cast<size_t>(m), 0), ke(static_cast<size_t>(m));
  for (int64_t r = 0; r < m; ++r) {
    ke[static_cast<size_t>(r)] = static_cast<int32_t>(preset.causal ? n - m + r + 1 : n);
    valid += ke[static_cast<size_t>(r)];
  }
  auto ke_dev = arena->Upload(ke.data(), 4 * m);
  if (!ke_dev.ok()) return ke_dev.status();
  double window_bytes = 4.0 * static_cast<double>(m);
  if (preset.causal) {
    auto ks_dev = arena->Upload(ks.data(), 4 * m);
    if (!ks_dev.ok()) return ks_dev.status();
    p.ks = kernels::MakeTensor(*ks_dev, DType::kI32, {m});
    p.ke = kernels::MakeTensor(*ke_dev, DType::kI32, {m});
    window_bytes *= 2;
  } else {
    p.lengths = kernels::MakeTensor(*ke_dev, DType::kI32, {m});
  }
  auto indices = arena->Alloc(4 * m * k);
  if (!indices.ok()) return indices.status();
  p.indices = kernels::MakeTensor(*indices, DType::kI32, {m, k});
  double table_bytes = 0;
  if (preset.page > 0) {
    const int64_t blocks = (n + preset.page - 1) / preset.page;
    std::vector<int32_t> table(static_cast<size_t>(m * blocks));
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i % (1 << 20));
    auto table_dev = arena->Upload(table.data(), 4 * m * blocks);
    if (!table_dev.ok()) return table_dev.status();
    p.block_table = kernels::MakeTensor(*table_dev, DType::kI32, {m, blocks});
    p.page_size = preset.page;
    table_bytes = 4.0 * static_cast<double>(m * blocks);  // full windows span every page
  }
  if (absl::Status s = topk::Validate(p); !s.ok()) return s;

  GpuBenchCase c;
  c.op = "topk";
  c.preset = preset.name;
  c.impl = impl.name;
  c.peak = PeakKind::kMemory;
  c.work.bytes = 4.0 * valid + window_bytes + 4.0 * static_cast<double>(m * k) + table_bytes;
  c.arena = arena;
  const kernels::Impl<topk::Params>* run = &impl;
  c.launch = [p, run](gpu::Stream stream) {
    kernels::ExecContext ctx;
    ctx.backend = run->backend;
    ctx.stream = stream;
    return run->run(p, ctx);
  };
  return c;
}

absl::StatusOr<std::vector<GpuBenchCase>> MakeTopkCases(const std::string& filter) {
  std::vector<GpuBenchCase> cases;
  std::vector<const kernels::Impl<topk::Params>*> impls;
  for (const auto& impl : topk::Implementations()) impls.push_back(&impl);
  for (const auto& impl : SweepImpls()) impls.push_back(&impl);
  for (const kernels::Impl<topk::Params>* impl_ptr : impls) {
    const kernels::Impl<topk::Params>& impl = *impl_ptr;
    if (impl.backend != kernels::Backend::kCuda) continue;
    for (const Preset& preset : kPresets) {
      // One seed per preset, so every implementation and launch choice reads the same logits:
      // the filter's time depends on the data (4096 x 32768 causal, H100: 272.7 µs on one seed,
      // 287-290 on others, docs/BENCHMARKS.md "Top-k: lookahead"). The first implementation's
      // seeds are those of the earlier per-case numbering.
      const uint64_t seed = 2 + static_cast<uint64_t>(&preset - kPresets);
      // Forced clusters only where rows are few (elsewhere the default is one CTA per row).
      if ((absl::StartsWith(impl.name, "sweep_stream_c") ||
           absl::StartsWith(impl.name, "sweep_filter_c")) &&
          preset.m > 256) {
        continue;
      }
      const std::string name = absl::StrCat("topk/", preset.name, "/", impl.name);
      if (!filter.empty() && name.find(filter) == std::string::npos) continue;
      auto c = MakeCase(preset, impl, seed);
      if (!c.ok()) return c.status();
      cases.push_back(std::move(*c));
    }
  }
  return cases;
}

}  // namespace
}  // namespace attnd::bench

ATTND_REGISTER_GPU_BENCH(topk, attnd::bench::MakeTopkCases);
