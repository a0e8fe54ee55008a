// Sparse MLA on the GPU, where the GPU is the point: forced split counts (empty splits
// included) against the fp64 reference with NaN guard rows around the device KV, a KV pool whose
// row offsets pass 2^31 elements and whose unselected rows are NaN, a malformed CSR indptr
// (memory-safe and clamped as documented), and Supports' refusals; each with a bf16 KV cache and
// with the FP8 cache. Skipped without a GPU backend or device.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/common/dtype.h"
#include "kernels/sparse_mla/reference.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "tests/harness/harness.h"
#include "tests/kernels/sparse_mla/case.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/common/gpu/runtime.h"
#include "kernels/sparse_mla/gpu/launch.h"
#endif

namespace attnd::testing {
namespace {

using kernels::sparse_mla::ComputeReference;
using kernels::sparse_mla::Params;
using kernels::sparse_mla::Reference;

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)

using kernels::sparse_mla::gpu::GpuKernel;

// kWgmmaPp (sm_90a, FAST, bf16 cache; H a multiple of 64 or below 64) only where it applies:
// EveryCountMatchesReference skips its refusals.
std::vector<GpuKernel> Kernels() {
#if defined(ATTND_GPU_CUDA)
  return {GpuKernel::kMma, GpuKernel::kSimt, GpuKernel::kWgmmaPp};
#else
  return {GpuKernel::kSimt};
#endif
}

const char* Name(GpuKernel k) {
  return k == GpuKernel::kMma ? "mma" : k == GpuKernel::kWgmmaPp ? "wgmma_pp" : "simt";
}

// Runs `kernel` with exactly `splits` splits on device mirrors of `p` (outputs come back to
// the host tensors). The device KV carries the case's NaN guard rows on both sides, so a read
// of index -2, -1, S or S+1 poisons the output.
absl::Status RunWithSplits(GpuKernel kernel, const Params& p, int splits) {
  return RunWithSplitsOnGpu(
      [kernel](const Params& d, int s, void* workspace, gpu::Stream stream) {
#if defined(ATTND_GPU_CUDA)
        if (kernel == GpuKernel::kMma) {
          return kernels::sparse_mla::gpu::LaunchSparseMlaMma(d, s, workspace, stream);
        }
        if (kernel == GpuKernel::kWgmmaPp) {
          return kernels::sparse_mla::gpu::LaunchSparseMlaWgmmaPp(d, s, workspace, stream);
        }
#endif
        return kernels::sparse_mla::gpu::LaunchSparseMlaSimt(d, s, workspace, stream);
      },
      p, splits);
}

// (H, d_qk, KV format): every split count, including more splits than 64-slot blocks (empty
// splits write -inf partials that the combine must skip: the workspace starts as 0xff, NaN), in
// both precisions.
class SparseMlaGpuSplits : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, KvFormat>> {
};

TEST_P(SparseMlaGpuSplits, EveryCountMatchesReference) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  std::tie(spec.h, spec.d_qk, spec.kv_format) = GetParam();
  spec.t = 4;
  spec.s = 3000;
  spec.k = 333;  // 6 blocks of 64, the last one partial
  spec.masked_fraction = 0.2;
  // Rows: full, a 65-slot prefix, empty, and one that ends inside the first block.
  SparseMlaCase c(spec, rng, RandomSlots(spec, rng), {333, 65, 0, 17});
  const Reference refs[2] = {ComputeReference(c.MakeParams(false)),
                             ComputeReference(c.MakeParams(true))};
  for (GpuKernel kernel : Kernels()) {
    for (bool csr : {false, true}) {
      Params p = c.MakeParams(csr);
      std::string why;
      const bool pp = kernel == GpuKernel::kWgmmaPp;
      if (!pp && !kernels::sparse_mla::gpu::GpuSupports(kernel, p, &why)) {
        ADD_FAILURE() << Name(kernel) << " refuses a supported shape: " << why;
        continue;
      }
      for (const auto& [precision, splits] : PrecisionsAndSplits({1, 2, 3, 6, 7, 32})) {
        p.precision = precision;
        if (pp && !kernels::sparse_mla::gpu::GpuSupports(kernel, p, &why)) continue;
        const std::string what = std::string(Name(kernel)) + (csr ? " csr" : " table") +
                                 " splits " + std::to_string(splits);
        for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
        const absl::Status s = RunWithSplits(kernel, p, splits);
        ASSERT_TRUE(s.ok()) << what << ": " << s;
        ExpectOutputs(c, p, refs[csr], what);
        // Token 2 has no slot: out +0.0, lse -inf, whatever the split count.
        for (int64_t h = 0; h < spec.h; ++h) {
          EXPECT_EQ(c.lse().At({2, h}), -std::numeric_limits<double>::infinity()) << what;
          EXPECT_EQ(c.out().data<uint16_t>()[c.out().Offset({2, h, 0})], 0u) << what;
        }
      }
    }
  }
}

