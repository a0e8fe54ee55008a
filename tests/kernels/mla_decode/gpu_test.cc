// mla_decode on the GPU where the GPU is the point: q and out past 2^31 elements with real
// device allocations (about 9 GiB; the grid then also passes 65535 CTAs), and the split-K plan
// with many empty and fully masked splits, also with a workspace too small for the heuristic's
// split count. Skipped without a GPU; every other case runs on the GPU through the harness.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/mla_decode/mla_decode.h"
#include "kernels/mla_decode/reference.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/kernels/mla_decode/decode_case.h"
#if defined(ATTND_GPU_CUDA)
#include "kernels/common/gpu/vendor.h"
#include "kernels/mla_decode/gpu/launch.h"
#include "kernels/mla_decode/schedule_plan.h"
#endif

namespace attnd::kernels::mla_decode {
namespace {

using testing::ExpectClose;
using testing::HostTensor;

// Every GPU implementation that supports p.
std::vector<const Impl<Params>*> GpuImpls(const Params& p) {
  std::vector<const Impl<Params>*> impls;
  for (const auto& impl : Implementations()) {
    std::string why;
    if (impl.backend == testing::GpuBackend() && impl.supports(p, &why)) impls.push_back(&impl);
  }
  return impls;
}

// Uniform bf16 values in [-1.7, 1.7) (variance ~1) over the whole span: a fresh xorshift
// stream, fast enough for billions of elements.
void FillFast(HostTensor& t, uint64_t seed) {
  uint16_t* x = t.data<uint16_t>();
  uint64_t s = seed | 1;
  for (int64_t i = 0; i < t.span_elements(); ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x[i] = FloatToBf16(static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) *
                       (1.7f / (1 << 23)));
  }
}

// "B .. H .. d_qk .. s_q .. [causal]", for traces.
std::string ShapeName(int64_t batch, int64_t heads, int64_t d_qk, int64_t s_q, bool causal) {
  return "B " + std::to_string(batch) + " H " + std::to_string(heads) + " d_qk " +
         std::to_string(d_qk) + " s_q " + std::to_string(s_q) + (causal ? " causal" : "");
}

// A wgmma test's case: the shape, and NaN at every cache position past a request's length.
DecodeCase WgmmaCase(int64_t heads, int64_t d_qk, int64_t s_q, bool causal) {
  DecodeCase c;
  c.heads = heads;
  c.d_qk = d_qk;
  c.s_q = s_q;
  c.causal = causal;
  c.nan_past_length = true;
  return c;
}

// Checks requests [b0, b0 + n) of p (outputs already on the host) against the reference.
void CheckRequests(const Params& p, int64_t b0, int64_t n, const std::string& what) {
  Params sub = p;
  auto slice = [&](Tensor& t) {
    t.data = static_cast<char*>(t.data) + b0 * t.stride(0) * DTypeSize(t.dtype);
    t.shape[0] = n;
  };
  slice(sub.q);
  slice(sub.block_table);
  slice(sub.cache_seqlens);
  slice(sub.out);
  slice(sub.lse);
  std::vector<double> ref_out, ref_lse, ref_abs, out, lse;
  Reference(sub, &ref_out, &ref_lse, &ref_abs);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t i = 0; i < sub.q.dim(1); ++i) {
      for (int64_t h = 0; h < sub.q.dim(2); ++h) {
        const bf16_t* row = sub.out.ptr<const bf16_t>() + b * sub.out.stride(0) +
                            i * sub.out.stride(1) + h * sub.out.stride(2);
        for (int64_t c = 0; c < kDv; ++c) out.push_back(Bf16ToFloat(row[c]));
        lse.push_back(sub.lse.ptr<const float>()[b * sub.lse.stride(0) + i * sub.lse.stride(1) +
                                                 h * sub.lse.stride(2)]);
      }
    }
  }
  testing::ExpectAttentionOut(out, ref_out, ref_abs, p.precision, kOutTol, what + " out");
  ExpectClose(lse, ref_lse, kLseTol, what + " lse");
}

