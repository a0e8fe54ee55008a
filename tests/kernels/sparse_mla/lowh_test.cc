// The low-head sparse MLA kernel (cuda_mma_lowh, H <= 32) where its design shows: a CTA stacks
// 64 / Hs neighbouring tokens and gathers the union of their selections once, so these cases
// make neighbours share rows (the same slots, permuted, partly, rows repeated inside a token
// and across tokens, a causal kpool4 selection), with H 8 / 16 / 32 and odd H, d_qk 512 and
// 576, T not a multiple of the tokens per CTA, K tails, masked and out-of-range indices,
// topk_length, CSR and every split count, in both precisions, against the fp64 reference with NaN
// guard rows around the device KV. Plus dispatch choosing it and its refusals. Skipped without a
// CUDA build and device.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/sparse_mla/reference.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "tests/harness/harness.h"
#include "tests/kernels/sparse_mla/case.h"

#if defined(ATTND_GPU_CUDA)
#include "kernels/common/gpu/runtime.h"
#include "kernels/sparse_mla/gpu/launch.h"
#endif

namespace attnd::testing {
namespace {

#if defined(ATTND_GPU_CUDA)

using kernels::sparse_mla::ComputeReference;
using kernels::sparse_mla::Params;
using kernels::sparse_mla::Reference;

// Runs the low-head kernel with exactly `splits` splits on device mirrors of `p`. The device KV
// carries the case's NaN guard rows, so a read of index -2, -1, S or S+1 poisons the output.
absl::Status RunLowh(const Params& p, int splits) {
  return RunWithSplitsOnGpu(
      [](const Params& d, int s, void* workspace, gpu::Stream stream) {
        return kernels::sparse_mla::gpu::LaunchSparseMlaMmaLowh(d, s, workspace, stream);
      },
      p, splits);
}

enum class Sharing { kSame, kPermuted, kPartial, kRepeats };

const char* SharingName(Sharing s) {
  switch (s) {
    case Sharing::kSame: return "same";
    case Sharing::kPermuted: return "permuted";
    case Sharing::kPartial: return "partial";
    default: return "repeats";
  }
}

// Slots where each group of 4 consecutive tokens derives its rows from one base row (K slots,
// masked_fraction of them invalid): identical, shuffled, half replaced by fresh rows, or with
// rows repeated inside the token and a few hot rows shared by every token.
std::vector<std::vector<int32_t>> GroupedSlots(const SparseMlaSpec& spec, Sharing sharing,
                                               std::mt19937_64& rng) {
  std::vector<std::vector<int32_t>> fresh = RandomSlots(spec, rng);  // per-token random rows
  SparseMlaSpec base_spec = spec;
  base_spec.t = (spec.t + 3) / 4;
  const std::vector<std::vector<int32_t>> base = RandomSlots(base_spec, rng);
  std::vector<std::vector<int32_t>> slots(spec.t);
  std::uniform_int_distribution<int64_t> pos(0, spec.k - 1);
  std::bernoulli_distribution half(0.5);
  for (int64_t t = 0; t < spec.t; ++t) {
    std::vector<int32_t> row = base[t / 4];
    switch (sharing) {
      case Sharing::kSame: break;
      case Sharing::kPermuted: std::shuffle(row.begin(), row.end(), rng); break;
      case Sharing::kPartial:
        for (int64_t i = 0; i < spec.k; ++i) {
          if (half(rng)) row[i] = fresh[t][i];
        }
        break;
      case Sharing::kRepeats:
        for (int64_t i = 0; i < spec.k; ++i) {
          if (i % 7 == 3) row[i] = row[pos(rng)];     // a repeat inside the token
          if (i % 11 == 5) row[i] = 5 + 3 * (i % 2);  // hot rows 5 and 8, every token
          if (i % 13 == 0) row[i] = fresh[t][i];      // unshared
        }
        break;
    }
    slots[t] = row;
  }
  return slots;
}

// (H, d_qk, T, sharing): T chosen so the last CTA is partial (tokens per CTA: 8 at H <= 8, 4
// at H <= 16, 2 at H <= 32).
class SparseMlaLowh
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, Sharing>> {};

TEST_P(SparseMlaLowh, EverySplitCountMatchesReference) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  Sharing sharing;
  std::tie(spec.h, spec.d_qk, spec.t, sharing) = GetParam();
  spec.s = 600;
  spec.k = 150;  // 64-slot blocks 2 + a tail (d512); 48-slot blocks 3 + a tail (d576)
  spec.masked_fraction = 0.1;
  std::vector<int32_t> lengths(spec.t);
  std::uniform_int_distribution<int32_t> len(-2, static_cast<int32_t>(spec.k) + 2);
  for (auto& l : lengths) l = len(rng);
  lengths[0] = static_cast<int32_t>(spec.k);
  SparseMlaCase c(spec, rng, GroupedSlots(spec, sharing, rng), lengths);
  for (bool csr : {false, true}) {
    Params p = c.MakeParams(csr);
    std::string why;
    ASSERT_TRUE(kernels::sparse_mla::gpu::GpuSupports(kernels::sparse_mla::gpu::GpuKernel::kMmaLowH,
                                                      p, &why))
        << why;
    const Reference ref = ComputeReference(p);
    for (const auto& [precision, splits] : PrecisionsAndSplits({1, 2, 3, 7})) {
      p.precision = precision;
      const std::string what = std::string(csr ? "csr" : "table") + " splits " +
                               std::to_string(splits) + " " + SharingName(sharing);
      for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
      const absl::Status s = RunLowh(p, splits);
      ASSERT_TRUE(s.ok()) << what << ": " << s;
      ExpectOutputs(c, p, ref, what);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SparseMlaLowh,
                         ::testing::Values(std::make_tuple(16, 512, 7, Sharing::kSame),
                                           std::make_tuple(16, 512, 9, Sharing::kPermuted),
                                           std::make_tuple(16, 576, 7, Sharing::kPartial),
                                           std::make_tuple(16, 576, 6, Sharing::kRepeats),
                                           std::make_tuple(8, 512, 11, Sharing::kRepeats),
                                           std::make_tuple(8, 576, 13, Sharing::kSame),
                                           std::make_tuple(32, 512, 5, Sharing::kPartial),
                                           std::make_tuple(32, 576, 5, Sharing::kSame),
                                           std::make_tuple(5, 512, 10, Sharing::kPermuted),
                                           std::make_tuple(20, 576, 3, Sharing::kRepeats),
                                           std::make_tuple(12, 512, 1, Sharing::kSame)),
                         [](const auto& info) {
                           return "H" + std::to_string(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param)) + "_T" +
                                  std::to_string(std::get<2>(info.param)) + "_" +
                                  SharingName(std::get<3>(info.param));
                         });

// The benchmark's causal kpool4 selection (bench/gpu/sparse_mla.cc) at a small scale: pools of
// 4 positions share up to `shared` slots drawn from the positions before the pool, plus each
// query's causal tail; fixed-width CSR rows padded with -1. H16 stacks exactly one pool per CTA.
TEST(SparseMlaLowhGpu, CausalKpool4Tail) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng = MakeRng();
  for (int64_t h : {16, 8, 32}) {
    SCOPED_TRACE("H " + std::to_string(h));
    SparseMlaSpec spec;
    spec.h = h;
    spec.d_qk = 512;
    spec.t = 22;
    const int64_t prefix = 300, shared = 200;
    spec.s = prefix + spec.t;
    spec.k = shared + 3;
    std::vector<std::vector<int32_t>> slots(spec.t, std::vector<int32_t>(spec.k, -1));
    for (int64_t t = 0; t < spec.t; t += 4) {
      const int64_t pos = prefix + t, pool = pos / 4 * 4;
      std::vector<int32_t> cand(pool + 1);
      std::iota(cand.begin(), cand.end(), 0);
      std::shuffle(cand.begin(), cand.end(), rng);
      cand.resize(std::min<int64_t>(shared, pool + 1));
      std::sort(cand.begin(), cand.end());
      for (int64_t q = t; q < std::min(t + 4, spec.t); ++q) {
        std::copy(cand.begin(), cand.end(), slots[q].begin());
        const int64_t p = prefix + q;
        for (int64_t x = pool + 1, i = static_cast<int64_t>(cand.size()); x <= p; ++x, ++i) {
          slots[q][i] = static_cast<int32_t>(x);
        }
      }
    }
    spec.masked_fraction = 0.0;
    SparseMlaCase c(spec, rng, slots, {});
    Params p = c.MakeParams(/*csr=*/true);
    const Reference ref = ComputeReference(p);
    for (const auto& [precision, splits] : PrecisionsAndSplits({1, 3})) {
      p.precision = precision;
      for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
      const absl::Status s = RunLowh(p, splits);
      ASSERT_TRUE(s.ok()) << s;
      ExpectOutputs(c, p, ref, "splits " + std::to_string(splits));
    }
  }
}

// A K = 2051 tail with shared rows, through dispatch: cuda_mma_lowh is listed after cuda_mma
// (slower on uniform selections); dispatch picks cuda_mma_auto, which chooses between them on
// the device (auto_test.cc checks its choice); the result still matches.
TEST(SparseMlaLowhGpu, DispatchPicksCudaMmaAutoAndTailK2051Matches) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.h = 16;
  spec.d_qk = 512;
  spec.t = 6;
  spec.s = 5000;
  spec.k = 2051;
  spec.masked_fraction = 0.05;
  SparseMlaCase c(spec, rng, GroupedSlots(spec, Sharing::kPartial, rng), {});
  Params p = c.MakeParams(/*csr=*/false);
  const Reference ref = ComputeReference(p);
  for (const kernels::Precision precision : kPrecisions) {
    p.precision = precision;
    for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
    std::string chosen;
    kernels::Impl<Params> via_dispatch(
        "dispatch", GpuBackend(), nullptr,
        [&chosen](const Params& d, const kernels::ExecContext& ctx) {
          return kernels::sparse_mla::Run(d, ctx, &chosen);
        },
        [](const Params& hp) {
          int64_t most = 0;
          for (const auto& impl : kernels::sparse_mla::Implementations()) {
            if (impl.workspace) most = std::max(most, impl.workspace(hp));
          }
          return most;
        });
    const absl::Status s = RunOnGpu(via_dispatch, p);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(chosen, "cuda_mma_auto");
    ExpectOutputs(c, p, ref, "dispatch");
  }
}