// lse in the caller's layout (docs/CONTRACTS.md "Strided lse") from every GPU kernel's epilogue
// (StoreRowLse) and the split combine: a [T, H] view of vLLM's [H, T + 3] buffer, split counts 1
// (the kernel writes lse) and 3, 7 (the combine does), the poisoned gaps checked after each run
// (ExpectOutputs). H 16 (simt, mma, mma_lowh; wgmma_pp on sm_90a) and 64 (simt, mma, wgmma and
// wgmma_pp on sm_90a).
TEST(SparseMlaGpu, LseInCallersLayoutFromEveryKernelAndTheCombine) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  namespace sg = kernels::sparse_mla::gpu;
  struct Kernel {
    GpuKernel kind;
    const char* name;
    SplitLauncher launch;
  };
  const std::vector<Kernel> launchers = {
#if defined(ATTND_GPU_CUDA)
    {GpuKernel::kMma, "mma",
     [](const Params& d, int n, void* w, gpu::Stream st) {
       return sg::LaunchSparseMlaMma(d, n, w, st);
     }},
    {GpuKernel::kMmaLowH, "mma_lowh",
     [](const Params& d, int n, void* w, gpu::Stream st) {
       return sg::LaunchSparseMlaMmaLowh(d, n, w, st);
     }},
    {GpuKernel::kWgmma, "wgmma",
     [](const Params& d, int n, void* w, gpu::Stream st) {
       return sg::LaunchSparseMlaWgmma(d, n, w, st);
     }},
    {GpuKernel::kWgmmaPp, "wgmma_pp",
     [](const Params& d, int n, void* w, gpu::Stream st) {
       return sg::LaunchSparseMlaWgmmaPp(d, n, w, st);
     }},
#endif
    {GpuKernel::kSimt, "simt",
     [](const Params& d, int n, void* w, gpu::Stream st) {
       return sg::LaunchSparseMlaSimt(d, n, w, st);
     }},
  };
  for (const int64_t h : {16, 64}) {
    std::mt19937_64 rng = MakeRng();
    SparseMlaSpec spec;
    spec.t = 6;
    spec.h = h;
    spec.s = 2000;
    spec.k = 300;
    spec.lse_head_major = true;
    spec.lse_pad = 3;
    std::vector<std::vector<int32_t>> slots = RandomSlots(spec, rng);
    for (auto& x : slots[4]) x = -1;  // token 4: no valid slot, lse -inf through the strides
    SparseMlaCase c(spec, rng, slots, {});
    const Params p = c.MakeParams(false);
    const Reference ref = ComputeReference(p);
    for (const Kernel& k : launchers) {
      std::string why;
      if (!kernels::sparse_mla::gpu::GpuSupports(k.kind, p, &why)) continue;  // e.g. no sm_90a
      for (const int splits : {1, 3, 7}) {
        const std::string what =
            std::string(k.name) + " H " + std::to_string(h) + " splits " + std::to_string(splits);
        for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
        const absl::Status s = RunWithSplitsOnGpu(k.launch, p, splits);
        ASSERT_TRUE(s.ok()) << what << ": " << s;
        ExpectOutputs(c, p, ref, what);
        for (int64_t hh = 0; hh < h; ++hh) {
          EXPECT_EQ(c.lse().At({4, hh}), -std::numeric_limits<double>::infinity()) << what;
        }
      }
    }
  }
}

