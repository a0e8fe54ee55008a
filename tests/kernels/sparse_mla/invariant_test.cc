// Sparse MLA's batch-invariant plan (Params::batch_invariant; docs/KERNELS.md "Batch
// invariance"): the host plan alone (a token's split ranges depend on its own length only), and
// every implementation that accepts the option run on one token alone and inside different
// batches (sizes, positions, neighbours of very different lengths), its out and lse compared
// bitwise, plus the invariant path against the fp64 reference. GPU implementations run where a
// GPU is present; the CPU one always.
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/sparse_mla/invariant_plan.h"
#include "kernels/sparse_mla/reference.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "tests/harness/harness.h"
#include "tests/kernels/sparse_mla/case.h"

namespace attnd::testing {
namespace {

namespace sm = kernels::sparse_mla;
using kernels::Precision;
using kernels::Tensor;

// ---- The plan (host, pure C++) ----

TEST(SparseMlaInvariantPlan, TokenRangesDependOnItsOwnLengthOnly) {
  for (const int64_t len :
       {0, 1, 63, 64, 65, 1023, 1024, 1025, 2048, 2051, 4096, 32768, 32769, 100000}) {
    const int64_t own = sm::InvariantSplitsOfRow(len);
    EXPECT_LE(own, sm::kInvariantMaxSplits) << len;
    // Every table at least as wide as the row launches enough splits for it, and the token's
    // ranges tile [0, len) in order whatever the width (the batch's K never enters a range).
    for (const int64_t width : {len, len + 1, len + 64, 2 * len + 5, int64_t{200000}}) {
      const int grid = sm::InvariantGridSplitsFor(/*csr=*/false, width);
      ASSERT_GE(grid, own) << "len " << len << " width " << width;
      ASSERT_LE(grid, sm::kInvariantMaxSplits);
      int64_t next = 0;
      for (int split = 0; split < grid; ++split) {
        const sm::SlotSpan s = sm::InvariantSplitSpan(len, split);
        ASSERT_EQ(s.begin, next) << "len " << len << " split " << split;
        ASSERT_LE(s.begin, s.end);
        if (s.end > s.begin) {
          ASSERT_EQ(s.begin % sm::kInvariantBlockSlots, 0);
        }
        EXPECT_EQ(s.end > s.begin, split < own) << "len " << len << " split " << split;
        next = s.end;
      }
      EXPECT_EQ(next, len);
    }
  }
  // Fixed 1024-slot splits up to 32 of them, then wider ones.
  EXPECT_EQ(sm::InvariantSplitsOfRow(2048), 2);
  EXPECT_EQ(sm::InvariantSplitSpan(2048, 1).begin, 1024);
  EXPECT_EQ(sm::InvariantSplitsOfRow(32768), 32);
  EXPECT_EQ(sm::InvariantSplitsOfRow(32769), 31);  // 513 blocks, 17 a split
  EXPECT_EQ(sm::InvariantGridSplitsFor(/*csr=*/false, 1024), 1);
  EXPECT_EQ(sm::InvariantGridSplitsFor(/*csr=*/false, 1025), 2);
  EXPECT_EQ(sm::InvariantGridSplitsFor(/*csr=*/true, 1 << 20), 1);  // CSR: one split a token
}

// ---- Every implementation, alone and in batches ----

// Rows [t0, t0 + count) of a T-row tensor (absent stays absent).
Tensor SliceRows(Tensor t, int64_t t0, int64_t count) {
  if (!t.present()) return t;
  t.data = static_cast<char*>(t.data) + t0 * t.stride(0) * kernels::DTypeSize(t.dtype);
  t.shape[0] = count;
  return t;
}

sm::Params SliceTokens(const sm::Params& p, int64_t t0, int64_t count) {
  sm::Params s = p;
  s.q = SliceRows(p.q, t0, count);
  s.indices = SliceRows(p.indices, t0, count);
  s.topk_length = SliceRows(p.topk_length, t0, count);
  s.out = SliceRows(p.out, t0, count);
  s.lse = SliceRows(p.lse, t0, count);
  return s;
}

// Token t's out (all heads, 512 bf16 each) and lse bytes from the full-batch views of p.
std::vector<uint8_t> TokenBytes(const sm::Params& p, int64_t t) {
  std::vector<uint8_t> bytes;
  const int64_t heads = p.q.dim(1);
  for (int64_t h = 0; h < heads; ++h) {
    const auto* o = p.out.ptr<const uint8_t>() + 2 * (t * p.out.stride(0) + h * p.out.stride(1));
    bytes.insert(bytes.end(), o, o + 2 * sm::kDimV);
    const auto* l = p.lse.ptr<const uint8_t>() + 4 * (t * p.lse.stride(0) + h * p.lse.stride(1));
    bytes.insert(bytes.end(), l, l + 4);
  }
  return bytes;
}

absl::Status RunImpl(const kernels::Impl<sm::Params>& impl, const sm::Params& p) {
  if (impl.backend == kernels::Backend::kCpu) {
    kernels::ExecContext ctx;
    ctx.pool = TestPool();
    return impl.run(p, ctx);
  }
  return RunOnGpu(impl, p);
}

// (H, d_qk, KV format, K, tokens, precision).
using InvariantParam = std::tuple<int64_t, int64_t, KvFormat, int64_t, int64_t, Precision>;
class SparseMlaBatchInvariant : public ::testing::TestWithParam<InvariantParam> {};

TEST_P(SparseMlaBatchInvariant, TokenAloneEqualsTokenInEveryBatch) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  Precision precision;
  std::tie(spec.h, spec.d_qk, spec.kv_format, spec.k, spec.t, precision) = GetParam();
  spec.s = 5000;
  spec.masked_fraction = 0.1;
  // Lengths of very different sizes: full, empty, one block, one past a split, tails.
  std::vector<int32_t> lengths;
  const int32_t k = static_cast<int32_t>(spec.k);
  const int32_t pattern[] = {k, 0, 64, 1025, 17, k - 3, 700, 1, 2048, 129};
  for (int64_t i = 0; i < spec.t; ++i) lengths.push_back(std::min(pattern[i % 10], k));
  SparseMlaCase c(spec, rng, RandomSlots(spec, rng), lengths);
  sm::Params full = c.MakeParams(/*csr=*/false);
  full.precision = precision;
  full.batch_invariant = true;
  const int64_t t_count = spec.t;
  const sm::Reference ref = sm::ComputeReference(full);