TEST(SparseMlaLowhGpu, RefusesMoreThan32HeadsAndTheFp8Cache) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.h = 64;
  SparseMlaCase c(spec, rng);
  std::string why;
  EXPECT_FALSE(kernels::sparse_mla::gpu::GpuSupports(kernels::sparse_mla::gpu::GpuKernel::kMmaLowH,
                                                     c.MakeParams(false), &why));
  EXPECT_NE(why.find("q: dim 1 is 64"), std::string::npos) << why;

  spec.h = 16;
  spec.d_qk = 576;
  SparseMlaCase f(spec, rng);
  Params p = f.MakeParams(false);
  HostTensor fp8 = HostTensor::Dense(DType::kU8, {spec.s, kernels::sparse_mla::kFp8RowBytes});
  p.kv = fp8.tensor();
  ASSERT_TRUE(kernels::sparse_mla::Validate(p).ok()) << kernels::sparse_mla::Validate(p);
  why.clear();
  EXPECT_FALSE(kernels::sparse_mla::gpu::GpuSupports(kernels::sparse_mla::gpu::GpuKernel::kMmaLowH,
                                                     p, &why));
  EXPECT_NE(why.find("kv:"), std::string::npos) << why;
}

#else  // no CUDA backend in this build

TEST(SparseMlaLowhGpu, NeedsACudaBuild) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif

}  // namespace
}  // namespace attnd::testing
