// Dense MLA prefill on the GPU (attn_gpu_bench): one causal sequence of 4K or 8K tokens, 128
// heads, d_qk 192 / d_v 128, a kv head per query head (the FA3-class target). Work counted on
// the host from the shape: FLOPs 2·H·(d_qk + d_v)·T(T+1)/2 valid pairs; bytes = q + k + v +
// out + lse + both cu_seqlens. Every case in both precisions (FAST, HIGH).
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench/gpu/gpu_bench.h"
#include "kernels/mla_prefill/gpu/launch.h"
#include "kernels/mla_prefill/mla_prefill.h"

namespace attnd::bench {
namespace {

using kernels::DType;
namespace mla_prefill = kernels::mla_prefill;

constexpr int64_t kHeads = 128, kDqk = 192, kDv = 128;

// `cuda_wgmma` with its items' heads interleaved in groups of a forced size (impl "sweep_hg<N>";
// 0: WgmmaHeadGroup's size, 1: heads in order, what `cuda_wgmma` runs; docs/KERNELS.md "MLA
// prefill on Hopper"), so one run compares the orders. Filter with the precision
// (".../sweep_hg1/fast"): "sweep_hg1" alone also matches sweep_hg16.
kernels::Impl<mla_prefill::Params> HeadGroupImpl(const kernels::Impl<mla_prefill::Params>& wgmma,
                                                 int32_t head_group) {
  return kernels::Impl<mla_prefill::Params>(
      absl::StrCat("sweep_hg", head_group), kernels::Backend::kCuda, wgmma.supports,
      [head_group](const mla_prefill::Params& p, const kernels::ExecContext& ctx) -> absl::Status {
        GPU_RETURN_IF_ERROR(mla_prefill::gpu::LaunchMlaPrefillWgmmaWith(
            p, head_group, ctx.workspace, static_cast<gpu::Stream>(ctx.stream)));
        return absl::OkStatus();
      },
      wgmma.workspace);
}

absl::StatusOr<std::vector<GpuBenchCase>> MakeCases(const std::string& filter) {
  std::vector<GpuBenchCase> cases;
  uint64_t seed = 100;
  for (const int64_t tokens : {4096, 8192}) {
    const std::string preset = absl::StrCat("prefill_causal_t", tokens, "_h", kHeads, "_d192_v128");
    std::vector<std::string> impls = {"cuda_wgmma", "cuda_mma"};
    if (tokens == 4096) impls.push_back("cuda_simt");  // the portable path, at the short length
    // sweep_hg0: WgmmaHeadGroup's size (the candidate default); sweep_hg1: heads in order.
    constexpr int32_t kHeadGroups[] = {0, 1, 2, 4, 8, 16};
    for (const int32_t hg : kHeadGroups) impls.push_back(absl::StrCat("sweep_hg", hg));
    bool wanted = false;
    for (const std::string& impl : impls) {
      wanted |= MayMatch(absl::StrCat("mla_prefill/", preset, "/", impl), filter);
    }
    if (!wanted) continue;
    auto arena = std::make_shared<DeviceArena>();
    auto q = arena->Random(DType::kBF16, tokens * kHeads * kDqk, 1.0f, ++seed);
    auto k = arena->Random(DType::kBF16, tokens * kHeads * kDqk, 1.0f, ++seed);
    auto v = arena->Random(DType::kBF16, tokens * kHeads * kDv, 1.0f, ++seed);
    const int32_t cu_host[2] = {0, static_cast<int32_t>(tokens)};
    auto cu = arena->Upload(cu_host, sizeof cu_host);
    auto out = arena->Alloc(tokens * kHeads * kDv * 2);
    auto lse = arena->Alloc(tokens * kHeads * 4);
    if (!q.ok() || !k.ok() || !v.ok() || !cu.ok() || !out.ok() || !lse.ok()) {
      return absl::ResourceExhaustedError(preset);
    }
    mla_prefill::Params p;
    p.q = kernels::MakeTensor(*q, DType::kBF16, {tokens, kHeads, kDqk});
    p.k = kernels::MakeTensor(*k, DType::kBF16, {tokens, kHeads, kDqk});
    p.v = kernels::MakeTensor(*v, DType::kBF16, {tokens, kHeads, kDv});
    p.cu_seqlens_q = kernels::MakeTensor(*cu, DType::kI32, {2});
    p.cu_seqlens_k = kernels::MakeTensor(*cu, DType::kI32, {2});
    p.out = kernels::MakeTensor(*out, DType::kBF16, {tokens, kHeads, kDv});
    p.lse = kernels::MakeTensor(*lse, DType::kF32, {tokens, kHeads});
    p.sm_scale = 1.0f / 13.856406f;  // 1 / sqrt(192)
    p.causal = true;
    kernels::WorkCount work;
    const double pairs = 0.5 * static_cast<double>(tokens) * (tokens + 1);
    work.flops = 2.0 * kHeads * (kDqk + kDv) * pairs;
    work.bytes = 2.0 * tokens * kHeads * (2 * kDqk + kDv) + 2.0 * tokens * kHeads * kDv +
                 4.0 * tokens * kHeads + 8.0 * 2;
    for (const std::string& name : impls) {
      const auto* impl = FindImpl(mla_prefill::Implementations(), name);
      if (absl::StartsWith(name, "sweep_hg")) {
        const auto* wgmma = FindImpl(mla_prefill::Implementations(), "cuda_wgmma");
        if (wgmma == nullptr ||
            !MayMatch(absl::StrCat("mla_prefill/", preset, "/", name), filter)) {
          continue;
        }
        static std::deque<kernels::Impl<mla_prefill::Params>> swept;  // lives with the cases
        swept.push_back(HeadGroupImpl(*wgmma, std::stoi(name.substr(8))));
        impl = &swept.back();
      }
      std::string why;
      if (impl == nullptr || !impl->supports(p, &why)) {
        return absl::FailedPreconditionError(absl::StrCat(preset, " ", name, ": ", why));
      }
      const absl::StatusOr<Workspace> ws = WorkspaceFor(*impl, p, *arena);
      if (!ws.ok()) return ws.status();
      for (const kernels::Precision precision : kBenchPrecisions) {
        GpuBenchCase c;
        c.op = "mla_prefill";
        c.preset = preset;
        c.impl = name;
        c.precision = kernels::PrecisionName(precision);
        c.work = work;
        c.peak = PeakKind::kBf16;
        c.arena = arena;
        mla_prefill::Params pp = p;
        pp.precision = precision;
        c.launch = [impl, pp, w = *ws](gpu::Stream stream) {
          return RunImpl(*impl, pp, w, stream);
        };
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

ATTND_REGISTER_GPU_BENCH(mla_prefill, MakeCases);

}  // namespace
}  // namespace attnd::bench