constexpr KvFormat kBf16 = KvFormat::kBf16, kFp8 = KvFormat::kFp8;

INSTANTIATE_TEST_SUITE_P(
    Shapes, SparseMlaGpuSplits,
    ::testing::Values(std::make_tuple(16, 576, kBf16), std::make_tuple(8, 512, kBf16),
                      std::make_tuple(32, 576, kBf16), std::make_tuple(64, 512, kBf16),
                      std::make_tuple(128, 576, kBf16), std::make_tuple(100, 576, kBf16),
                      std::make_tuple(8, 576, kFp8), std::make_tuple(16, 576, kFp8),
                      std::make_tuple(32, 576, kFp8), std::make_tuple(64, 576, kFp8),
                      std::make_tuple(128, 576, kFp8), std::make_tuple(100, 576, kFp8)),
    [](const auto& info) {
      return "H" + std::to_string(std::get<0>(info.param)) + "_d" +
             std::to_string(std::get<1>(info.param)) + "_" + KvFormatName(std::get<2>(info.param));
    });

// The per-tensor FP8 cache (CACHE_LAYOUT_FP8_576/512_PER_TENSOR, built by vLLM's writer rules,
// power-of-two scale: the kernels' bf16 values are exact) at both widths: the SIMT kernel with
// every split count in both precisions; the tensor-core kernels refuse it with a reason, so the
// dispatch falls back to SIMT.
class SparseMlaGpuPerTensor : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(SparseMlaGpuPerTensor, SimtEverySplitCountAndFastPathsRefuse) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  std::tie(spec.h, spec.d_qk) = GetParam();
  spec.kv_format = KvFormat::kFp8PerTensor;
  spec.t = 4;
  spec.s = 3000;
  spec.k = 333;
  spec.masked_fraction = 0.2;
  SparseMlaCase c(spec, rng, RandomSlots(spec, rng), {333, 65, 0, 17});
  const Reference refs[2] = {ComputeReference(c.MakeParams(false)),
                             ComputeReference(c.MakeParams(true))};
  for (bool csr : {false, true}) {
    Params p = c.MakeParams(csr);
    std::string why;
    ASSERT_TRUE(kernels::sparse_mla::gpu::GpuSupports(GpuKernel::kSimt, p, &why)) << why;
#if defined(ATTND_GPU_CUDA)
    for (GpuKernel k : {GpuKernel::kMma, GpuKernel::kMmaLowH, GpuKernel::kWgmma}) {
      why.clear();
      EXPECT_FALSE(kernels::sparse_mla::gpu::GpuSupports(k, p, &why));
      EXPECT_NE(why.find("per-tensor FP8"), std::string::npos) << why;
    }
#endif
    for (const auto& [precision, splits] : PrecisionsAndSplits({1, 2, 3, 7, 32})) {
      p.precision = precision;
      const std::string what =
          std::string("simt") + (csr ? " csr" : " table") + " splits " + std::to_string(splits);
      for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
      const absl::Status s = RunWithSplits(GpuKernel::kSimt, p, splits);
      ASSERT_TRUE(s.ok()) << what << ": " << s;
      ExpectOutputs(c, p, refs[csr], what);
    }
    // The dispatch (Implementations(), fastest first) runs the SIMT kernel.
    int runs = 0;
    RunEachImpl(kernels::sparse_mla::Implementations(), p, c.Outputs(),
                [&](const std::string& impl) {
                  ++runs;
                  ExpectOutputs(c, p, refs[csr], impl + " via its Supports");
                });
    EXPECT_GE(runs, 2);  // the CPU one and the SIMT one
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SparseMlaGpuPerTensor,
                         ::testing::Values(std::make_tuple(16, 576), std::make_tuple(64, 576),
                                           std::make_tuple(128, 512), std::make_tuple(8, 512)),
                         [](const auto& info) {
                           return "H" + std::to_string(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param));
                         });