// B = 33000 requests x 128 heads: q (576 columns) and out (512) both pass 2^31 elements from
// request 29128 / 32768 on. Requests share 8 cache pages (reading is all they do).
TEST(MlaDecodeGpu, QueryAndOutputPast2To31Elements) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  constexpr int64_t kBatch = 33000, kHeads = 128, kD = 576, kPage = 64, kPages = 8;
  auto rng = testing::MakeRng();
  HostTensor q = HostTensor::Dense(DType::kBF16, {kBatch, 1, kHeads, kD});
  HostTensor kv = HostTensor::Dense(DType::kBF16, {kPages, kPage, kD});
  HostTensor table = HostTensor::Dense(DType::kI32, {kBatch, 1});
  HostTensor seqlens = HostTensor::Dense(DType::kI32, {kBatch});
  HostTensor out = HostTensor::Dense(DType::kBF16, {kBatch, 1, kHeads, kDv});
  HostTensor lse = HostTensor::Dense(DType::kF32, {kBatch, 1, kHeads});
  FillFast(q, rng());
  FillFast(kv, rng());
  for (int64_t b = 0; b < kBatch; ++b) {
    table.data<int32_t>()[b] = static_cast<int32_t>(rng() % kPages);
    seqlens.data<int32_t>()[b] = static_cast<int32_t>(1 + rng() % kPage);
  }
  table.data<int32_t>()[kBatch - 2] = -1;  // a masked page and an empty request at the end
  seqlens.data<int32_t>()[kBatch - 3] = 0;
  Params p;
  p.q = q.tensor();
  p.kv_cache = kv.tensor();
  p.block_table = table.tensor();
  p.cache_seqlens = seqlens.tensor();
  p.out = out.tensor();
  p.lse = lse.tensor();
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kD)));
  ASSERT_TRUE(Validate(p).ok()) << Validate(p);
  const auto impls = GpuImpls(p);
  EXPECT_GE(impls.size(), 1u);
  for (const Impl<Params>* impl : impls) {
    for (const Precision precision : testing::kPrecisions) {
      SCOPED_TRACE(impl->name + " " + PrecisionName(precision));
      p.precision = precision;
      std::string why;
      if (!impl->supports(p, &why)) continue;  // the FAST-only kernels at HIGH
      testing::PoisonNaN(out);
      testing::PoisonNaN(lse);
      const absl::Status status = testing::RunOnGpu(*impl, p);
      ASSERT_TRUE(status.ok()) << status;
      CheckRequests(p, 0, 4, impl->name + " first requests");
      CheckRequests(p, 29126, 4, impl->name + " q past 2^31");
      CheckRequests(p, kBatch - 6, 6, impl->name + " out past 2^31");
    }
  }
}

// One request, 5000 positions of a 20000-position table with masked pages: the plan splits the
// context many ways (most splits get no tile: they issue no loads and leave lse -inf, so the
// combine must ignore their never-written partial O, which the harness fills with 0xff = NaN).
// Run again with a workspace for only 3 splits: run() must lower the split count, not overflow.
TEST(MlaDecodeGpu, ManySplitsEmptyAndMaskedSplits) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  DecodeCase c;
  c.heads = 16;
  c.s_q = 2;
  c.causal = true;
  c.seqlens = {5000};
  c.max_pages = 20000 / 64;
  for (int64_t j = 0; j < 20; ++j) c.invalid_pages.push_back({0, j});  // first 1280 positions
  c.invalid_pages.push_back({0, 50});
  auto rng = testing::MakeRng();
  DecodeTensors t(c, rng);
  Params p = t.params();
  std::vector<double> ref_out, ref_lse, ref_abs;
  Reference(p, &ref_out, &ref_lse, &ref_abs);
  const auto impls = GpuImpls(p);
  EXPECT_GE(impls.size(), 1u);
  for (const Impl<Params>* impl : impls) {
    SCOPED_TRACE(impl->name);
    ASSERT_TRUE(impl->workspace != nullptr);
    const int64_t full = impl->workspace(p);
    EXPECT_GT(full, 0) << "expected a split plan for one long request";
    const int64_t three_splits = 3 * (1 * 2 * 16) * (kDv + 1) * 4;
    for (const Precision precision : testing::kPrecisions) {
      p.precision = precision;
      std::string why;
      if (!impl->supports(p, &why)) continue;  // the FAST-only kernels at HIGH
      for (const int64_t bytes : {full, three_splits, int64_t{0}}) {
        Impl<Params> sized = *impl;
        sized.workspace = [bytes](const Params&) { return bytes; };
        for (testing::HostTensor* o : t.outputs()) testing::PoisonNaN(*o);
        const absl::Status status = testing::RunOnGpu(sized, p);
        ASSERT_TRUE(status.ok()) << status;
        const std::string what = impl->name + " workspace " + std::to_string(bytes);
        testing::ExpectAttentionOut(testing::ToDoubles(t.out()), ref_out, ref_abs, precision,
                                    kOutTol, what + " out");
        ExpectClose(testing::ToDoubles(t.lse()), ref_lse, kLseTol, what + " lse");
      }
    }
  }
}

// lse as a view of FlashMLA's [B, H, s_q + 2] buffer (docs/CONTRACTS.md "Strided lse") from each
// GPU implementation with its own split plan, three splits (the combine writes lse) and no
// workspace (the kernel does); the poisoned gaps must survive. Request 1 (length 1, causal,
// s_q 2) leaves query 0 with nothing: lse -inf through the strides.
TEST(MlaDecodeGpu, LseInFlashMlaLayoutWithAndWithoutSplits) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  DecodeCase c;
  c.heads = 16;
  c.s_q = 2;
  c.causal = true;
  c.seqlens = {3000, 1};
  c.lse_head_major = true;
  c.lse_pad = 2;
  auto rng = testing::MakeRng();
  DecodeTensors t(c, rng);
  Params p = t.params();
  std::vector<double> ref_out, ref_lse, ref_abs;
  Reference(p, &ref_out, &ref_lse, &ref_abs);
  const auto impls = GpuImpls(p);
  EXPECT_GE(impls.size(), 1u);
  for (const Impl<Params>* impl : impls) {
    SCOPED_TRACE(impl->name);
    ASSERT_TRUE(impl->workspace != nullptr);
    const int64_t three_splits = 3 * (2 * 2 * 16) * (kDv + 1) * 4;
    for (const int64_t bytes : {impl->workspace(p), three_splits, int64_t{0}}) {
      Impl<Params> sized = *impl;
      sized.workspace = [bytes](const Params&) { return bytes; };
      for (testing::HostTensor* o : t.outputs()) testing::PoisonNaN(*o);
      const absl::Status status = testing::RunOnGpu(sized, p);
      ASSERT_TRUE(status.ok()) << status;
      const std::string what = impl->name + " workspace " + std::to_string(bytes);
      testing::ExpectAttentionOut(testing::ToDoubles(t.out()), ref_out, ref_abs, p.precision,
                                  kOutTol, what + " out");
      ExpectClose(testing::ToDoubles(t.lse()), ref_lse, kLseTol, what + " lse");
      ExpectLseGapsPoisoned(t.lse(), what);
      for (int64_t h = 0; h < c.heads; ++h) {
        EXPECT_EQ(t.lse().At({1, 0, h}), -INFINITY) << what;
      }
    }
  }
}

