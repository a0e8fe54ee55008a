// The Hopper wgmma sparse MLA kernel (cuda_wgmma): its PTX layer's descriptor layouts against
// an fp64 matmul, and the kernel with forced split counts against the fp64 reference at
// H 64 / 128 x d_qk 512 / 576 (tails, masked and out-of-range indices, empty rows, topk_length,
// CSR, strided views, duplicates, lse absent, a KV pool past 2^31 elements), with NaN guard rows
// around the device KV; the FP8 cache at H 64 / 128 (T 1..8, the same edge cases); every case in
// both precisions (FAST: the bf16-P instances, HIGH: hi + lo). Skipped
// unless the build is CUDA and the device is compute capability 9.0.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
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

#if defined(ATTND_GPU_CUDA)
#include "kernels/common/gpu/runtime.h"
#include "kernels/sparse_mla/gpu/launch.h"
#include "tests/kernels/sparse_mla/wgmma_layout.h"
#endif

namespace attnd::testing {
namespace {

#if defined(ATTND_GPU_CUDA)

using kernels::DType;
using kernels::sparse_mla::ComputeReference;
using kernels::sparse_mla::Params;
using kernels::sparse_mla::Reference;
using kernels::sparse_mla::gpu::GpuKernel;

// Whether the device can run the kernel at all (compute capability 9.0).
bool HaveSm90() {
  if (!GpuAvailable()) return false;
  std::mt19937_64 rng(1);
  SparseMlaSpec spec;
  spec.h = 64;
  SparseMlaCase c(spec, rng);
  std::string why;
  return kernels::sparse_mla::gpu::GpuSupports(GpuKernel::kWgmma, c.MakeParams(false), &why);
}

std::vector<uint16_t> RandomBf16(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = kernels::FloatToBf16(normal(rng));
  return v;
}

double Bf(uint16_t x) { return static_cast<double>(kernels::Bf16ToFloat(x)); }

TEST(SparseMlaWgmma, PtxLayoutsMatchAMatmul) {
  if (!HaveSm90()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  std::mt19937_64 rng = MakeRng();
  constexpr int kRows = 64, kK = 576, kV = 512;
  const std::vector<uint16_t> a = RandomBf16(kRows * kK, rng), b = RandomBf16(kRows * kK, rng),
                              p = RandomBf16(kRows * kRows, rng), v = RandomBf16(kRows * kV, rng);
  std::vector<float> s(kRows * kRows, std::nanf("")), o(kRows * kV, std::nanf(""));
  ASSERT_EQ(RunWgmmaLayoutCheck(a.data(), b.data(), p.data(), v.data(), s.data(), o.data()), 0);
  // f32 accumulation of bf16 products: |err| <= 1e-4 · Σ|a·b| (a misplaced element costs O(1)).
  int bad = 0;
  for (int i = 0; i < kRows; ++i) {
    for (int j = 0; j < kRows; ++j) {
      double ref = 0, mag = 0;
      for (int k = 0; k < kK; ++k) {
        ref += Bf(a[i * kK + k]) * Bf(b[j * kK + k]);
        mag += std::fabs(Bf(a[i * kK + k]) * Bf(b[j * kK + k]));
      }
      if (!(std::fabs(s[i * kRows + j] - ref) <= 1e-4 * mag) && bad++ < 5) {
        ADD_FAILURE() << "s[" << i << "][" << j << "] = " << s[i * kRows + j] << ", want " << ref;
      }
    }
    for (int j = 0; j < kV; ++j) {
      double ref = 0, mag = 0;
      for (int k = 0; k < kRows; ++k) {
        ref += Bf(p[i * kRows + k]) * Bf(v[k * kV + j]);
        mag += std::fabs(Bf(p[i * kRows + k]) * Bf(v[k * kV + j]));
      }
      if (!(std::fabs(o[i * kV + j] - ref) <= 1e-4 * mag) && bad++ < 5) {
        ADD_FAILURE() << "o[" << i << "][" << j << "] (" << (j < 256 ? "RS" : "SS")
                      << ") = " << o[i * kV + j] << ", want " << ref;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// Runs the wgmma kernel (`kernel`: kWgmma or the ping-pong kWgmmaPp) with exactly `splits`
// splits on device mirrors of `p`; the device KV carries the case's NaN guard rows on both sides
// (a read of index -2, -1, S or S+1 poisons the output).
absl::Status RunWgmma(const Params& p, int splits, GpuKernel kernel = GpuKernel::kWgmma) {
  return RunWithSplitsOnGpu(
      [kernel](const Params& d, int s, void* workspace, gpu::Stream stream) {
        return kernel == GpuKernel::kWgmmaPp
                   ? kernels::sparse_mla::gpu::LaunchSparseMlaWgmmaPp(d, s, workspace, stream)
                   : kernels::sparse_mla::gpu::LaunchSparseMlaWgmma(d, s, workspace, stream);
      },
      p, splits);
}

// Every split count, both precisions and both selection forms of `c` against the reference,
// on kWgmma and, where it runs (FAST, bf16 cache), on kWgmmaPp; rows listed in `empty_rows`
// must come out as +0.0 with lse -inf.
void ExpectCase(SparseMlaCase& c, std::initializer_list<int> split_counts,
                const std::vector<int64_t>& empty_rows) {
  for (bool csr : {false, true}) {
    Params p = c.MakeParams(csr);
    ASSERT_TRUE(kernels::sparse_mla::Validate(p).ok());
    std::string why;
    ASSERT_TRUE(kernels::sparse_mla::gpu::GpuSupports(GpuKernel::kWgmma, p, &why)) << why;
    const Reference ref = ComputeReference(p);
    for (const auto& [precision, splits] : PrecisionsAndSplits(split_counts)) {
      p.precision = precision;
      for (const GpuKernel kernel : {GpuKernel::kWgmma, GpuKernel::kWgmmaPp}) {
        const bool pp = kernel == GpuKernel::kWgmmaPp;
        if (pp) {
          const bool runs = kernels::sparse_mla::gpu::GpuSupports(kernel, p, &why);
          // The ping-pong kernel takes exactly FAST over the bf16 cache.
          ASSERT_EQ(runs,
                    precision == kernels::Precision::kFast && c.spec().kv_format == KvFormat::kBf16)
              << why;
          if (!runs) continue;
        }
        const std::string what = std::string(pp ? "wgmma_pp " : "wgmma ") +
                                 (csr ? "csr" : "table") + " splits " + std::to_string(splits);
        for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
        const absl::Status s = RunWgmma(p, splits, kernel);
        ASSERT_TRUE(s.ok()) << what << ": " << s;
        ExpectOutputs(c, p, ref, what);
        for (int64_t t : empty_rows) {
          for (int64_t h = 0; h < c.spec().h; ++h) {
            if (p.lse.present()) {
              EXPECT_EQ(c.lse().At({t, h}), -std::numeric_limits<double>::infinity()) << what;
            }
            EXPECT_EQ(c.out().data<uint16_t>()[c.out().Offset({t, h, 0})], 0u) << what;
          }
        }
      }
    }
  }
}

// Cases both suites below run; `spec` carries H, d_qk and the KV format.
void TailK2051WithMaskedSlots(SparseMlaSpec spec) {
  std::mt19937_64 rng = MakeRng();
  spec.t = 2;
  spec.s = 32768;
  spec.k = 2051;
  spec.masked_fraction = 0.1;
  SparseMlaCase c(spec, rng);
  ExpectCase(c, {1, 3}, {});
}

void LengthsEmptyRowsAndEverySplitCount(SparseMlaSpec spec) {
  std::mt19937_64 rng = MakeRng();
  spec.t = 5;
  spec.s = 3000;
  spec.k = 333;  // 6 blocks of 64, the last one partial
  spec.masked_fraction = 0.3;
  std::vector<std::vector<int32_t>> slots = RandomSlots(spec, rng);
  for (auto& x : slots[4]) x = -1;  // every slot masked
  // Rows: full, a 65-slot prefix, empty, one that ends inside the first block, all masked.
  SparseMlaCase c(spec, rng, slots, {333, 65, 0, 17, 333});
  ExpectCase(c, {1, 2, 3, 6, 7, 32}, {2, 4});
}

// `kv_row_stride`: a cache row with other data after it (elements for bf16, bytes for FP8).
void StridedViewsDuplicatesAndNoLse(SparseMlaSpec spec, int64_t kv_row_stride) {
  std::mt19937_64 rng = MakeRng();
  spec.t = 3;
  spec.s = 200;
  spec.k = 150;
  spec.kv_row_stride = kv_row_stride;
  spec.q_pad = 40;
  spec.indices_row_pad = 5;
  spec.with_lse = false;
  std::vector<std::vector<int32_t>> slots = RandomSlots(spec, rng);
  std::uniform_int_distribution<int32_t> few(0, 3);
  for (auto& x : slots[1]) x = 5 + 7 * few(rng);  // a few rows repeated many times
  SparseMlaCase c(spec, rng, slots, {});
  ExpectCase(c, {1, 2}, {});
}

// (H, d_qk)
class SparseMlaWgmmaShapes : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {
 protected:
  SparseMlaSpec Spec() const {
    SparseMlaSpec spec;
    std::tie(spec.h, spec.d_qk) = GetParam();
    return spec;
  }
};

TEST_P(SparseMlaWgmmaShapes, TailK2051WithMaskedSlots) {
  if (!HaveSm90()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  TailK2051WithMaskedSlots(Spec());
}

TEST_P(SparseMlaWgmmaShapes, OneBlockManyTokens) {
  if (!HaveSm90()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  for (int64_t t : {1, 2, 3, 5}) {
    SCOPED_TRACE("T " + std::to_string(t));
    std::mt19937_64 rng = MakeRng();
    SparseMlaSpec spec = Spec();
    spec.t = t;
    spec.s = 3000;
    spec.k = 64;
    spec.masked_fraction = 0.2;
    SparseMlaCase c(spec, rng);
    ExpectCase(c, {1, 2}, {});
  }
}

TEST_P(SparseMlaWgmmaShapes, LengthsEmptyRowsAndEverySplitCount) {
  if (!HaveSm90()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  LengthsEmptyRowsAndEverySplitCount(Spec());
}

TEST_P(SparseMlaWgmmaShapes, StridedViewsDuplicatesAndNoLse) {
  if (!HaveSm90()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  StridedViewsDuplicatesAndNoLse(Spec(), Spec().d_qk + 80);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SparseMlaWgmmaShapes,
                         ::testing::Values(std::make_tuple(64, 512), std::make_tuple(64, 576),
                                           std::make_tuple(128, 512), std::make_tuple(128, 576)),
                         [](const auto& info) {
                           return "H" + std::to_string(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The FP8 cache (power-of-two scales: the reference decodes exactly what the kernel computes,
// so the bf16 bounds hold unchanged) at H 64 (one CTA per token and split) and 128 (the kernel
// runs the token's two head groups as a CTA pair).
class SparseMlaWgmmaFp8 : public ::testing::TestWithParam<int64_t> {
 protected:
  SparseMlaSpec Spec() const {
    SparseMlaSpec spec;
    spec.h = GetParam();
    spec.kv_format = KvFormat::kFp8;
    return spec;
  }
};

TEST_P(SparseMlaWgmmaFp8, TailK2051WithMaskedSlots) {
  if (!HaveSm90()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  TailK2051WithMaskedSlots(Spec());
}

TEST_P(SparseMlaWgmmaFp8, TokensOneToEightWithLengths) {
  if (!HaveSm90()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  for (int64_t t = 1; t <= 8; ++t) {
    SCOPED_TRACE("T " + std::to_string(t));
    std::mt19937_64 rng = MakeRng();
    SparseMlaSpec spec = Spec();
    spec.t = t;
    spec.s = 3000;
    spec.k = 200;
    spec.masked_fraction = 0.2;
    spec.with_topk_length = true;
    SparseMlaCase c(spec, rng);
    ExpectCase(c, {1, 2}, {});
  }
}

TEST_P(SparseMlaWgmmaFp8, LengthsEmptyRowsAndEverySplitCount) {
  if (!HaveSm90()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  LengthsEmptyRowsAndEverySplitCount(Spec());
}

TEST_P(SparseMlaWgmmaFp8, StridedViewsDuplicatesAndNoLse) {
  if (!HaveSm90()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  StridedViewsDuplicatesAndNoLse(Spec(), 720);  // bytes, a 16-byte multiple
}

INSTANTIATE_TEST_SUITE_P(Heads, SparseMlaWgmmaFp8, ::testing::Values(64, 128),
                         [](const auto& info) { return "H" + std::to_string(info.param); });

// A device KV pool of 4.1M rows x 576 (4.7 GB: row offsets past 2^31 elements) filled with NaN
// except the selected rows; a row address computed in 32 bits reads NaN (or faults).
TEST(SparseMlaWgmma, KvPoolPast2To31Elements) {
  if (!HaveSm90()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  constexpr int64_t kDqk = 576, kRows = 4'100'000;
  std::mt19937_64 rng = MakeRng();
  const int64_t t = 3, h = 128, k = 200;
  HostTensor indices = HostTensor::Dense(DType::kI32, {t, k});
  std::uniform_int_distribution<int32_t> high(3'728'000, kRows - 1), low(0, 1000);
  std::vector<int32_t> row_ids;  // distinct rows in first-use order
  for (int64_t i = 0; i < t * k; ++i) {
    const int32_t row = i % 5 == 0 ? low(rng) : high(rng);
    indices.data<int32_t>()[i] = row;
    if (std::find(row_ids.begin(), row_ids.end(), row) == row_ids.end()) row_ids.push_back(row);
  }
  const int64_t n = static_cast<int64_t>(row_ids.size());
  HostTensor rows = HostTensor::Dense(DType::kBF16, {n, kDqk});  // also the reference's KV
  FillNormal(rows, rng, 1.0);
  HostTensor compact_idx = HostTensor::Dense(DType::kI32, {t, k});
  for (int64_t i = 0; i < t * k; ++i) {
    const auto it = std::find(row_ids.begin(), row_ids.end(), indices.data<int32_t>()[i]);
    compact_idx.data<int32_t>()[i] = static_cast<int32_t>(it - row_ids.begin());
  }
  HostTensor q = HostTensor::Dense(DType::kBF16, {t, h, kDqk});
  FillNormal(q, rng, 1.0);
  HostTensor out = HostTensor::Dense(DType::kBF16, {t, h, 512});
  HostTensor lse = HostTensor::Dense(DType::kF32, {t, h});
  Params ref_params;
  ref_params.q = q.tensor();
  ref_params.kv = rows.tensor();
  ref_params.indices = compact_idx.tensor();
  ref_params.sm_scale = 0.0417f;
  ref_params.out = out.tensor();
  ref_params.lse = lse.tensor();
  const Reference ref = ComputeReference(ref_params);

  DeviceMirror mirror;  // Allocate fills with 0xff: every unselected row is NaN
  void* pool = nullptr;
  ASSERT_TRUE(mirror.Allocate(kRows * kDqk * 2, &pool).ok()) << "cannot allocate the pool";
  const auto stream = static_cast<gpu::Stream>(mirror.stream());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(gpu::MemcpyH2DAsync(static_cast<char*>(pool) + int64_t{row_ids[i]} * kDqk * 2,
                                  rows.data<kernels::bf16_t>() + i * kDqk, kDqk * 2, stream),
              gpu::kSuccess);
  }
  ASSERT_TRUE(mirror.Synchronize().ok());
  Params host = ref_params;
  host.kv = kernels::Tensor{};  // not mirrored: the pool is already on the device
  host.indices = indices.tensor();
  for (const auto& [precision, split_count] : PrecisionsAndSplits({1, 3})) {
    for (const bool pp : {false, true}) {  // kWgmma, and kWgmmaPp (FAST only)
      if (pp && precision != kernels::Precision::kFast) continue;
      const int splits = split_count;  // captured below (a structured binding cannot be)
      host.precision = precision;
      SCOPED_TRACE("splits " + std::to_string(splits) + " " + kernels::PrecisionName(precision) +
                   (pp ? " wgmma_pp" : " wgmma"));
      PoisonNaN(out);
      PoisonNaN(lse);
      kernels::Impl<Params> impl(
          "cuda_wgmma forced", GpuBackend(), nullptr,
          [splits, pool, pp](const Params& d, const kernels::ExecContext& ctx) -> absl::Status {
            Params call = d;
            call.kv = kernels::MakeTensor(pool, DType::kBF16, {kRows, kDqk});
            const auto stream = static_cast<gpu::Stream>(ctx.stream);
            GPU_RETURN_IF_ERROR(pp ? kernels::sparse_mla::gpu::LaunchSparseMlaWgmmaPp(
                                         call, splits, ctx.workspace, stream)
                                   : kernels::sparse_mla::gpu::LaunchSparseMlaWgmma(
                                         call, splits, ctx.workspace, stream));
            return absl::OkStatus();
          },
          [splits](const Params& hp) {
            return kernels::sparse_mla::gpu::SplitWorkspaceBytes(hp, splits);
          });
      const absl::Status s = RunOnGpu(impl, host);
      ASSERT_TRUE(s.ok()) << s;
      ExpectAttentionOut(ToDoubles(out), ref.out, ref.out_abs, precision, kOutTol, "out");
      ExpectClose(ToDoubles(lse), ref.lse, kLseTol, "lse");
    }
  }
}

TEST(SparseMlaWgmma, RefusesOtherHeadCountsWithAReason) {
  if (!HaveSm90()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.h = 96;
  SparseMlaCase c(spec, rng);
  std::string why;
  EXPECT_FALSE(kernels::sparse_mla::gpu::GpuSupports(GpuKernel::kWgmma, c.MakeParams(false), &why));
  EXPECT_NE(why.find("multiple of 64"), std::string::npos) << why;
}

#else  // not a CUDA build

TEST(SparseMlaWgmma, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace attnd::testing