// A KV pool whose row offsets pass 2^31 elements, allocated on the device and filled with NaN
// (0xff: NaN bf16, NaN e4m3 codes and f32 scales); only the selected rows get values. bf16: 4.1M
// rows x 576 (4.7 GB); FP8: 3.4M rows x 656 bytes (2.2 GB, 2^31 bytes from row 3'273'604). A row
// address computed in 32 bits lands on a NaN row (or outside the pool) and the output shows it.
// Each GPU edge case with either KV cache format.
class SparseMlaGpuKv : public ::testing::TestWithParam<KvFormat> {};

TEST_P(SparseMlaGpuKv, KvPoolPast2To31Elements) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  const bool fp8 = GetParam() == KvFormat::kFp8;
  constexpr int64_t kDqk = 576;
  const int64_t rows_total = fp8 ? 3'400'000 : 4'100'000;
  const int64_t row_bytes = fp8 ? kernels::sparse_mla::kFp8RowBytes : kDqk * 2;
  const int64_t first_high = fp8 ? 3'273'700 : 3'728'000;  // past 2^31 elements
  const DType kv_dtype = fp8 ? DType::kU8 : DType::kBF16;
  const int64_t row_elements = fp8 ? row_bytes : kDqk;
  std::mt19937_64 rng = MakeRng();
  const int64_t t = 3, h = 64, k = 200;

  // Host copy of the selected rows only: indices mostly past 2^31 elements.
  HostTensor indices = HostTensor::Dense(DType::kI32, {t, k});
  std::uniform_int_distribution<int32_t> high(static_cast<int32_t>(first_high),
                                              static_cast<int32_t>(rows_total - 1)),
      low(0, 1000);
  std::vector<std::vector<uint8_t>> rows;  // row bytes in first-use order
  std::vector<int32_t> row_ids;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < t * k; ++i) {
    const int32_t row = i % 5 == 0 ? low(rng) : high(rng);
    indices.data<int32_t>()[i] = row;
    if (std::find(row_ids.begin(), row_ids.end(), row) != row_ids.end()) continue;
    row_ids.push_back(row);
    rows.emplace_back(row_bytes);
    if (fp8) {
      FillFp8Row(rows.back().data(), rng, /*pow2_scales=*/true);
    } else {
      for (int64_t d = 0; d < kDqk; ++d) {
        const kernels::bf16_t b = kernels::FloatToBf16(normal(rng));
        std::memcpy(rows.back().data() + 2 * d, &b, 2);
      }
    }
  }
  DeviceMirror mirror;
  void* pool = nullptr;
  ASSERT_TRUE(mirror.Allocate(rows_total * row_bytes, &pool).ok()) << "cannot allocate the pool";
  const auto stream = static_cast<gpu::Stream>(mirror.stream());
  for (size_t i = 0; i < row_ids.size(); ++i) {
    ASSERT_EQ(gpu::MemcpyH2DAsync(static_cast<char*>(pool) + row_ids[i] * row_bytes, rows[i].data(),
                                  row_bytes, stream),
              gpu::kSuccess);
  }
  HostTensor q = HostTensor::Dense(DType::kBF16, {t, h, kDqk});
  FillNormal(q, rng, 1.0);
  HostTensor out = HostTensor::Dense(DType::kBF16, {t, h, 512});
  HostTensor lse = HostTensor::Dense(DType::kF32, {t, h});

  // Reference params: a compact host KV of the distinct rows with remapped indices.
  HostTensor compact_kv =
      HostTensor::Dense(kv_dtype, {static_cast<int64_t>(row_ids.size()), row_elements});
  HostTensor compact_idx = HostTensor::Dense(DType::kI32, {t, k});
  for (size_t i = 0; i < row_ids.size(); ++i) {
    std::memcpy(compact_kv.raw() + i * row_bytes, rows[i].data(), row_bytes);
  }
  for (int64_t i = 0; i < t * k; ++i) {
    const auto it = std::find(row_ids.begin(), row_ids.end(), indices.data<int32_t>()[i]);
    compact_idx.data<int32_t>()[i] = static_cast<int32_t>(it - row_ids.begin());
  }
  Params ref_params;
  ref_params.q = q.tensor();
  ref_params.kv = compact_kv.tensor();
  ref_params.indices = compact_idx.tensor();
  ref_params.sm_scale = 0.0417f;
  ref_params.out = out.tensor();
  ref_params.lse = lse.tensor();
  const Reference ref = ComputeReference(ref_params);

  for (GpuKernel kernel : Kernels()) {
    Params p = ref_params;
    p.kv = kernels::MakeTensor(pool, kv_dtype, {rows_total, row_elements});
    p.indices = indices.tensor();
    ASSERT_TRUE(kernels::sparse_mla::Validate(p).ok());
    for (const auto& [precision, split_count] : PrecisionsAndSplits({1, 3})) {
      const int splits = split_count;  // captured below (a structured binding cannot be)
      p.precision = precision;
      SCOPED_TRACE(std::string(Name(kernel)) + " splits " + std::to_string(splits) + " " +
                   kernels::PrecisionName(precision));
      PoisonNaN(out);
      PoisonNaN(lse);
      // q, indices, out and lse through the mirror; kv is already on the device.
      Params host = p;
      host.kv = kernels::Tensor{};  // absent: not mirrored
      kernels::Impl<Params> impl(
          "forced", GpuBackend(), nullptr,
          [kernel, splits, pool, kv_dtype, rows_total, row_elements](
              const Params& d, const kernels::ExecContext& ctx) {
            Params call = d;
            call.kv = kernels::MakeTensor(pool, kv_dtype, {rows_total, row_elements});
            const auto s = static_cast<gpu::Stream>(ctx.stream);
#if defined(ATTND_GPU_CUDA)
            if (kernel == GpuKernel::kMma) {
              GPU_RETURN_IF_ERROR(
                  kernels::sparse_mla::gpu::LaunchSparseMlaMma(call, splits, ctx.workspace, s));
              return absl::OkStatus();
            }
#endif
            GPU_RETURN_IF_ERROR(
                kernels::sparse_mla::gpu::LaunchSparseMlaSimt(call, splits, ctx.workspace, s));
            return absl::OkStatus();
          },
          [splits](const Params& hp) {
            return kernels::sparse_mla::gpu::SplitWorkspaceBytes(hp, splits);
          });
      ASSERT_TRUE(mirror.Synchronize().ok());  // the pool's rows are uploaded
      const absl::Status s = RunOnGpu(impl, host);
      ASSERT_TRUE(s.ok()) << s;
      ExpectAttentionOut(ToDoubles(out), ref.out, ref.out_abs, precision, kOutTol, "out");
      ExpectClose(ToDoubles(lse), ref.lse, kLseTol, "lse");
    }
  }
}