// The per-tensor FP8 cache (power-of-two scale 2^-5, docs/ACCURACY.md's: the kernels' bf16 values
// are exact and the scores stay in the range the lse bound assumes) on the GPU,
// 128 query rows (two 64-row blocks) per request: with 16-byte aligned rows the tensor-core
// kernel supports it (dispatch picks it: it is listed first) and the SIMT kernel too; with padded
// rows only the SIMT kernel (16-B and 1-B copies), the tensor-core kernel refusing with a reason.
// Each runs both precisions with its own split plan, the workspace for three splits and for one
// split only.
TEST(MlaDecodeGpu, PerTensorFp8MmaAndSimtAnyWorkspace) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  for (const bool padded : {false, true}) {
    for (const int64_t d_qk : {576, 512}) {
      DecodeCase c;
      c.d_qk = d_qk;
      c.fp8_kv_scale = 0.03125f;
      c.padded_strides = padded;
      c.heads = 64;
      c.s_q = 2;
      c.causal = true;
      c.seqlens = {700, 3};
      c.invalid_pages = {{0, 2}};
      auto rng = testing::MakeRng();
      DecodeTensors t(c, rng);
      Params p = t.params();
      std::vector<double> ref_out, ref_lse, ref_abs;
      Reference(p, &ref_out, &ref_lse, &ref_abs);
      std::vector<std::string> ran;
      for (const auto& impl : Implementations()) {
        if (impl.backend != testing::GpuBackend()) continue;
        std::string why;
        if (!impl.supports(p, &why)) {
          if (impl.name.find("_wgmma") != std::string::npos) continue;  // bf16 cache only
          EXPECT_TRUE(padded) << impl.name << " refuses the aligned FP8 cache: " << why;
          EXPECT_NE(why.find("kv_cache: per-tensor FP8 needs 16-byte alignment"), std::string::npos)
              << impl.name << ": " << why;
          continue;
        }
        ran.push_back(impl.name);
        const int64_t three_splits = 3 * (2 * 2 * 64) * (kDv + 1) * 4;
        for (const Precision precision : testing::kPrecisions) {
          p.precision = precision;
          for (const int64_t bytes : {impl.workspace(p), three_splits, int64_t{0}}) {
            Impl<Params> sized = impl;
            sized.workspace = [bytes](const Params&) { return bytes; };
            for (testing::HostTensor* o : t.outputs()) testing::PoisonNaN(*o);
            const absl::Status status = testing::RunOnGpu(sized, p);
            ASSERT_TRUE(status.ok()) << status;
            const std::string what = impl.name + " " + PrecisionName(precision) + " d_qk " +
                                     std::to_string(d_qk) + (padded ? " padded" : "") +
                                     " workspace " + std::to_string(bytes);
            testing::ExpectAttentionOut(testing::ToDoubles(t.out()), ref_out, ref_abs, precision,
                                        kOutTol, what + " out");
            ExpectClose(testing::ToDoubles(t.lse()), ref_lse, kLseTol, what + " lse");
          }
        }
      }
      ASSERT_FALSE(ran.empty());
#if defined(ATTND_GPU_CUDA)
      if (!padded) {
        EXPECT_EQ(ran.size(), 2u) << "the tensor-core and the SIMT kernel read aligned FP8 rows";
        EXPECT_EQ(ran[0], "cuda_mma") << "dispatch's first choice must be the tensor-core kernel";
        continue;
      }
#endif
      EXPECT_EQ(ran.size(), 1u) << "only the SIMT kernel reads these FP8 rows";
      EXPECT_NE(ran[0].find("simt"), std::string::npos) << ran[0];
    }
  }
}

