// GPU benchmarks of the fused DSA layer (dsa_attention): DeepSeek-V3.2's indexer (H_i 64, D_i
// 128) and sparse MLA (H 128, d_qk 576, top-2048); one prefill preset with GLM-5's shapes
// ("glm_prefill_*": indexer H_i 32, sparse MLA H 64, d_qk 512, K = V).
// - Paged decode form ("decode_*"): B requests of a 32K context, block 64, one block table for
//   both caches (as vLLM and SGLang keep them), each request's blocks drawn from a shuffled pool
//   (a fragmented cache); the MLA cache is the FP8 656-byte rows (or bf16 where the preset says
//   so). FLOPs and logical bytes: dsa::Count on a host copy of context_lens (every token sees its
//   full context − next_n + j + 1 positions). "..._ragged": context lengths uniform in
//   [next_n, 32768] instead.
// - Gathered prefill form ("prefill_*"): T prompt tokens after P = N − T cached ones, causal
//   windows ks = 0, ke = P + t + 1 (issue 13's whole layer: T 4096 over N 32K, bf16 cache).
//   dsa::Count on host copies of ks / ke.
// The whole call runs as served: Validate, the first GPU implementation that supports it, its
// workspace, every step on one stream. Both precisions (FAST, HIGH) with the exact indexer, and
// FAST with the FAST indexer (index_precision, presets ending "_idxfast").
//   attn_gpu_bench --filter=dsa_attention/decode_b128
//   attn_gpu_bench --filter=dsa_attention/prefill_t4096
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gpu/fill.h"
#include "bench/gpu/gpu_bench.h"
#include "kernels/common/status.h"
#include "kernels/common/tensor.h"
#include "kernels/dsa/dsa.h"
#include "kernels/sparse_mla/params.h"