// A malformed CSR indptr (the CPU refuses it with INVALID_ARGUMENT) cannot be checked on the
// host for device data: the kernels clamp row t to [b, e), b = clamp(indptr[t], 0, nnz),
// e = clamp(indptr[t+1], b, nnz), and read nothing outside `indices`.
TEST_P(SparseMlaGpuKv, MalformedIndptrIsClampedAndMemorySafe) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.kv_format = GetParam();
  spec.t = 5;
  spec.h = 16;
  spec.s = 400;
  spec.k = 100;
  spec.masked_fraction = 0.1;
  SparseMlaCase c(spec, rng);
  Params p = c.MakeParams(/*csr=*/true);
  const int64_t nnz = p.indices.dim(0);
  int32_t* ip = p.indptr.ptr<int32_t>();
  const std::vector<int32_t> saved(ip, ip + spec.t + 1);
  // Starts below 0, a decreasing step, a row past nnz, an end past nnz.
  const std::vector<int32_t> bad = {
      -7, 150, 90, static_cast<int32_t>(nnz) + 40, 260, static_cast<int32_t>(nnz) + 1000};
  std::copy(bad.begin(), bad.end(), ip);

  // The same rows as a well-formed CSR over a copy of the clamped ranges.
  HostTensor good_ptr = HostTensor::Dense(DType::kI32, {spec.t + 1});
  std::vector<int32_t> flat;
  good_ptr.data<int32_t>()[0] = 0;
  for (int64_t t = 0; t < spec.t; ++t) {
    const int64_t b = std::clamp<int64_t>(bad[t], 0, nnz);
    const int64_t e = std::clamp<int64_t>(bad[t + 1], b, nnz);
    for (int64_t i = b; i < e; ++i) flat.push_back(p.indices.ptr<int32_t>()[i]);
    good_ptr.data<int32_t>()[t + 1] = static_cast<int32_t>(flat.size());
  }
  HostTensor good_idx = HostTensor::Dense(DType::kI32, {static_cast<int64_t>(flat.size())});
  std::copy(flat.begin(), flat.end(), good_idx.data<int32_t>());
  Params good = p;
  good.indptr = good_ptr.tensor();
  good.indices = good_idx.tensor();
  ASSERT_TRUE(kernels::sparse_mla::CheckSelectionData(good).ok());

  const Reference ref = ComputeReference(good);
  for (GpuKernel kernel : Kernels()) {
    std::string why;
    if (!kernels::sparse_mla::gpu::GpuSupports(kernel, p, &why)) {
      // The ping-pong kernel takes FAST and the bf16 cache on sm_90a only; the others take all.
      if (kernel != GpuKernel::kWgmmaPp) ADD_FAILURE() << Name(kernel) << " refuses: " << why;
      continue;
    }
    for (int splits : {1, 4}) {
      const std::string what = std::string(Name(kernel)) + " splits " + std::to_string(splits);
      for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
      const absl::Status s = RunWithSplits(kernel, p, splits);
      ASSERT_TRUE(s.ok()) << what << ": " << s;
      ExpectOutputs(c, good, ref, what);
    }
  }
  std::copy(saved.begin(), saved.end(), ip);
}