// The tensor-core kernel on the per-tensor FP8 cache against itself on a bf16 cache holding the
// same values (each e4m3 × kv_scale rounded to bf16 on the host, DecodeTensors::RoundedKvAsBf16):
// the FP8 instance converts its tiles in shared memory and then computes exactly what the bf16
// instance computes, so out and lse must agree bit for bit, at a power-of-two and another scale,
// with page size 37 (tiles span pages), masked pages and split contexts.
TEST(MlaDecodeGpu, PerTensorFp8MmaMatchesBf16MmaOnRoundedCache) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  const Impl<Params>* mma = nullptr;
  for (const auto& impl : Implementations()) {
    // The mma.sync kernel by its exact name: "mma" is also in the wgmma kernels' names, and
    // they take the bf16 cache only.
    if (impl.backend == testing::GpuBackend() &&
        impl.name == std::string(BackendName(impl.backend)) + "_mma") {
      mma = &impl;
    }
  }
  if (mma == nullptr) GTEST_SKIP() << "no tensor-core kernel in this build";
  for (const int64_t d_qk : {576, 512}) {
    for (const float scale : {0.125f, 0.0371f}) {
      SCOPED_TRACE("d_qk " + std::to_string(d_qk) + " kv_scale " + std::to_string(scale));
      DecodeCase c;
      c.d_qk = d_qk;
      c.fp8_kv_scale = scale;
      c.heads = 64;
      c.s_q = 2;
      c.causal = true;
      c.page_size = 37;
      c.seqlens = {700, 3, 129};
      c.invalid_pages = {{0, 2}, {2, 1}};
      auto rng = testing::MakeRng();
      DecodeTensors t(c, rng);
      Params p = t.params();
      HostTensor rounded = t.RoundedKvAsBf16();
      Params rp = p;
      rp.kv_cache = rounded.tensor();
      rp.kv_scale = 0;
      ASSERT_TRUE(Validate(rp).ok()) << Validate(rp);
      std::string why;
      ASSERT_TRUE(mma->supports(p, &why)) << why;
      ASSERT_TRUE(mma->supports(rp, &why)) << why;
      for (const Precision precision : testing::kPrecisions) {
        p.precision = rp.precision = precision;
        std::vector<double> out[2], lse[2];
        for (int k = 0; k < 2; ++k) {
          for (testing::HostTensor* o : t.outputs()) testing::PoisonNaN(*o);
          const absl::Status status = testing::RunOnGpu(*mma, k == 0 ? p : rp);
          ASSERT_TRUE(status.ok()) << status;
          out[k] = testing::ToDoubles(t.out());
          lse[k] = testing::ToDoubles(t.lse());
        }
        const std::string what = PrecisionName(precision);
        ASSERT_EQ(out[0].size(), out[1].size());
        int64_t bad = 0;
        for (size_t i = 0; i < out[0].size(); ++i) {
          if (!(out[0][i] == out[1][i]) && bad++ < 4) {
            ADD_FAILURE() << what << " out[" << i << "]: fp8 " << out[0][i] << " bf16 "
                          << out[1][i];
          }
        }
        for (size_t i = 0; i < lse[0].size(); ++i) {
          if (!(lse[0][i] == lse[1][i]) && bad++ < 8) {
            ADD_FAILURE() << what << " lse[" << i << "]: fp8 " << lse[0][i] << " bf16 "
                          << lse[1][i];
          }
        }
        EXPECT_EQ(bad, 0) << what << ": elements that differ";
      }
    }
  }
}

