// MLA decode's batch-invariant plan (Params::batch_invariant; docs/KERNELS.md "Batch
// invariance"): the host plan alone (a request's split ranges depend on its own length only),
// and every implementation run on one request alone (its block table as narrow as its own
// pages) and inside different batches, out and lse compared bitwise, plus the invariant path
// against the fp64 reference. GPU implementations run where a GPU is present; the CPU one
// always.
#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/common/math.h"
#include "kernels/mla_decode/invariant_plan.h"
#include "kernels/mla_decode/mla_decode.h"
#include "kernels/mla_decode/reference.h"
#include "tests/harness/harness.h"
#include "tests/kernels/mla_decode/decode_case.h"

namespace attnd::kernels::mla_decode {
namespace {

TEST(MlaDecodeInvariantPlan, RequestRangesDependOnItsOwnLengthOnly) {
  for (const int64_t block_n : {32, 64}) {
    for (const int64_t seqlen : {0, 1, 63, 64, 4095, 4096, 4097, 32768, 524288, 524289, 2000000}) {
      const int64_t own = InvariantSplitsOfRequest(seqlen, block_n);
      EXPECT_LE(own, kInvariantMaxSplits);
      for (const int64_t capacity : {seqlen, seqlen + 64, 4 * seqlen + 640, int64_t{1} << 30}) {
        const int grid = InvariantGridSplitsFor(capacity, block_n);
        ASSERT_GE(grid, own) << seqlen << " " << capacity;
        ASSERT_GE(grid, kInvariantMinSplits);
        ASSERT_LE(grid, kInvariantMaxSplits);
        // Causal MTP rows see a prefix (limit <= seqlen) cut at the same boundaries.
        for (const int64_t limit : {seqlen, seqlen / 2}) {
          int64_t next = 0;
          for (int split = 0; split < grid; ++split) {
            const TileSpan s = InvariantSplitTiles(seqlen, limit, split, block_n);
            ASSERT_EQ(s.begin, next) << seqlen << " split " << split;
            ASSERT_LE(s.begin, s.end);
            if (s.end > s.begin) {
              EXPECT_EQ(s.begin % block_n, 0);
              EXPECT_LT(split, own);
              // The same boundaries as the full row's (a 32- or 64-position tile alike).
              EXPECT_EQ(s.begin, InvariantSplitTiles(seqlen, seqlen, split, block_n).begin);
            }
            next = s.end;
          }
          EXPECT_EQ(next, limit);
        }
      }
    }
  }
  EXPECT_EQ(InvariantSplitsOfRequest(32768, 64), 8);  // 4096 positions a split
  EXPECT_EQ(InvariantGridSplitsFor(64, 64), 2);       // the split path even for a tiny table
}

// Requests [b0, b0 + count) of p, the block table narrowed to the pages they need (a request
// alone carries a table as narrow as its own context, as a frontend would send it).
Params SliceRequests(const Params& p, int64_t b0, int64_t count) {
  auto rows = [&](Tensor t) {
    if (!t.present()) return t;
    t.data = static_cast<char*>(t.data) + b0 * t.stride(0) * DTypeSize(t.dtype);
    t.shape[0] = count;
    return t;
  };
  Params s = p;
  s.q = rows(p.q);
  s.block_table = rows(p.block_table);
  s.cache_seqlens = rows(p.cache_seqlens);
  s.out = rows(p.out);
  s.lse = rows(p.lse);
  int64_t pages = 1;
  for (int64_t b = 0; b < count; ++b) {
    const int64_t len = s.cache_seqlens.ptr<const int32_t>()[b * s.cache_seqlens.stride(0)];
    pages = std::max(pages, CeilDiv(len, p.kv_cache.dim(1)));
  }
  s.block_table.shape[1] = std::min(pages, p.block_table.dim(1));
  return s;
}

// Request b's out and lse bytes (every MTP token and head) from the full-batch views of p.
std::vector<uint8_t> RequestBytes(const Params& p, int64_t b) {
  std::vector<uint8_t> bytes;
  for (int64_t i = 0; i < p.q.dim(1); ++i) {
    for (int64_t h = 0; h < p.q.dim(2); ++h) {
      const auto* o = p.out.ptr<const uint8_t>() +
                      2 * (b * p.out.stride(0) + i * p.out.stride(1) + h * p.out.stride(2));
      bytes.insert(bytes.end(), o, o + 2 * kDv);
      const auto* l = p.lse.ptr<const uint8_t>() +
                      4 * (b * p.lse.stride(0) + i * p.lse.stride(1) + h * p.lse.stride(2));
      bytes.insert(bytes.end(), l, l + 4);
    }
  }
  return bytes;
}

absl::Status RunImpl(const Impl<Params>& impl, const Params& p) {
  if (impl.backend == Backend::kCpu) {
    ExecContext ctx;
    ctx.pool = testing::TestPool();
    return impl.run(p, ctx);
  }
  return testing::RunOnGpu(impl, p);
}

// (H, s_q with causal, FP8 cache, precision).
using InvariantParam = std::tuple<int64_t, int64_t, bool, Precision>;
class MlaDecodeBatchInvariant : public ::testing::TestWithParam<InvariantParam> {};

TEST_P(MlaDecodeBatchInvariant, RequestAloneEqualsRequestInEveryBatch) {
  std::mt19937_64 rng = testing::MakeRng();
  DecodeCase c;
  bool fp8;
  Precision precision;
  std::tie(c.heads, c.s_q, fp8, precision) = GetParam();
  c.causal = c.s_q > 1;
  if (fp8) c.fp8_kv_scale = 1.0f / 32;
  // Very different lengths: past two 4096-position splits, empty, one token, a split boundary.
  c.seqlens = {9000, 0, 1, 4096, 4097, 300, 12345};
  c.invalid_pages = {{0, 3}, {6, 100}};
  DecodeTensors t(c, rng);
  Params full = t.params();
  full.precision = precision;
  full.batch_invariant = true;
  std::vector<double> ref_out, ref_lse, ref_abs;
  Reference(full, &ref_out, &ref_lse, &ref_abs);
  const int64_t batch = static_cast<int64_t>(c.seqlens.size());
  const std::vector<int64_t> probes = {2, 3, 4};
  const std::vector<std::pair<int64_t, int64_t>> batches = {
      {0, batch}, {1, batch - 1}, {2, 3}, {0, 5}, {3, 4}};

  int impls_run = 0;
  for (const auto& impl : Implementations()) {
    const bool on_cpu = impl.backend == Backend::kCpu;
    if (!on_cpu && (impl.backend != testing::GpuBackend() || !testing::GpuAvailable())) continue;
    std::string why;
    if (impl.supports && !impl.supports(full, &why)) continue;
    SCOPED_TRACE("implementation " + impl.name);
    ++impls_run;
    for (testing::HostTensor* out : t.outputs()) testing::PoisonNaN(*out);
    ASSERT_TRUE(RunImpl(impl, full).ok());
    testing::ExpectAttentionOut(testing::ToDoubles(t.out()), ref_out, ref_abs, precision, kOutTol,
                                impl.name + " batch_invariant out");
    testing::ExpectClose(testing::ToDoubles(t.lse()), ref_lse, kLseTol,
                         impl.name + " batch_invariant lse");
    std::vector<std::vector<uint8_t>> in_full;
    for (const int64_t b : probes) in_full.push_back(RequestBytes(full, b));
    for (size_t i = 0; i < probes.size(); ++i) {
      for (testing::HostTensor* out : t.outputs()) testing::PoisonNaN(*out);
      const Params alone = SliceRequests(full, probes[i], 1);
      ASSERT_TRUE(impl.supports == nullptr || impl.supports(alone, &why)) << why;
      ASSERT_TRUE(RunImpl(impl, alone).ok());
      EXPECT_EQ(RequestBytes(full, probes[i]), in_full[i]) << "request " << probes[i] << " alone";
    }
    for (const auto& [b0, count] : batches) {
      for (testing::HostTensor* out : t.outputs()) testing::PoisonNaN(*out);
      const Params b = SliceRequests(full, b0, count);
      ASSERT_TRUE(impl.supports == nullptr || impl.supports(b, &why)) << why;
      ASSERT_TRUE(RunImpl(impl, b).ok());
      for (size_t i = 0; i < probes.size(); ++i) {
        if (probes[i] < b0 || probes[i] >= b0 + count) continue;
        EXPECT_EQ(RequestBytes(full, probes[i]), in_full[i])
            << "request " << probes[i] << " in batch [" << b0 << ", " << b0 + count << ")";
      }
    }
  }
  EXPECT_GE(impls_run, 1);
}

std::string InvariantName(const ::testing::TestParamInfo<InvariantParam>& info) {
  const auto& [h, s_q, fp8, precision] = info.param;
  return "H" + std::to_string(h) + "Sq" + std::to_string(s_q) + (fp8 ? "Fp8" : "Bf16") +
         (precision == Precision::kHigh ? "High" : "Fast");
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaDecodeBatchInvariant,
                         ::testing::Combine(::testing::Values(int64_t{16}, int64_t{128}),
                                            ::testing::Values(int64_t{1}, int64_t{2}),
                                            ::testing::Values(false, true),
                                            ::testing::Values(Precision::kFast, Precision::kHigh)),
                         InvariantName);

}  // namespace
}  // namespace attnd::kernels::mla_decode