namespace attnd::bench {
namespace {

using kernels::DType;
using kernels::MakeTensor;
namespace dsa = kernels::dsa;
namespace sparse_mla = kernels::sparse_mla;

constexpr int64_t kIndexDim = 128;
constexpr int64_t kBlockSize = 64;
// Fill byte of the indexer cache's f32 scales: 0x3c3c3c3c is 0.0115 (finite, non-zero; random
// bytes could be huge). The FP8 MLA rows' tails: LaunchFp8MlaRowTails.
constexpr int kScaleByte = 0x3c;

struct Preset {
  const char* name;
  int64_t batch, context, next_n, index_heads, heads, d_qk, topk;
  bool fp8_kv;
  // Context lengths uniform in [next_n, context] (seeded) instead of all `context`: the paged
  // indexer's chunks come from the shapes, so the layer may wait for its longest request
  // (docs/BENCHMARKS.md "Session of 2026-12-07, 20:26 UTC").
  bool ragged = false;
};

constexpr Preset kPresets[] = {
    {"decode_b128_ctx32768_next1_hi64_h128_d576_k2048_fp8kv", 128, 32768, 1, 64, 128, 576, 2048,
     true},
    {"decode_b128_ctx32768_next2_hi64_h128_d576_k2048_fp8kv", 128, 32768, 2, 64, 128, 576, 2048,
     true},
    {"decode_b128_ctx32768_next1_hi64_h128_d576_k2048_bf16kv", 128, 32768, 1, 64, 128, 576, 2048,
     false},
    {"decode_b64_ctx32768_next1_hi64_h128_d576_k2048_fp8kv", 64, 32768, 1, 64, 128, 576, 2048,
     true},
    {"decode_b128_ctx32768_next1_hi64_h128_d576_k2048_fp8kv_ragged", 128, 32768, 1, 64, 128, 576,
     2048, true, true},
};

struct PrefillPreset {
  const char* name;
  int64_t tokens, context, index_heads, heads, d_qk, topk;
};

constexpr PrefillPreset kPrefillPresets[] = {
    {"prefill_t4096_s32768_hi64_h128_d576_k2048_bf16kv", 4096, 32768, 64, 128, 576, 2048},
    {"glm_prefill_t4096_s32768_hi32_h64_d512_k2048_bf16kv", 4096, 32768, 32, 64, 512, 2048},
};

// The name of a preset's variant with the FAST indexer is the preset's with this appended.
constexpr char kIdxFastSuffix[] = "_idxfast";

// Whether the filter may name one of the preset's cases: either preset name, any of the op's
// implementations, either precision.
bool Wanted(const char* name, const std::string& filter) {
  for (const char* suffix : {"", kIdxFastSuffix}) {
    for (const kernels::Impl<dsa::Params>& impl : dsa::Implementations()) {
      for (const kernels::Precision precision : kBenchPrecisions) {
        if (MayMatch(absl::StrCat("dsa_attention/", name, suffix, "/", impl.name, "/",
                                  kernels::PrecisionName(precision)),
                     filter)) {
          return true;
        }
      }
    }
  }
  return false;
}

// The cases of one preset's Params: both output precisions with the exact indexer (the default),
// and FAST with the FAST indexer too (index_precision; the preset named "..._idxfast").
absl::Status AddVariants(const char* name, dsa::Params p, const kernels::WorkCount& work,
                         const std::shared_ptr<DeviceArena>& arena,
                         std::vector<GpuBenchCase>* cases) {
  struct Variant {
    kernels::Precision precision, index_precision;
  };
  std::vector<Variant> variants;
  for (const kernels::Precision precision : kBenchPrecisions) {
    variants.push_back({precision, kernels::Precision::kHigh});
  }
  variants.push_back({kernels::Precision::kFast, kernels::Precision::kFast});
  for (const Variant& v : variants) {
    const kernels::Precision precision = v.precision;
    p.precision = precision;
    p.index_precision = v.index_precision;
    kernels::ExecContext query;
    query.backend = kernels::kGpuBackend;
    std::string why;
    const kernels::Impl<dsa::Params>* impl =
        kernels::SelectImpl(dsa::Implementations(), p, query, &why);
    if (impl == nullptr) {
      return absl::UnimplementedError(absl::StrCat("dsa_attention/", name, ": ", why));
    }
    const absl::StatusOr<Workspace> ws = WorkspaceFor(*impl, p, *arena);
    if (!ws.ok()) return ws.status();
    GpuBenchCase c;
    c.op = "dsa_attention";
    c.preset = v.index_precision == kernels::Precision::kFast ? absl::StrCat(name, kIdxFastSuffix)
                                                              : std::string(name);
    c.impl = impl->name;
    c.precision = kernels::PrecisionName(precision);
    c.work = work;
    c.peak = PeakKind::kBf16;
    c.arena = arena;
    c.launch = [impl, p, w = *ws](gpu::Stream stream) { return RunImpl(*impl, p, w, stream); };
    cases->push_back(c);
    // The candidate form of the indexer → top-k pair where it takes the call (FAST indexer,
    // gathered form; docs/KERNELS.md "Indexer → top-k candidates"), beside the default.
    const kernels::Impl<dsa::Params>* fused =
        FindImpl(dsa::Implementations(), kernels::GpuImplName("fused_topk"));
    if (fused != nullptr && fused != impl && fused->supports(p, &why)) {
      const absl::StatusOr<Workspace> fws = WorkspaceFor(*fused, p, *arena);
      if (!fws.ok()) return fws.status();
      c.impl = fused->name;
      c.launch = [fused, p, w = *fws](gpu::Stream stream) { return RunImpl(*fused, p, w, stream); };
      cases->push_back(std::move(c));
    }
  }
  return absl::OkStatus();
}

absl::Status AddPrefillCases(const PrefillPreset& s, uint64_t* seed,
                             std::vector<GpuBenchCase>* cases) {
  const int64_t t = s.tokens, n = s.context, cached = s.context - s.tokens;
  std::vector<int32_t> ks(static_cast<size_t>(t), 0), ke(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) ke[static_cast<size_t>(i)] = static_cast<int32_t>(cached + i + 1);
  auto arena = std::make_shared<DeviceArena>();
  auto index_q = arena->Random(DType::kFp8E4M3, t * s.index_heads * kIndexDim, 1.0f, (*seed)++);
  auto weights = arena->Random(DType::kF32, t * s.index_heads, 1.0f, (*seed)++);
  auto index_k = arena->Random(DType::kFp8E4M3, n * kIndexDim, 1.0f, (*seed)++);
  auto index_k_scale = arena->Random(DType::kF32, n, 1.0f, (*seed)++);
  auto ks_d = arena->Upload(ks.data(), 4 * t);
  auto ke_d = arena->Upload(ke.data(), 4 * t);
  auto q = arena->Random(DType::kBF16, t * s.heads * s.d_qk, 1.0f, (*seed)++);
  auto kv = arena->Random(DType::kBF16, n * s.d_qk, 1.0f, (*seed)++);
  auto out = arena->Alloc(t * s.heads * sparse_mla::kDimV * 2);
  auto lse = arena->Alloc(t * s.heads * 4);
  for (const auto* r :
       {&index_q, &weights, &index_k, &index_k_scale, &ks_d, &ke_d, &q, &kv, &out, &lse}) {
    if (!r->ok()) return r->status();
  }
  GPU_RETURN_IF_ERROR(cudaDeviceSynchronize());
  dsa::Params p;
  p.index_q = MakeTensor(*index_q, DType::kFp8E4M3, {t, s.index_heads, kIndexDim});
  p.index_k = MakeTensor(*index_k, DType::kFp8E4M3, {n, kIndexDim});
  p.index_k_scale = MakeTensor(*index_k_scale, DType::kF32, {n});
  p.index_weights = MakeTensor(*weights, DType::kF32, {t, s.index_heads});
  p.ks = MakeTensor(*ks_d, DType::kI32, {t});
  p.ke = MakeTensor(*ke_d, DType::kI32, {t});
  p.topk = s.topk;
  p.q = MakeTensor(*q, DType::kBF16, {t, s.heads, s.d_qk});
  p.kv = MakeTensor(*kv, DType::kBF16, {n, s.d_qk});
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(s.d_qk));
  p.out = MakeTensor(*out, DType::kBF16, {t, s.heads, sparse_mla::kDimV});
  p.lse = MakeTensor(*lse, DType::kF32, {t, s.heads});
  ATTND_RETURN_IF_ERROR(dsa::Validate(p));
  dsa::Params host = p;  // Count reads ks / ke: the host copies
  host.ks = MakeTensor(ks.data(), DType::kI32, {t});
  host.ke = MakeTensor(ke.data(), DType::kI32, {t});
  return AddVariants(s.name, p, dsa::Count(host), arena, cases);
}

absl::StatusOr<std::vector<GpuBenchCase>> MakeCases(const std::string& filter) {
  std::vector<GpuBenchCase> cases;
  uint64_t seed = 301;
  std::mt19937_64 rng(11);
  for (const PrefillPreset& s : kPrefillPresets) {
    if (Wanted(s.name, filter)) ATTND_RETURN_IF_ERROR(AddPrefillCases(s, &seed, &cases));
  }
  for (const Preset& s : kPresets) {
    if (!Wanted(s.name, filter)) continue;
    const int64_t max_blocks = s.context / kBlockSize, pages = s.batch * max_blocks;
    const int64_t t = s.batch * s.next_n, index_block_bytes = kBlockSize * (kIndexDim + 4);
    const int64_t kv_rows = pages * kBlockSize;
    std::vector<int32_t> table(static_cast<size_t>(pages));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<int32_t> contexts(static_cast<size_t>(s.batch), static_cast<int32_t>(s.context));
    if (s.ragged) {
      for (int32_t& c : contexts) {
        c = static_cast<int32_t>(s.next_n +
                                 rng() % static_cast<uint64_t>(s.context - s.next_n + 1));
      }
    }

    auto arena = std::make_shared<DeviceArena>();
    auto index_q = arena->Random(DType::kFp8E4M3, t * s.index_heads * kIndexDim, 1.0f, seed++);
    auto weights = arena->Random(DType::kF32, t * s.index_heads, 1.0f, seed++);
    auto index_cache = arena->Random(DType::kFp8E4M3, pages * index_block_bytes, 1.0f, seed++);
    auto table_d = arena->Upload(table.data(), 4 * pages);
    auto contexts_d = arena->Upload(contexts.data(), 4 * s.batch);
    auto q = arena->Random(DType::kBF16, t * s.heads * s.d_qk, 1.0f, seed++);
    auto kv = s.fp8_kv
                  ? arena->Random(DType::kFp8E4M3, kv_rows * sparse_mla::kFp8RowBytes, 1.0f, seed++)
                  : arena->Random(DType::kBF16, kv_rows * s.d_qk, 1.0f, seed++);
    auto out = arena->Alloc(t * s.heads * sparse_mla::kDimV * 2);
    auto lse = arena->Alloc(t * s.heads * 4);
    for (const auto* r :
         {&index_q, &weights, &index_cache, &table_d, &contexts_d, &q, &kv, &out, &lse}) {
      if (!r->ok()) return r->status();
    }
    // The scales after each index block's keys; the FP8 rows' scales and rope.
    GPU_RETURN_IF_ERROR(cudaMemset2D(static_cast<char*>(*index_cache) + kBlockSize * kIndexDim,
                                     static_cast<size_t>(index_block_bytes), kScaleByte,
                                     static_cast<size_t>(kBlockSize * 4),
                                     static_cast<size_t>(pages)));
    if (s.fp8_kv) {
      GPU_RETURN_IF_ERROR(LaunchFp8MlaRowTails(*kv, kv_rows, /*f32_scales=*/false, nullptr));
    }
    GPU_RETURN_IF_ERROR(cudaDeviceSynchronize());

    dsa::Params p;
    p.index_q =
        MakeTensor(*index_q, DType::kFp8E4M3, {s.batch, s.next_n, s.index_heads, kIndexDim});
    p.index_weights = MakeTensor(*weights, DType::kF32, {t, s.index_heads});
    p.index_cache = MakeTensor(*index_cache, DType::kU8, {pages, index_block_bytes});
    p.index_block_size = kBlockSize;
    p.index_block_table = MakeTensor(*table_d, DType::kI32, {s.batch, max_blocks});
    p.context_lens = MakeTensor(*contexts_d, DType::kI32, {s.batch});
    p.topk = s.topk;
    p.q = MakeTensor(*q, DType::kBF16, {t, s.heads, s.d_qk});
    p.kv = s.fp8_kv ? MakeTensor(*kv, DType::kU8, {kv_rows, sparse_mla::kFp8RowBytes})
                    : MakeTensor(*kv, DType::kBF16, {kv_rows, s.d_qk});
    p.sm_scale = 1.0f / std::sqrt(static_cast<float>(s.d_qk));
    p.out = MakeTensor(*out, DType::kBF16, {t, s.heads, sparse_mla::kDimV});
    p.lse = MakeTensor(*lse, DType::kF32, {t, s.heads});
    ATTND_RETURN_IF_ERROR(dsa::Validate(p));
    dsa::Params host = p;  // Count reads context_lens: the host copy
    host.context_lens = MakeTensor(contexts.data(), DType::kI32, {s.batch});
    const kernels::WorkCount work = dsa::Count(host);

    ATTND_RETURN_IF_ERROR(AddVariants(s.name, p, work, arena, &cases));
  }
  return cases;
}

}  // namespace
}  // namespace attnd::bench

ATTND_REGISTER_GPU_BENCH(dsa_attention, attnd::bench::MakeCases);