// The sm_90a wgmma kernels (cuda_wgmma: bf16 cache, in both precisions; cuda_wgmma_pp, the
// ping-pong body, and cuda_wgmma_sf, the same math fed by TMA with no producer: FAST only, and
// they must refuse HIGH; all three take H 64 / 128, and H 16 / 32 with s_q 1 or not causal,
// their 64-row blocks padded, spanning MTP tokens when not causal) against the fp64 reference:
// ragged cache_seqlens (0, 1, around the 64-position block, long and random), NaN in every
// cache row past a request's length (the tail of its last page included), permuted block tables
// with masked pages, B 1..128, s_q 1..3 causal, d_qk 576 and 512, with its own split plan and
// with one split (no workspace). Skipped where it does not apply (not sm_90a).
TEST(MlaDecodeGpu, WgmmaRaggedLengthsPermutedPages) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::vector<const Impl<Params>*> kernels;
  for (const auto& impl : Implementations()) {
    if (impl.backend == testing::GpuBackend() && impl.name.find("_wgmma") != std::string::npos) {
      kernels.push_back(&impl);
    }
  }
  if (kernels.empty()) GTEST_SKIP() << "no wgmma kernel in this build";
  struct Shape {
    int64_t batch, heads, d_qk, s_q;
    bool causal;
  };
  const Shape shapes[] = {{1, 64, 576, 1, false},
                          {1, 128, 512, 1, false},
                          {2, 128, 576, 1, false},
                          {9, 64, 576, 1, false},
                          {9, 128, 512, 2, true},
                          {5, 64, 576, 3, true},
                          {33, 128, 576, 1, false},
                          {128, 64, 576, 1, false},
                          // H < 64: blocks padded to 64 rows (NaN-poisoned outputs: a
                          // padding row stored would land on another row or past the end).
                          {9, 16, 576, 1, false},
                          {33, 32, 512, 1, true},
                          {5, 16, 576, 3, false},
                          {9, 32, 576, 2, false},
                          {128, 16, 576, 1, false}};
  for (const Shape& s : shapes) {
    const std::string shape = ShapeName(s.batch, s.heads, s.d_qk, s.s_q, s.causal);
    SCOPED_TRACE(shape);
    auto rng = testing::MakeRng();
    // NaN past every length: a partly valid page's tail must never reach P·V.
    DecodeCase c = WgmmaCase(s.heads, s.d_qk, s.s_q, s.causal);
    const std::vector<int32_t> fixed = {1000, 0, 1, 63, 64, 65, 130, 2};
    c.seqlens.clear();
    for (int64_t b = 0; b < s.batch; ++b) {
      c.seqlens.push_back(b < static_cast<int64_t>(fixed.size())
                              ? fixed[static_cast<size_t>(b)]
                              : static_cast<int32_t>(rng() % 300));
    }
    if (s.batch == 1) c.seqlens[0] = s.heads == 64 ? 1 : 333;
    // Masked: a page inside 1000, the only page of 64, the second page of 65 (position 64).
    if (s.batch >= 5) c.invalid_pages = {{0, 3}, {4, 0}, {5, 1}};
    c.invalid_ids = {-1, 1 << 30};
    DecodeTensors t(c, rng);
    Params p = t.params();
    std::vector<double> ref_out, ref_lse, ref_abs;
    Reference(p, &ref_out, &ref_lse, &ref_abs);
    for (const Impl<Params>* wgmma : kernels) {
      // The ping-pong math (cuda_wgmma_pp, and cuda_wgmma_sf's): FAST only.
      const bool pp = wgmma->name.find("_pp") != std::string::npos ||
                      wgmma->name.find("_sf") != std::string::npos;
      for (const Precision precision : testing::kPrecisions) {
        p.precision = precision;
        std::string why;
        if (!wgmma->supports(p, &why)) {
          if (pp && precision == Precision::kHigh) continue;  // FAST only
          if (why.find("compute capability") != std::string::npos) {
            GTEST_SKIP() << wgmma->name << ": " << why;
          }
          ADD_FAILURE() << wgmma->name << " " << PrecisionName(precision) << " refuses: " << why;
          continue;
        }
        EXPECT_FALSE(pp && precision == Precision::kHigh) << wgmma->name << " accepts HIGH";
        for (const int64_t bytes : {wgmma->workspace(p), int64_t{0}}) {
          Impl<Params> sized = *wgmma;
          sized.workspace = [bytes](const Params&) { return bytes; };
          for (testing::HostTensor* o : t.outputs()) testing::PoisonNaN(*o);
          const absl::Status status = testing::RunOnGpu(sized, p);
          ASSERT_TRUE(status.ok()) << status;
          const std::string what = wgmma->name + " " + PrecisionName(precision) + " " + shape +
                                   " workspace " + std::to_string(bytes);
          testing::ExpectAttentionOut(testing::ToDoubles(t.out()), ref_out, ref_abs, precision,
                                      kOutTol, what + " out");
          ExpectClose(testing::ToDoubles(t.lse()), ref_lse, kLseTol, what + " lse");
        }
      }
    }
  }
  // H < 64 with causal MTP tokens would put rows of different causal limits into one block:
  // every one of them refuses it (cuda_mma runs it).
  for (const Impl<Params>* wgmma : kernels) {
    auto rng = testing::MakeRng();
    DecodeCase c;
    c.heads = 16;
    c.s_q = 2;
    c.causal = true;
    c.seqlens = {300, 70};
    DecodeTensors t(c, rng);
    std::string why;
    EXPECT_FALSE(wgmma->supports(t.params(), &why));
    EXPECT_NE(why.find("causal limits"), std::string::npos) << why;
  }
  // cuda_wgmma_sf loads every block as one page by TMA: other page sizes are refused.
  for (const Impl<Params>* wgmma : kernels) {
    if (wgmma->name.find("_sf") == std::string::npos) continue;
    auto rng = testing::MakeRng();
    DecodeCase c;
    c.heads = 64;
    c.page_size = 32;
    c.seqlens = {100};
    DecodeTensors t(c, rng);
    Params p = t.params();
    p.precision = Precision::kFast;
    std::string why;
    EXPECT_FALSE(wgmma->supports(p, &why));
    EXPECT_NE(why.find("page size 32"), std::string::npos) << why;
  }
  // A cache of one page, whose page stride means nothing (here 0): its tensor map takes the
  // packed stride, so cuda_wgmma_sf (no gather path to fall back on) runs it; it used to accept
  // the call and fail at launch.
  for (const Impl<Params>* wgmma : kernels) {
    if (wgmma->name.find("_sf") == std::string::npos) continue;
    auto rng = testing::MakeRng();
    DecodeCase c;
    c.heads = 64;
    c.seqlens = {40};
    c.spare_pages = 0;
    c.nan_past_length = true;
    DecodeTensors t(c, rng);
    Params p = t.params();
    ASSERT_EQ(p.kv_cache.dim(0), 1);
    p.kv_cache.strides[0] = 0;
    p.precision = Precision::kFast;
    std::string why;
    ASSERT_TRUE(wgmma->supports(p, &why)) << why;
    std::vector<double> ref_out, ref_lse, ref_abs;
    Reference(p, &ref_out, &ref_lse, &ref_abs);
    for (testing::HostTensor* o : t.outputs()) testing::PoisonNaN(*o);
    const absl::Status status = testing::RunOnGpu(*wgmma, p);
    ASSERT_TRUE(status.ok()) << status;
    testing::ExpectAttentionOut(testing::ToDoubles(t.out()), ref_out, ref_abs, p.precision, kOutTol,
                                wgmma->name + " one page out");
    ExpectClose(testing::ToDoubles(t.lse()), ref_lse, kLseTol, wgmma->name + " one page lse");
  }
}

