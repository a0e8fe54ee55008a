// GPU benchmarks of sparse MLA (KERNELS.md §1d anchors): DeepSeek prefill T4096 S32K H128 d576
// K2048 (FlashMLA 4185 µs, 558 TFLOP/s), GLM prefill T2048 S32K H64 and H16 d512 K2048 (FlashMLA
// H64 1025 µs; H16 padded to 64 costs the same), and decode B64 / B128 x next_n 1 at H128 d576
// K2048 over a pool of B x 32K rows (bf16 KV). Indices are uniform in [0, S); FLOPs count every
// slot (FlashMLA's count: 2·T·H·K·(d_qk + 512)), bytes per DESIGN.md §8 with E = T·K. Counts
// come from the shapes (CountSlots), never from device data.
#include "kernels/sparse_mla/sparse_mla.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gpu/gpu_bench.h"

namespace attnd::bench {
namespace {

using kernels::DType;
namespace sparse_mla = kernels::sparse_mla;

struct Preset {
  const char* name;
  int64_t t, s, h, d_qk, k;
  bool simt;  // also time the portable SIMT kernel (slow on the big prefill shapes)
};

constexpr Preset kPresets[] = {
    {"deepseek_prefill_t4096_s32768_h128_d576_k2048", 4096, 32768, 128, 576, 2048, false},
    {"glm_prefill_t2048_s32768_h64_d512_k2048", 2048, 32768, 64, 512, 2048, false},
    {"glm_prefill_t2048_s32768_h16_d512_k2048", 2048, 32768, 16, 512, 2048, true},
    {"deepseek_decode_b64_s2097152_h128_d576_k2048", 64, 64 * 32768, 128, 576, 2048, true},
    {"deepseek_decode_b128_s4194304_h128_d576_k2048", 128, 128 * 32768, 128, 576, 2048, true},
};

absl::StatusOr<GpuBenchCase> MakeCase(const Preset& preset,
                                      const kernels::Impl<sparse_mla::Params>& impl,
                                      uint64_t seed) {
  auto arena = std::make_shared<DeviceArena>();
  const int64_t t = preset.t, s = preset.s, h = preset.h, d = preset.d_qk, k = preset.k;
  sparse_mla::Params p;
  auto q = arena->Random(DType::kBF16, t * h * d, 1.0f, seed);
  if (!q.ok()) return q.status();
  auto kv = arena->Random(DType::kBF16, s * d, 1.0f, seed + 1);
  if (!kv.ok()) return kv.status();
  auto indices = arena->RandomInt(t * k, 0, static_cast<int32_t>(s - 1), seed + 2);
  if (!indices.ok()) return indices.status();
  auto out = arena->Alloc(t * h * sparse_mla::kDimV * 2);
  if (!out.ok()) return out.status();
  auto lse = arena->Alloc(t * h * 4);
  if (!lse.ok()) return lse.status();
  p.q = kernels::MakeTensor(*q, DType::kBF16, {t, h, d});
  p.kv = kernels::MakeTensor(*kv, DType::kBF16, {s, d});
  p.indices = kernels::MakeTensor(*indices, DType::kI32, {t, k});
  p.out = kernels::MakeTensor(*out, DType::kBF16, {t, h, sparse_mla::kDimV});
  p.lse = kernels::MakeTensor(*lse, DType::kF32, {t, h});
  p.sm_scale = 1.0f / 24.0f;  // 1/sqrt(576)
  if (absl::Status st = sparse_mla::Validate(p); !st.ok()) return st;
  std::string why;
  if (impl.supports && !impl.supports(p, &why)) {
    return absl::UnimplementedError(absl::StrCat(impl.name, ": ", why));
  }
  int64_t workspace_bytes = impl.workspace ? impl.workspace(p) : 0;
  void* workspace = nullptr;
  if (workspace_bytes > 0) {
    auto ws = arena->Alloc(workspace_bytes);
    if (!ws.ok()) return ws.status();
    workspace = *ws;
  }

  GpuBenchCase c;
  c.op = "sparse_mla";
  c.preset = preset.name;
  c.impl = impl.name;
  c.peak = PeakKind::kBf16;
  c.work = sparse_mla::CountSlots(p);  // shapes only: every slot counts
  c.arena = arena;
  const kernels::Impl<sparse_mla::Params>* run = &impl;
  c.launch = [p, run, workspace, workspace_bytes](gpu::Stream stream) {
    kernels::ExecContext ctx;
    ctx.backend = run->backend;
    ctx.stream = stream;
    ctx.workspace = workspace;
    ctx.workspace_bytes = workspace_bytes;
    return run->run(p, ctx);
  };
  return c;
}

absl::StatusOr<std::vector<GpuBenchCase>> MakeSparseMlaCases(const std::string& filter) {
  std::vector<GpuBenchCase> cases;
  uint64_t seed = 100;
  for (const auto& impl : sparse_mla::Implementations()) {
    if (impl.backend != kernels::Backend::kCuda) continue;
    for (const Preset& preset : kPresets) {
      seed += 3;
      if (impl.name == "cuda_simt" && !preset.simt) continue;
      const std::string name = absl::StrCat("sparse_mla/", preset.name, "/", impl.name);
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

ATTND_REGISTER_GPU_BENCH(sparse_mla, attnd::bench::MakeSparseMlaCases);