TEST_P(SparseMlaGpuKv, SupportsRefusesMisalignedViewsWithAReason) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.kv_format = GetParam();
  // Rows not 16-byte aligned: bf16 580 elements (not a multiple of 8); FP8 664 bytes (valid:
  // a multiple of 4, but not of 16).
  spec.kv_row_stride = spec.kv_format == KvFormat::kFp8 ? 664 : 580;
  SparseMlaCase c(spec, rng);
  const Params p = c.MakeParams(false);
  for (GpuKernel kernel : Kernels()) {
    std::string why;
    EXPECT_FALSE(kernels::sparse_mla::gpu::GpuSupports(kernel, p, &why)) << Name(kernel);
    EXPECT_NE(why.find("kv:"), std::string::npos) << why;
  }
  // Dispatch answers UNIMPLEMENTED naming every GPU refusal rather than failing later.
  kernels::ExecContext ctx;
  ctx.backend = GpuBackend();
  const absl::Status s = kernels::sparse_mla::Run(p, ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
}

INSTANTIATE_TEST_SUITE_P(Formats, SparseMlaGpuKv, ::testing::Values(kBf16, kFp8),
                         [](const auto& info) { return KvFormatName(info.param); });

#else  // no GPU backend in this build

TEST(SparseMlaGpu, NeedsAGpuBuild) { GTEST_SKIP() << "built without a GPU backend"; }

#endif

}  // namespace
}  // namespace attnd::testing