#if defined(ATTND_GPU_CUDA)
// cuda_wgmma and cuda_wgmma_sf through their `...With` launchers (gpu/launch.h
// DecodeLaunchOptions): the wave-balanced split plan (balanced_plan.h; the bench's "_bal"
// variants), the L2 prefetch forced off and on (the "_nopf" variants) and the length-aware
// schedule (schedule_plan.h, gpu/schedule.cu; "_sched"), against the fp64 reference. Shapes
// where the plans apply on this device (fewer requests than CTA groups: the balanced plan
// needs it; the schedule also runs past it): ragged lengths with
// empty pieces (lengths far under the table's capacity, so capacity-based pieces are clipped
// away and must leave LSE -inf in their slot; a request of length 0 has no scheduled piece),
// masked pages, NaN past every length, H 128 (two row blocks a group), causal MTP, and H 16
// padded to 64 rows. The workspace starts as NaN (the harness fills it with 0xff), so a partial
// slot the combine reads but no piece wrote poisons the output, unless every other slot of the
// row is empty (the combine's max drops a NaN LSE; the output is then right anyway). The plans' own
// arithmetic: MlaDecodeBalancedPlan.*, MlaDecodeSchedulePlan.*.
TEST(MlaDecodeGpu, WgmmaBalancedScheduledAndPrefetch) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  struct Kernel {
    const char* name;
    gpu::GpuKernel kernel;
  };
  const Kernel kernels[] = {{"cuda_wgmma", gpu::GpuKernel::kWgmma},
                            {"cuda_wgmma_sf", gpu::GpuKernel::kWgmmaSf}};
  struct Shape {
    int64_t batch, heads, d_qk, s_q, max_pages;
    bool causal;
  };
  // Page counts that leave ranges cut at request boundaries (the balanced plan's second wave)
  // on 132- and 114-SM parts; B70 H128 has more requests than groups (66 on 132 SMs), where
  // only the schedule applies.
  const Shape shapes[] = {{9, 64, 576, 1, 40, false},  {5, 128, 512, 1, 25, false},
                          {7, 128, 576, 2, 21, true},  {3, 16, 576, 1, 31, false},
                          {30, 64, 576, 1, 13, false}, {1, 64, 576, 1, 33, false},
                          {70, 128, 512, 1, 5, false}};
  int balanced_runs = 0, scheduled_runs = 0;
  for (const Shape& s : shapes) {
    const std::string shape = ShapeName(s.batch, s.heads, s.d_qk, s.s_q, s.causal) + " pages " +
                              std::to_string(s.max_pages);
    SCOPED_TRACE(shape);
    auto rng = testing::MakeRng();
    DecodeCase c = WgmmaCase(s.heads, s.d_qk, s.s_q, s.causal);
    c.max_pages = s.max_pages;
    const int32_t capacity = static_cast<int32_t>(s.max_pages * 64);
    for (int64_t b = 0; b < s.batch; ++b) {  // full, empty, one position, ragged
      const int32_t pick[] = {
          capacity, 0, 1, capacity - 1, 64, 65, static_cast<int32_t>(rng() % capacity)};
      c.seqlens.push_back(b == 0 ? capacity : pick[rng() % 7]);
    }
    if (s.batch >= 5) c.invalid_pages = {{0, 3}, {3, 0}};
    DecodeTensors t(c, rng);
    Params p = t.params();
    p.precision = Precision::kFast;
    std::vector<double> ref_out, ref_lse, ref_abs;
    Reference(p, &ref_out, &ref_lse, &ref_abs);
    for (const Kernel& k : kernels) {
      const Impl<Params>* base = nullptr;
      for (const auto& impl : Implementations()) {
        if (impl.name == k.name) base = &impl;
      }
      if (base == nullptr) GTEST_SKIP() << "no " << k.name << " in this build";
      std::string why;
      if (!base->supports(p, &why)) {
        if (why.find("compute capability") != std::string::npos) GTEST_SKIP() << why;
        ADD_FAILURE() << k.name << " refuses: " << why;
        continue;
      }
      const char* forms[] = {" balanced", " prefetch off", " prefetch on", " schedule"};
      for (int form = 0; form < 4; ++form) {
        gpu::DecodeLaunchOptions options;
        options.balanced = form == 0;
        options.schedule = form == 3;
        options.prefetch_l2 = form == 1 ? 0 : form == 2 ? 1 : -1;
        const int bal = form == 0 ? gpu::BalancedSplits(p, k.kernel) : 0;
        const int64_t sched = form == 3 ? gpu::ScheduleWorkspaceBytes(p, k.kernel) : 0;
        // Whether a plan applies depends on the device's SMs (a MIG slice may have few):
        // counted, and at least one run of each is wanted below.
        if (form == 0 && bal > 0) ++balanced_runs;
        if (form == 3 && sched > 0) ++scheduled_runs;
        const int splits = bal > 0 ? bal : gpu::GpuSplits(p, k.kernel);
        Impl<Params> forced = *base;
        forced.workspace = [splits, sched](const Params& q) {
          return sched > 0 ? sched : gpu::SplitWorkspaceBytes(q, splits);
        };
        forced.run = [splits, options, kernel = k.kernel](const Params& q, const ExecContext& ctx) {
          const auto stream = static_cast<::attnd::gpu::Stream>(ctx.stream);
          gpu::DecodeLaunchOptions sized = options;
          sized.workspace_bytes = ctx.workspace_bytes;
          const ::attnd::gpu::Error e =
              gpu::LaunchMlaDecodeWith(kernel, q, splits, ctx.workspace, stream, sized);
          if (e != ::attnd::gpu::kSuccess) {
            return absl::InternalError(std::string("launch: ") + ::attnd::gpu::ErrorString(e));
          }
          return absl::OkStatus();
        };
        for (testing::HostTensor* o : t.outputs()) testing::PoisonNaN(*o);
        const absl::Status status = testing::RunOnGpu(forced, p);
        ASSERT_TRUE(status.ok()) << k.name << forms[form] << ": " << status;
        const std::string what = std::string(k.name) + forms[form] + " " + shape;
        testing::ExpectAttentionOut(testing::ToDoubles(t.out()), ref_out, ref_abs, p.precision,
                                    kOutTol, what + " out");
        ExpectClose(testing::ToDoubles(t.lse()), ref_lse, kLseTol, what + " lse");
      }
      // Refused before anything runs (p's tensors are host memory here): a split count other
      // than the balanced plan's; the schedule without a workspace, or with fewer bytes than
      // it needs (a pointer never dereferenced).
      const int bal = gpu::BalancedSplits(p, k.kernel);
      const int64_t sched_bytes = gpu::ScheduleWorkspaceBytes(p, k.kernel);
      for (int refusal = 0; refusal < 3; ++refusal) {
        if (refusal == 0 ? bal <= 1 : sched_bytes <= 0) continue;
        gpu::DecodeLaunchOptions options;
        options.balanced = refusal == 0;
        options.schedule = refusal > 0;
        void* ws = nullptr;
        if (refusal == 2) {
          ws = reinterpret_cast<void*>(uintptr_t{1} << 20);
          options.workspace_bytes = sched_bytes - 1;
        }
        const int splits = refusal == 0 ? bal - 1 : 1;
        const ::attnd::gpu::Error e =
            gpu::LaunchMlaDecodeWith(k.kernel, p, splits, ws, nullptr, options);
        EXPECT_EQ(e, ::attnd::gpu::kErrorInvalidValue) << k.name << " refusal " << refusal;
      }
    }
  }
  EXPECT_GT(balanced_runs, 0);
  EXPECT_GT(scheduled_runs, 0);
}

