// GPU benchmarks of sparse MLA, the shapes of docs/BENCHMARKS.md "Anchors and ceilings": DeepSeek
// prefill T4096 S32K H128 d576 K2048, GLM prefill T2048 S32K H64 and H16 d512 K2048, and decode
// B 1 / 32 / 64 / 128 x next_n 1 and 2 (T = B·next_n) at H128 d576 K2048 over a pool of B x 32K
// rows, with a bf16 KV cache and with the FP8 cache (656-byte rows; scales 2^-7, one preset with
// f32 scales that are not bf16 values). Indices are uniform in [0, S); FLOPs count every slot
// (FlashMLA's count: 2·T·H·K·(d_qk + 512)), logical bytes as sparse_mla::Count with E = T·K
// (2·d_qk or 656 bytes per row). Counts come from the shapes (CountSlots), never from device
// data. Presets share one KV pool per (S, format, scale kind). Each preset and implementation
// runs in both precisions (FAST, HIGH: the JSON line's "precision").
// The split-K sweep (op sparse_mla_splits, below) runs only when --filter names it.
#include "kernels/sparse_mla/sparse_mla.h"

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gpu/fill.h"
#include "bench/gpu/gpu_bench.h"
#include "kernels/sparse_mla/gpu/launch.h"

namespace attnd::bench {
namespace {

using kernels::DType;
namespace sparse_mla = kernels::sparse_mla;

struct Preset {
  const char* name;
  int64_t t, s, h, d_qk, k;
  bool simt;         // also time the portable SIMT kernel (slow on the big prefill shapes)
  bool fp8 = false;  // the FP8 KV cache (u8 [S, 656]) instead of bf16
  // Params::batch_invariant (docs/BENCHMARKS.md "Batch invariance"): "<shape>_invariant"
  // beside the same shape without it, to measure the option's cost.
  bool batch_invariant = false;
  // FP8 scales: powers of two (false; FlashMLA's quantiser rounds its scales up to one, and
  // they take the Hopper kernel's integer decode) or an f32 that is not a bf16
  // ("<shape>_f32scales": the general conversion path).
  bool f32_scales = false;
};

constexpr Preset kPresets[] = {
    {"deepseek_prefill_t4096_s32768_h128_d576_k2048", 4096, 32768, 128, 576, 2048, false},
    {"glm_prefill_t2048_s32768_h64_d512_k2048", 2048, 32768, 64, 512, 2048, false},
    {"glm_prefill_t2048_s32768_h16_d512_k2048", 2048, 32768, 16, 512, 2048, true},
    {"glm_prefill_t2048_s32768_h8_d512_k2048", 2048, 32768, 8, 512, 2048, false},
    {"glm_prefill_t2048_s32768_h32_d512_k2048", 2048, 32768, 32, 512, 2048, false},
    // Low heads at decode (GLM-5's 64 query heads over 4 GPUs): the union kernel has nothing to
    // share here, so cuda_mma_auto runs its alternative.
    {"glm_decode_b128_s4194304_h16_d512_k2048", 128, 128 * 32768, 16, 512, 2048, false},
    {"deepseek_decode_b64_s2097152_h128_d576_k2048", 64, 64 * 32768, 128, 576, 2048, true},
    {"deepseek_decode_b128_s4194304_h128_d576_k2048", 128, 128 * 32768, 128, 576, 2048, true},
    {"deepseek_decode_b1_s32768_h128_d576_k2048", 1, 32768, 128, 576, 2048, false},
    {"deepseek_decode_b32_s1048576_h128_d576_k2048", 32, 32 * 32768, 128, 576, 2048, false},
    {"deepseek_decode_b1_nextn2_s32768_h128_d576_k2048", 2, 32768, 128, 576, 2048, false},
    {"deepseek_decode_b32_nextn2_s1048576_h128_d576_k2048", 64, 32 * 32768, 128, 576, 2048, false},
    {"deepseek_decode_b64_nextn2_s2097152_h128_d576_k2048", 128, 64 * 32768, 128, 576, 2048, false},
    {"deepseek_decode_b128_nextn2_s4194304_h128_d576_k2048", 256, 128 * 32768, 128, 576, 2048,
     false},
    {"deepseek_decode_b1_s32768_h128_d576_k2048_fp8kv", 1, 32768, 128, 576, 2048, false, true},
    {"deepseek_decode_b32_s1048576_h128_d576_k2048_fp8kv", 32, 32 * 32768, 128, 576, 2048, false,
     true},
    {"deepseek_decode_b64_s2097152_h128_d576_k2048_fp8kv", 64, 64 * 32768, 128, 576, 2048, true,
     true},
    {"deepseek_decode_b128_s4194304_h128_d576_k2048_fp8kv", 128, 128 * 32768, 128, 576, 2048, true,
     true},
    {"deepseek_decode_b1_nextn2_s32768_h128_d576_k2048_fp8kv", 2, 32768, 128, 576, 2048, false,
     true},
    {"deepseek_decode_b32_nextn2_s1048576_h128_d576_k2048_fp8kv", 64, 32 * 32768, 128, 576, 2048,
     false, true},
    {"deepseek_decode_b64_nextn2_s2097152_h128_d576_k2048_fp8kv", 128, 64 * 32768, 128, 576, 2048,
     false, true},
    {"deepseek_decode_b128_nextn2_s4194304_h128_d576_k2048_fp8kv", 256, 128 * 32768, 128, 576, 2048,
     false, true},
    {"deepseek_decode_b128_s4194304_h64_d576_k2048_fp8kv", 128, 128 * 32768, 64, 576, 2048, false,
     true},
    {"deepseek_decode_b128_s4194304_h128_d576_k2048_fp8kv_invariant", 128, 128 * 32768, 128, 576,
     2048, false, true, true},
    {"deepseek_decode_b1_s32768_h128_d576_k2048_fp8kv_invariant", 1, 32768, 128, 576, 2048, false,
     true, true},
    {"deepseek_decode_b128_s4194304_h128_d576_k2048_fp8kv_f32scales", 128, 128 * 32768, 128, 576,
     2048, false, true, false, true},
};

// One KV pool per (S, d_qk, format, FP8 scale kind), shared by the presets and implementations
// that use it.
struct KvPool {
  std::shared_ptr<DeviceArena> arena;
  void* data = nullptr;
};
using KvPools = std::map<std::tuple<int64_t, int64_t, bool, bool>, KvPool>;

// The pool of `preset`: random bf16, or FP8 rows of random e4m3 codes (never NaN) with the
// tails of LaunchFp8MlaRowTails (scales 2^-7, or f32 ones for f32_scales).
absl::StatusOr<KvPool> PoolFor(const Preset& preset, KvPools* pools, uint64_t seed) {
  const auto key = std::make_tuple(preset.s, preset.d_qk, preset.fp8, preset.f32_scales);
  if (auto it = pools->find(key); it != pools->end()) return it->second;
  KvPool pool;
  pool.arena = std::make_shared<DeviceArena>();
  const int64_t s = preset.s;
  if (preset.fp8) {
    const int64_t row = sparse_mla::kFp8RowBytes;
    auto kv = pool.arena->Random(DType::kFp8E4M3, s * row, 1.0f, seed);
    if (!kv.ok()) return kv.status();
    GPU_RETURN_IF_ERROR(LaunchFp8MlaRowTails(*kv, s, preset.f32_scales, nullptr));
    GPU_RETURN_IF_ERROR(cudaDeviceSynchronize());
    pool.data = *kv;
  } else {
    auto kv = pool.arena->Random(DType::kBF16, s * preset.d_qk, 1.0f, seed);
    if (!kv.ok()) return kv.status();
    pool.data = *kv;
  }
  (*pools)[key] = pool;
  return pool;
}

// One call's buffers and Params, without an implementation: the presets' cases and the split
// sweep build their cases from it.
struct Call {
  sparse_mla::Params p;
  kernels::WorkCount work;
  std::shared_ptr<DeviceArena> arena;              // q, out, lse (and the preset's indices)
  std::vector<std::shared_ptr<DeviceArena>> keep;  // shared pools it reads (KV, a selection)
};

absl::StatusOr<Call> MakeCall(const Preset& preset, uint64_t seed, KvPools* pools) {
  Call c;
  c.arena = std::make_shared<DeviceArena>();
  const int64_t t = preset.t, s = preset.s, h = preset.h, d = preset.d_qk, k = preset.k;
  sparse_mla::Params& p = c.p;
  auto q = c.arena->Random(DType::kBF16, t * h * d, 1.0f, seed);
  if (!q.ok()) return q.status();
  auto kv = PoolFor(preset, pools, seed + 1);
  if (!kv.ok()) return kv.status();
  auto indices = c.arena->RandomInt(t * k, 0, static_cast<int32_t>(s - 1), seed + 2);
  if (!indices.ok()) return indices.status();
  auto out = c.arena->Alloc(t * h * sparse_mla::kDimV * 2);
  if (!out.ok()) return out.status();
  auto lse = c.arena->Alloc(t * h * 4);
  if (!lse.ok()) return lse.status();
  p.q = kernels::MakeTensor(*q, DType::kBF16, {t, h, d});
  p.kv = preset.fp8 ? kernels::MakeTensor(kv->data, DType::kU8, {s, sparse_mla::kFp8RowBytes})
                    : kernels::MakeTensor(kv->data, DType::kBF16, {s, d});
  p.indices = kernels::MakeTensor(*indices, DType::kI32, {t, k});
  p.out = kernels::MakeTensor(*out, DType::kBF16, {t, h, sparse_mla::kDimV});
  p.lse = kernels::MakeTensor(*lse, DType::kF32, {t, h});
  p.sm_scale = 1.0f / 24.0f;  // 1/sqrt(576)
  p.batch_invariant = preset.batch_invariant;
  if (absl::Status st = sparse_mla::Validate(p); !st.ok()) return st;
  c.work = sparse_mla::CountSlots(p);  // shapes only: every slot counts
  c.keep.push_back(kv->arena);
  return c;
}

// The case of `call` run through `impl` in `precision` (its Supports, workspace and split plan,
// as served).
absl::StatusOr<GpuBenchCase> ImplCase(Call call, const std::string& preset,
                                      const kernels::Impl<sparse_mla::Params>& impl,
                                      kernels::Precision precision) {
  call.p.precision = precision;
  std::string why;
  if (impl.supports && !impl.supports(call.p, &why)) {
    return absl::UnimplementedError(absl::StrCat(impl.name, ": ", why));
  }
  const absl::StatusOr<Workspace> ws = WorkspaceFor(impl, call.p, *call.arena);
  if (!ws.ok()) return ws.status();
  GpuBenchCase c;
  c.op = "sparse_mla";
  c.preset = preset;
  c.impl = impl.name;
  c.precision = kernels::PrecisionName(precision);
  c.peak = PeakKind::kBf16;
  c.work = call.work;
  c.arena = call.arena;
  const kernels::Impl<sparse_mla::Params>* run = &impl;
  // The launch holds the shared pools' arenas (alive as long as the case).
  c.launch = [p = call.p, run, w = *ws, keep = call.keep](gpu::Stream stream) {
    return RunImpl(*run, p, w, stream);
  };
  return c;
}

// GLM-5.3 prefill with the causal "kpool4" selection, defined here: queries at positions
// prefix + i (i < T = 2048) form pools of 4 consecutive positions; pool [p0, p0 + 3] shares one
// selection of min(2048, p0 + 1) distinct positions drawn uniformly from [0, p0] (sorted), and
// query p appends its causal tail, the positions p0 + 1 .. p (0 to 3 entries): 2048 + 3 = a
// 2051-entry width. CSR with fixed-width rows of 2051 (indptr[t] = 2051·t), unused entries -1;
// the logical bytes count the full fixed-width CSR indices. Two KV layouts: shared, one cache of
// prefix + T rows indexed by position (every query's rows are physically shared with its
// neighbours'); disjoint, each query owns private rows t·2051 + j for its entry j (the same
// logical selection with no physical reuse across queries; values random rather than copies).
// Bytes: B = 4QHD + 2DE + 4Q·2051 + 4(Q + 1) + 4QH (LSE), E the valid entries; FLOPs 4EHD (Count
// on the host copy of the selection).
constexpr int64_t kKpoolT = 2048, kKpoolWidth = 2051, kKpoolShared = 2048;

struct Kpool4Preset {
  int64_t h, prefix;
  bool disjoint;
};

constexpr Kpool4Preset kKpool4Presets[] = {
    {16, 0, false}, {16, 32768, false}, {16, 0, true}, {16, 32768, true},
    {8, 0, false},  {8, 32768, false},  {8, 0, true},  {8, 32768, true},
    {32, 0, false}, {32, 32768, false}, {32, 0, true}, {32, 32768, true},
};

std::string Kpool4Name(const Kpool4Preset& k) {
  return absl::StrCat("glm_prefill_kpool4_t", kKpoolT, "_p", k.prefix, "_h", k.h, "_d512_",
                      k.disjoint ? "disjoint" : "shared");
}

// The selection of (prefix, layout) on the host and the device, shared by its presets.
struct Kpool4Selection {
  std::shared_ptr<DeviceArena> arena;
  std::vector<int32_t> indices, indptr;  // host copies (for Count)
  void* d_indices = nullptr;
  void* d_indptr = nullptr;
  int64_t s = 0;  // KV rows
};

absl::StatusOr<Kpool4Selection> MakeKpool4Selection(int64_t prefix, bool disjoint, uint64_t seed) {
  Kpool4Selection sel;
  sel.indices.assign(kKpoolT * kKpoolWidth, -1);
  sel.indptr.resize(kKpoolT + 1);
  for (int64_t t = 0; t <= kKpoolT; ++t) sel.indptr[t] = static_cast<int32_t>(t * kKpoolWidth);
  std::mt19937_64 rng(seed);
  std::vector<int32_t> chosen;
  std::vector<uint8_t> taken;
  for (int64_t t0 = 0; t0 < kKpoolT; t0 += 4) {
    const int64_t p0 = prefix + t0;  // pool start (prefix is a multiple of 4)
    const int64_t visible = p0 + 1, n = std::min(kKpoolShared, visible);
    chosen.clear();
    taken.assign(visible, 0);
    std::uniform_int_distribution<int64_t> pick(0, visible - 1);
    if (n == visible) {
      for (int64_t x = 0; x < visible; ++x) chosen.push_back(static_cast<int32_t>(x));
    } else {
      while (static_cast<int64_t>(chosen.size()) < n) {  // n <= visible / 4 here: few rejects
        const int64_t x = pick(rng);
        if (!taken[x]) {
          taken[x] = 1;
          chosen.push_back(static_cast<int32_t>(x));
        }
      }
      std::sort(chosen.begin(), chosen.end());
    }
    for (int64_t t = t0; t < t0 + 4 && t < kKpoolT; ++t) {
      int32_t* row = sel.indices.data() + t * kKpoolWidth;
      int64_t j = 0;
      for (int32_t x : chosen) row[j++] = x;
      for (int64_t x = p0 + 1; x <= prefix + t; ++x) row[j++] = static_cast<int32_t>(x);
      if (disjoint) {
        for (int64_t i = 0; i < j; ++i) row[i] = static_cast<int32_t>(t * kKpoolWidth + i);
      }
    }
  }
  sel.s = disjoint ? kKpoolT * kKpoolWidth : prefix + kKpoolT;
  sel.arena = std::make_shared<DeviceArena>();
  auto idx = sel.arena->Upload(sel.indices.data(), static_cast<int64_t>(sel.indices.size()) * 4);
  if (!idx.ok()) return idx.status();
  auto ptr = sel.arena->Upload(sel.indptr.data(), static_cast<int64_t>(sel.indptr.size()) * 4);
  if (!ptr.ok()) return ptr.status();
  sel.d_indices = *idx;
  sel.d_indptr = *ptr;
  return sel;
}

absl::StatusOr<Call> MakeKpool4Call(const Kpool4Preset& kp, const Kpool4Selection& sel,
                                    uint64_t seed, KvPools* pools) {
  Call c;
  c.arena = std::make_shared<DeviceArena>();
  const int64_t t = kKpoolT, h = kp.h, d = 512;
  const Preset pool_preset{"kpool4", t, sel.s, h, d, kKpoolWidth, false};
  auto kv = PoolFor(pool_preset, pools, 7);  // one pool per S, shared by every preset
  if (!kv.ok()) return kv.status();
  auto q = c.arena->Random(DType::kBF16, t * h * d, 1.0f, seed);
  if (!q.ok()) return q.status();
  auto out = c.arena->Alloc(t * h * sparse_mla::kDimV * 2);
  if (!out.ok()) return out.status();
  auto lse = c.arena->Alloc(t * h * 4);
  if (!lse.ok()) return lse.status();
  sparse_mla::Params& p = c.p;
  p.q = kernels::MakeTensor(*q, DType::kBF16, {t, h, d});
  p.kv = kernels::MakeTensor(kv->data, DType::kBF16, {sel.s, d});
  p.indices = kernels::MakeTensor(sel.d_indices, DType::kI32, {t * kKpoolWidth});
  p.indptr = kernels::MakeTensor(sel.d_indptr, DType::kI32, {t + 1});
  p.out = kernels::MakeTensor(*out, DType::kBF16, {t, h, sparse_mla::kDimV});
  p.lse = kernels::MakeTensor(*lse, DType::kF32, {t, h});
  p.sm_scale = 1.0f / 22.627417f;  // 1/sqrt(512)
  if (absl::Status st = sparse_mla::Validate(p); !st.ok()) return st;
  sparse_mla::Params host = p;  // Count reads the selection: the host copies
  host.indices.data = const_cast<int32_t*>(sel.indices.data());
  host.indptr.data = const_cast<int32_t*>(sel.indptr.data());
  c.work = sparse_mla::Count(host);
  c.keep = {kv->arena, sel.arena};
  return c;
}

absl::Status AddKpool4Cases(const std::string& filter, KvPools* pools,
                            std::vector<GpuBenchCase>* cases) {
  std::map<std::pair<int64_t, bool>, Kpool4Selection> selections;
  uint64_t seed = 5000;
  for (const auto& impl : sparse_mla::Implementations()) {
    if (impl.backend != kernels::Backend::kCuda || impl.name == "cuda_simt") continue;
    for (const Kpool4Preset& kp : kKpool4Presets) {
      seed += 3;
      const std::string name = absl::StrCat("sparse_mla/", Kpool4Name(kp), "/", impl.name);
      if (!MayMatch(name, filter)) continue;
      const auto key = std::make_pair(kp.prefix, kp.disjoint);
      if (selections.find(key) == selections.end()) {
        auto sel = MakeKpool4Selection(kp.prefix, kp.disjoint, 4000 + kp.prefix + kp.disjoint);
        if (!sel.ok()) return sel.status();
        selections.emplace(key, std::move(*sel));
      }
      auto call = MakeKpool4Call(kp, selections.at(key), seed, pools);
      if (!call.ok()) return call.status();
      for (const kernels::Precision precision : kBenchPrecisions) {
        auto c = ImplCase(*call, Kpool4Name(kp), impl, precision);
        if (absl::IsUnimplemented(c.status())) {
          std::cerr << "skipping " << name << ": " << c.status().message() << "\n";
          break;
        }
        if (!c.ok()) return c.status();
        cases->push_back(std::move(*c));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<GpuBenchCase>> MakeSparseMlaCases(const std::string& filter) {
  std::vector<GpuBenchCase> cases;
  KvPools pools;
  uint64_t seed = 100;
  for (const auto& impl : sparse_mla::Implementations()) {
    if (impl.backend != kernels::Backend::kCuda) continue;
    for (const Preset& preset : kPresets) {
      seed += 3;
      if (impl.name == "cuda_simt" && !preset.simt) continue;
      const std::string name = absl::StrCat("sparse_mla/", preset.name, "/", impl.name);
      if (!MayMatch(name, filter)) continue;
      auto call = MakeCall(preset, seed, &pools);
      if (!call.ok()) return call.status();
      for (const kernels::Precision precision : kBenchPrecisions) {  // one call's buffers, both
        auto c = ImplCase(*call, preset.name, impl, precision);
        if (absl::IsUnimplemented(c.status())) {  // refused: the shape, or this precision
          std::cerr << "skipping " << name << " " << kernels::PrecisionName(precision) << ": "
                    << c.status().message() << "\n";
          continue;
        }
        if (!c.ok()) return c.status();
        cases.push_back(std::move(*c));
      }
    }
  }
  if (absl::Status st = AddKpool4Cases(filter, &pools, &cases); !st.ok()) return st;
  return cases;
}

// Split-K sweep: checks that the split count GpuSplits picks is near the best per shape
// (docs/BENCHMARKS.md "Split-K plan").
// Op "sparse_mla_splits", built only when --filter contains "sparse_mla_splits" (the default run
// and --filter=sparse_mla skip it):  attn_gpu_bench --replays=20 --filter=sparse_mla_splits/
// Each shape runs its kernel through launch.h's launcher at explicit split counts s from
// kSweepSplits up to the plan's cap (half the 64-slot blocks of K, or of nnz for CSR, at most
// kMaxSplits) and at the count GpuSplits picks, one workspace per shape sized
// SplitWorkspaceBytes(p, largest s). Preset "<shape>_s<s>", "-heuristic" appended at the pick.
struct SweepShape {
  const char* preset;  // a kPresets name, or "kpool4" (kKpool4Presets[0]: H16, prefix 0, shared)
  sparse_mla::gpu::GpuKernel kernel;
};

constexpr sparse_mla::gpu::GpuKernel kWgmma = sparse_mla::gpu::GpuKernel::kWgmma;
constexpr SweepShape kSweepShapes[] = {
    {"deepseek_decode_b1_s32768_h128_d576_k2048", kWgmma},
    {"deepseek_decode_b32_s1048576_h128_d576_k2048", kWgmma},
    {"deepseek_decode_b64_s2097152_h128_d576_k2048", kWgmma},
    {"deepseek_decode_b128_s4194304_h128_d576_k2048", kWgmma},
    {"deepseek_decode_b1_s32768_h128_d576_k2048_fp8kv", kWgmma},
    {"deepseek_decode_b32_s1048576_h128_d576_k2048_fp8kv", kWgmma},
    {"deepseek_decode_b64_s2097152_h128_d576_k2048_fp8kv", kWgmma},
    {"deepseek_decode_b128_s4194304_h128_d576_k2048_fp8kv", kWgmma},
    {"deepseek_decode_b32_nextn2_s1048576_h128_d576_k2048_fp8kv", kWgmma},
    {"deepseek_decode_b128_nextn2_s4194304_h128_d576_k2048_fp8kv", kWgmma},
    {"deepseek_prefill_t4096_s32768_h128_d576_k2048", kWgmma},
    {"glm_prefill_t2048_s32768_h64_d512_k2048", kWgmma},
    {"glm_prefill_t2048_s32768_h16_d512_k2048", sparse_mla::gpu::GpuKernel::kMma},
    {"glm_prefill_t2048_s32768_h32_d512_k2048", sparse_mla::gpu::GpuKernel::kMma},
    {"kpool4", sparse_mla::gpu::GpuKernel::kMmaLowH},
};
constexpr int kSweepSplits[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};

absl::Status LaunchWithSplits(const sparse_mla::Params& p, sparse_mla::gpu::GpuKernel kernel,
                              int splits, void* workspace, gpu::Stream stream) {
  switch (kernel) {
    case sparse_mla::gpu::GpuKernel::kWgmma:
      GPU_RETURN_IF_ERROR(sparse_mla::gpu::LaunchSparseMlaWgmma(p, splits, workspace, stream));
      break;
    case sparse_mla::gpu::GpuKernel::kWgmmaPp:
      GPU_RETURN_IF_ERROR(sparse_mla::gpu::LaunchSparseMlaWgmmaPp(p, splits, workspace, stream));
      break;
    case sparse_mla::gpu::GpuKernel::kMma:
      GPU_RETURN_IF_ERROR(sparse_mla::gpu::LaunchSparseMlaMma(p, splits, workspace, stream));
      break;
    case sparse_mla::gpu::GpuKernel::kMmaLowH:
      GPU_RETURN_IF_ERROR(sparse_mla::gpu::LaunchSparseMlaMmaLowh(p, splits, workspace, stream));
      break;
    case sparse_mla::gpu::GpuKernel::kSimt:
      GPU_RETURN_IF_ERROR(sparse_mla::gpu::LaunchSparseMlaSimt(p, splits, workspace, stream));
      break;
  }
  return absl::OkStatus();
}

const char* KernelImplName(sparse_mla::gpu::GpuKernel kernel) {
  switch (kernel) {
    case sparse_mla::gpu::GpuKernel::kWgmma: return "cuda_wgmma";
    case sparse_mla::gpu::GpuKernel::kWgmmaPp: return "cuda_wgmma_pp";
    case sparse_mla::gpu::GpuKernel::kMma: return "cuda_mma";
    case sparse_mla::gpu::GpuKernel::kMmaLowH: return "cuda_mma_lowh";
    case sparse_mla::gpu::GpuKernel::kSimt: break;
  }
  return "cuda_simt";
}

absl::StatusOr<std::vector<GpuBenchCase>> MakeSplitSweepCases(const std::string& filter) {
  std::vector<GpuBenchCase> cases;
  if (filter.find("sparse_mla_splits") == std::string::npos) return cases;
  KvPools pools;
  uint64_t seed = 9000;
  for (const SweepShape& shape : kSweepShapes) {
    seed += 3;
    const bool kpool4 = std::string(shape.preset) == "kpool4";
    const std::string name = kpool4 ? Kpool4Name(kKpool4Presets[0]) : shape.preset;
    const std::string prefix = absl::StrCat("sparse_mla_splits/", name);
    if (filter.find(prefix) == std::string::npos && prefix.find(filter) == std::string::npos) {
      continue;  // the filter names another shape
    }
    absl::StatusOr<Call> call = absl::NotFoundError(absl::StrCat("no preset ", name));
    if (kpool4) {
      const Kpool4Preset& kp = kKpool4Presets[0];
      auto sel = MakeKpool4Selection(kp.prefix, kp.disjoint, 4000 + kp.prefix + kp.disjoint);
      if (!sel.ok()) return sel.status();
      call = MakeKpool4Call(kp, *sel, seed, &pools);
    } else {
      for (const Preset& preset : kPresets) {
        if (name == preset.name) call = MakeCall(preset, seed, &pools);
      }
    }
    if (!call.ok()) return call.status();
    const sparse_mla::Params& p = call->p;
    std::string why;
    if (!sparse_mla::gpu::GpuSupports(shape.kernel, p, &why)) {
      std::cerr << "skipping " << prefix << ": " << KernelImplName(shape.kernel) << ": " << why
                << "\n";
      continue;
    }
    const int64_t width = p.is_csr() ? p.indices.dim(0) : p.indices.dim(1);
    const int64_t cap = std::clamp<int64_t>((width + 63) / 64 / 2, 1, sparse_mla::gpu::kMaxSplits);
    const int heuristic = sparse_mla::gpu::GpuSplits(p, shape.kernel);
    std::vector<int> splits = {heuristic};  // the pick, even where the list lacks it
    for (int s : kSweepSplits) {
      if (s <= cap && s != heuristic) splits.push_back(s);
    }
    std::sort(splits.begin(), splits.end());
    void* workspace = nullptr;
    if (splits.back() > 1) {
      auto ws = call->arena->Alloc(sparse_mla::gpu::SplitWorkspaceBytes(p, splits.back()));
      if (!ws.ok()) return ws.status();
      workspace = *ws;
    }
    for (int s : splits) {
      GpuBenchCase c;
      c.op = "sparse_mla_splits";
      c.preset = absl::StrCat(name, "_s", s, s == heuristic ? "-heuristic" : "");
      c.impl = KernelImplName(shape.kernel);
      c.precision = kernels::PrecisionName(p.precision);  // the default, FAST
      c.peak = PeakKind::kBf16;
      c.work = call->work;
      c.arena = call->arena;
      c.launch = [p, kernel = shape.kernel, s, workspace, keep = call->keep](gpu::Stream stream) {
        return LaunchWithSplits(p, kernel, s, workspace, stream);
      };
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

}  // namespace
}  // namespace attnd::bench

ATTND_REGISTER_GPU_BENCH(sparse_mla, attnd::bench::MakeSparseMlaCases);
ATTND_REGISTER_GPU_BENCH(sparse_mla_splits, attnd::bench::MakeSplitSweepCases);