  // (first token, count) of each batch; every one holds the probe tokens below at another
  // position, with other neighbours and another batch size.
  const std::vector<std::pair<int64_t, int64_t>> batches = {
      {0, t_count}, {1, t_count - 1}, {0, t_count / 2 + 1}, {t_count / 3, 3}};
  const std::vector<int64_t> probes = {t_count / 3, t_count / 3 + 1, t_count / 3 + 2};

  int impls_run = 0;
  for (const auto& impl : sm::Implementations()) {
    const bool on_cpu = impl.backend == kernels::Backend::kCpu;
    if (!on_cpu && (impl.backend != GpuBackend() || !GpuAvailable())) continue;
    std::string why;
    if (impl.supports && !impl.supports(full, &why)) continue;
    SCOPED_TRACE("implementation " + impl.name);
    ++impls_run;
    // Accuracy of the invariant path over the whole batch.
    for (HostTensor* out : c.Outputs()) PoisonNaN(*out);
    ASSERT_TRUE(RunImpl(impl, full).ok());
    ExpectOutputs(c, full, ref, impl.name + " batch_invariant");
    std::vector<std::vector<uint8_t>> in_full;
    for (const int64_t t : probes) in_full.push_back(TokenBytes(full, t));
    // Alone.
    for (size_t i = 0; i < probes.size(); ++i) {
      for (HostTensor* out : c.Outputs()) PoisonNaN(*out);
      const sm::Params alone = SliceTokens(full, probes[i], 1);
      ASSERT_TRUE(impl.supports == nullptr || impl.supports(alone, &why)) << why;
      ASSERT_TRUE(RunImpl(impl, alone).ok());
      EXPECT_EQ(TokenBytes(full, probes[i]), in_full[i])
          << "token " << probes[i] << " alone differs from the full batch";
    }
    // Other batches.
    for (const auto& [t0, count] : batches) {
      for (HostTensor* out : c.Outputs()) PoisonNaN(*out);
      const sm::Params b = SliceTokens(full, t0, count);
      ASSERT_TRUE(impl.supports == nullptr || impl.supports(b, &why)) << why;
      ASSERT_TRUE(RunImpl(impl, b).ok());
      for (size_t i = 0; i < probes.size(); ++i) {
        if (probes[i] < t0 || probes[i] >= t0 + count) continue;
        EXPECT_EQ(TokenBytes(full, probes[i]), in_full[i])
            << "token " << probes[i] << " in batch [" << t0 << ", " << t0 + count << ")";
      }
    }
  }
  EXPECT_GE(impls_run, 1);
}

std::string InvariantName(const ::testing::TestParamInfo<InvariantParam>& info) {
  const auto& [h, d_qk, format, k, t, precision] = info.param;
  return "H" + std::to_string(h) + "D" + std::to_string(d_qk) + KvFormatName(format) + "K" +
         std::to_string(k) + "T" + std::to_string(t) +
         (precision == Precision::kHigh ? "High" : "Fast");
}

// Decode shapes (few tokens, K 2051: three splits, the last a tail) and prefill shapes (more
// tokens, K 1100: two splits), BF16 and FP8 KV, low and full head counts, both precisions.
INSTANTIATE_TEST_SUITE_P(Shapes, SparseMlaBatchInvariant,
                         ::testing::Combine(::testing::Values(int64_t{16}, int64_t{128}),
                                            ::testing::Values(576),
                                            ::testing::Values(KvFormat::kBf16, KvFormat::kFp8),
                                            ::testing::Values(int64_t{2051}),
                                            ::testing::Values(int64_t{6}),
                                            ::testing::Values(Precision::kFast, Precision::kHigh)),
                         InvariantName);
INSTANTIATE_TEST_SUITE_P(PrefillShapes, SparseMlaBatchInvariant,
                         ::testing::Combine(::testing::Values(int64_t{64}),
                                            ::testing::Values(512, 576),
                                            ::testing::Values(KvFormat::kBf16),
                                            ::testing::Values(int64_t{1100}),
                                            ::testing::Values(int64_t{24}),
                                            ::testing::Values(Precision::kFast, Precision::kHigh)),
                         InvariantName);

// The implementations whose result depends on neighbouring tokens refuse the option, naming it.
TEST(SparseMlaBatchInvariantSupports, NeighbourDependentKernelsRefuse) {
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.h = 16;
  spec.t = 8;
  SparseMlaCase c(spec, rng);
  sm::Params p = c.MakeParams(/*csr=*/false);
  for (const auto& impl : sm::Implementations()) {
    if (impl.name.find("lowh") == std::string::npos &&
        impl.name.find("auto") == std::string::npos) {
      continue;
    }
    if (impl.backend != GpuBackend() || !GpuAvailable()) continue;
    std::string why;
    p.batch_invariant = true;
    EXPECT_FALSE(impl.supports(p, &why)) << impl.name;
    EXPECT_NE(why.find("batch_invariant"), std::string::npos) << impl.name << ": " << why;
  }
}

}  // namespace
}  // namespace attnd::testing