// The schedule kernel alone (gpu/schedule.cu) against its host reference (schedule_plan.h
// BuildSchedule): the launched groups' entries, each request's first slot and piece count,
// for ragged, equal, zero and over-capacity lengths (clamped to the table, as DecodeWorkItem
// clamps them), fewer and more requests than groups, up to kScheduleMaxLaunched of both
// together. The table is widened as a view: the kernel reads cache_seqlens and the capacity
// only.
TEST(MlaDecodeGpu, ScheduleKernelMatchesHostReference) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  struct Case {
    int64_t batch, groups, max_pages;
    int kind;  // 0 ragged, 1 equal (full), 2 mostly empty, 3 past the capacity and negative
    int32_t even_splits;  // the even plan's count (0: never its cut)
  };
  // Equal lengths with an even count take the even plan's cut (checked below); ragged ones
  // keep the end-to-end cut.
  const Case cases[] = {{1, 132, 512, 0, 0},   {128, 132, 512, 0, 1},  {128, 132, 512, 1, 1},
                        {128, 132, 512, 1, 0}, {32, 66, 512, 0, 2},    {32, 66, 512, 1, 2},
                        {7, 8, 3, 2, 1},       {100, 132, 4096, 3, 1}, {446, 66, 64, 0, 0},
                        {5, 132, 1, 1, 4},     {200, 66, 512, 0, 1},   {3, 132, 512, 1, 40}};
  auto rng = testing::MakeRng();
  for (const Case& k : cases) {
    const std::string what = "B " + std::to_string(k.batch) + " groups " +
                             std::to_string(k.groups) + " pages " + std::to_string(k.max_pages) +
                             " kind " + std::to_string(k.kind) + " even " +
                             std::to_string(k.even_splits);
    SCOPED_TRACE(what);
    // A small call of k.batch requests (one page each) whose table is then widened as a view.
    DecodeCase c;
    c.heads = 16;
    c.max_pages = 1;
    c.spare_pages = 0;
    c.seqlens.assign(static_cast<size_t>(k.batch), 40);
    DecodeTensors t(c, rng);
    Params p = t.params();
    p.block_table.shape[1] = k.max_pages;
    const int64_t capacity = k.max_pages * 64;
    // The lengths the kernel reads, and the tiles they give clamped to [0, capacity].
    std::vector<int32_t> lens;
    std::vector<int64_t> tiles;
    for (int64_t b = 0; b < k.batch; ++b) {
      int64_t len = 0;
      switch (k.kind) {
        case 0: len = static_cast<int64_t>(rng() % (capacity + 1)); break;
        case 1: len = capacity; break;
        case 2: len = rng() % 5 == 0 ? 1 + static_cast<int64_t>(rng() % capacity) : 0; break;
        default: len = b % 2 == 0 ? capacity + 100 : -5; break;
      }
      lens.push_back(static_cast<int32_t>(len));
      tiles.push_back((std::min(std::max<int64_t>(len, 0), capacity) + 63) / 64);
    }
    p.cache_seqlens = MakeTensor(lens.data(), DType::kI32, {k.batch});
    testing::DeviceMirror mirror;
    ASSERT_TRUE(mirror.Mirror(p.cache_seqlens).ok());
    const int64_t launched = k.groups + k.batch;
    void* ws = nullptr;
    ASSERT_TRUE(mirror.Allocate((4 * launched + 2 * k.batch) * 4, &ws).ok());
    ASSERT_EQ(
        gpu::LaunchMlaDecodeScheduleOnly(p, static_cast<int32_t>(k.groups), 64, k.even_splits, ws,
                                         static_cast<::attnd::gpu::Stream>(mirror.stream())),
        ::attnd::gpu::kSuccess);
    std::vector<int32_t> got(static_cast<size_t>(4 * launched + 2 * k.batch));
    const Tensor host = MakeTensor(got.data(), DType::kI32, {static_cast<int64_t>(got.size())});
    const Tensor dev = MakeTensor(ws, DType::kI32, {static_cast<int64_t>(got.size())});
    ASSERT_TRUE(mirror.CopyBack(dev, host).ok());
    ASSERT_TRUE(mirror.Synchronize().ok());
    std::vector<int32_t> first, pieces;
    const std::vector<ScheduleEntry> want = BuildSchedule(
        tiles, k.groups, launched, 2, gpu::kMaxSplits, &first, &pieces, k.even_splits);
    // Equal lengths with an even count: every request in even_splits pieces (its tiles over
    // that count, at least two tiles a piece), as the even plan cuts them.
    if (k.kind == 1 && k.even_splits > 0) {
      const int64_t per = std::max<int64_t>((tiles[0] + k.even_splits - 1) / k.even_splits, 2);
      for (int64_t b = 0; b < k.batch; ++b) {
        EXPECT_EQ(pieces[static_cast<size_t>(b)], (tiles[0] + per - 1) / per) << b;
      }
    }
    for (int64_t g = 0; g < launched; ++g) {
      const int32_t* e = got.data() + 4 * g;
      const ScheduleEntry& x = want[static_cast<size_t>(g)];
      EXPECT_TRUE(e[0] == x.request && e[1] == x.lo && e[2] == x.hi && e[3] == x.slot)
          << "group " << g << ": got " << e[0] << " [" << e[1] << ", " << e[2] << ") slot " << e[3]
          << ", want " << x.request << " [" << x.lo << ", " << x.hi << ") slot " << x.slot;
    }
    for (int64_t b = 0; b < k.batch; ++b) {
      EXPECT_EQ(got[static_cast<size_t>(4 * launched + b)], first[static_cast<size_t>(b)]) << b;
      EXPECT_EQ(got[static_cast<size_t>(4 * launched + k.batch + b)],
                pieces[static_cast<size_t>(b)])
          << b;
    }
  }
}
#endif  // ATTND_GPU_CUDA

// Dispatch at H < 64 (Impl::prefer, gpu::WgmmaPrefers): cuda_wgmma pads the rows to 64, so it
// is chosen only where each CTA streams kWgmmaPaddedMinTiles tiles or more (B128 over a 32K
// table); a short split (B1 over 4K: two tiles a split) runs cuda_mma; H 64 always cuda_wgmma.
// By name cuda_wgmma runs the short call too (WgmmaRaggedLengthsPermutedPages). sm_90a only.
TEST(MlaDecodeGpu, PaddedWgmmaChosenOnlyWhereBytesBound) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  const Impl<Params>* wgmma = nullptr;
  for (const auto& impl : Implementations()) {
    if (impl.name == "cuda_wgmma") wgmma = &impl;
  }
  if (wgmma == nullptr) GTEST_SKIP() << "no cuda_wgmma in this build";
  struct Case {
    int64_t batch, heads, max_pages;
    const char* want;
  };
  const Case cases[] = {{128, 16, 512, "cuda_wgmma"},
                        {128, 32, 512, "cuda_wgmma"},
                        {1, 16, 64, "cuda_mma"},
                        {1, 64, 64, "cuda_wgmma"}};
  for (const Case& k : cases) {
    auto rng = testing::MakeRng();
    DecodeCase c;
    c.heads = k.heads;
    c.seqlens.assign(static_cast<size_t>(k.batch), 70);
    c.max_pages = 2;
    DecodeTensors t(c, rng);
    // Dispatch reads shapes only (the plan assumes the table's capacity; no data is read, no
    // kernel runs), so the table is widened as a view to k.max_pages instead of allocating and
    // filling a cache of B x max_pages pages (4.8 GB at B128 x 512: minutes on the host).
    Params p = t.params();
    p.block_table.shape[1] = k.max_pages;
    p.block_table.strides[0] = k.max_pages;
    std::string why;
    if (!wgmma->supports(p, &why)) {
      ASSERT_NE(why.find("compute capability"), std::string::npos) << why;
      GTEST_SKIP() << why;
    }
    ExecContext ctx;
    ctx.backend = testing::GpuBackend();
    why.clear();
    const Impl<Params>* chosen = SelectImpl(Implementations(), p, ctx, &why);
    ASSERT_NE(chosen, nullptr) << why;
    EXPECT_EQ(chosen->name, k.want)
        << "B " << k.batch << " H " << k.heads << " pages " << k.max_pages;
  }
}

}  // namespace
}  // namespace attnd::kernels::mla_decode
