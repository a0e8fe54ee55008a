// mla_prefill on the GPU where the GPU is the point: q past 2^31 elements (total_q · H · 192 at
// 176000 tokens x 64 heads) with real device allocations (about 7 GiB). Skipped without a GPU;
// every other case runs on the GPU through the harness.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/mla_prefill/mla_prefill.h"
#include "kernels/mla_prefill/reference.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/kernels/mla_prefill/prefill_case.h"

#if defined(ATTND_GPU_CUDA)
#include "kernels/common/gpu/runtime.h"
#include "kernels/mla_prefill/gpu/launch.h"
#endif

namespace attnd::kernels::mla_prefill {
namespace {

using testing::ExpectClose;
using testing::HostTensor;

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

// Checks the sequence of `len` queries and keys starting at token t0 (outputs on the host)
// against the reference of that sequence alone.
void CheckSequence(const Params& p, int64_t t0, int32_t len, const std::string& what) {
  Params sub = p;
  for (Tensor* t : {&sub.q, &sub.k, &sub.v, &sub.out, &sub.lse}) {
    t->data = static_cast<char*>(t->data) + t0 * t->stride(0) * DTypeSize(t->dtype);
    t->shape[0] = len;
  }
  int32_t cu[2] = {0, len};
  sub.cu_seqlens_q = MakeTensor(cu, DType::kI32, {2});
  sub.cu_seqlens_k = MakeTensor(cu, DType::kI32, {2});
  std::vector<double> ref_out, ref_lse, ref_abs, out, lse;
  Reference(sub, &ref_out, &ref_lse, &ref_abs);
  for (int64_t t = 0; t < len; ++t) {
    for (int64_t h = 0; h < sub.q.dim(1); ++h) {
      const bf16_t* row =
          sub.out.ptr<const bf16_t>() + t * sub.out.stride(0) + h * sub.out.stride(1);
      for (int64_t c = 0; c < sub.v.dim(2); ++c) out.push_back(Bf16ToFloat(row[c]));
      lse.push_back(sub.lse.ptr<const float>()[t * sub.lse.stride(0) + h * sub.lse.stride(1)]);
    }
  }
  testing::ExpectAttentionOut(out, ref_out, ref_abs, p.precision, kOutTol, what + " out");
  ExpectClose(lse, ref_lse, kLseTol, what + " lse");
}

// 1100 causal sequences of 160 tokens, 64 query heads over one kv head (GQA): q passes 2^31
// elements from token 174763 on (sequence 1092).
TEST(MlaPrefillGpu, QueryPast2To31Elements) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  constexpr int64_t kSeqs = 1100, kLen = 160, kTokens = kSeqs * kLen, kHeads = 64;
  auto rng = testing::MakeRng();
  HostTensor q = HostTensor::Dense(DType::kBF16, {kTokens, kHeads, 192});
  HostTensor k = HostTensor::Dense(DType::kBF16, {kTokens, 1, 192});
  HostTensor v = HostTensor::Dense(DType::kBF16, {kTokens, 1, 128});
  HostTensor cu = HostTensor::Dense(DType::kI32, {kSeqs + 1});
  HostTensor out = HostTensor::Dense(DType::kBF16, {kTokens, kHeads, 128});
  HostTensor lse = HostTensor::Dense(DType::kF32, {kTokens, kHeads});
  FillFast(q, rng());
  FillFast(k, rng());
  FillFast(v, rng());
  for (int64_t b = 0; b <= kSeqs; ++b) cu.data<int32_t>()[b] = static_cast<int32_t>(b * kLen);
  Params p;
  p.q = q.tensor();
  p.k = k.tensor();
  p.v = v.tensor();
  p.cu_seqlens_q = cu.tensor();
  p.cu_seqlens_k = cu.tensor();
  p.out = out.tensor();
  p.lse = lse.tensor();
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(192.0));
  p.causal = true;
  ASSERT_TRUE(Validate(p).ok()) << Validate(p);
  int runs = 0;
  for (const auto& impl : Implementations()) {
    std::string why;
    if (impl.backend != testing::GpuBackend() || !impl.supports(p, &why)) continue;
    for (const Precision precision : testing::kPrecisions) {
      SCOPED_TRACE(impl.name + " " + PrecisionName(precision));
      p.precision = precision;
      testing::PoisonNaN(out);
      testing::PoisonNaN(lse);
      const absl::Status status = testing::RunOnGpu(impl, p);
      ASSERT_TRUE(status.ok()) << status;
      CheckSequence(p, 0, kLen, impl.name + " sequence 0");
      CheckSequence(p, 1092 * kLen, kLen, impl.name + " sequence 1092 (crosses 2^31)");
      CheckSequence(p, (kSeqs - 1) * kLen, kLen, impl.name + " last sequence");
    }
    ++runs;
  }
  EXPECT_GE(runs, 1);
}

// The model's head dims run on the Hopper kernel wherever the device is one (sm_90): a refusal
// for any other reason would silently leave its cases to cuda_mma. Run first in a process (as
// with --gtest_filter), this also covers a Supports() before any other CUDA call.
TEST(MlaPrefillGpu, HopperKernelTakesTheModelDims) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  PrefillCase c;
  c.lens = {{300, 300}};
  auto rng = testing::MakeRng();
  PrefillTensors t(c, rng);
  const Impl<Params>* wgmma = nullptr;
  for (const auto& impl : Implementations()) {
    if (impl.name == "cuda_wgmma") wgmma = &impl;
  }
  if (wgmma == nullptr) GTEST_SKIP() << "no cuda_wgmma in this build";
  std::string why;
  const bool runs = wgmma->supports(t.params(), &why);
  if (!runs && why.rfind("needs compute capability", 0) == 0) GTEST_SKIP() << why;
  EXPECT_TRUE(runs) << why;
}

#if defined(ATTND_GPU_CUDA)
// The wgmma kernel with its items' heads interleaved in groups of `head_group` (forced).
Impl<Params> HeadGroupImpl(const Impl<Params>& wgmma, int32_t head_group) {
  return Impl<Params>(
      "cuda_wgmma_hg" + std::to_string(head_group), testing::GpuBackend(), wgmma.supports,
      [head_group](const Params& p, const ExecContext& ctx) -> absl::Status {
        const ::attnd::gpu::Error e = gpu::LaunchMlaPrefillWgmmaWith(
            p, head_group, ctx.workspace, static_cast<::attnd::gpu::Stream>(ctx.stream));
        if (e != ::attnd::gpu::kSuccess) return absl::InternalError(::attnd::gpu::ErrorString(e));
        return absl::OkStatus();
      },
      wgmma.workspace);
}

// The item order (docs/KERNELS.md "MLA prefill on Hopper", "Work") changes which CTA runs an
// item, never its arithmetic: every forced head-group size gives the bytes of group 1 (heads in
// order), which meets the reference; 0 is WgmmaHeadGroup's size. 12 query heads over 4 kv
// heads, so groups of 5 leave a first group of 2 and 40 is clamped to 12; sequences of several
// query and key tiles, an empty one, Lq > Lk, rows past the last sequence, NaN keys past the last
// sequence.
TEST(MlaPrefillGpu, HeadGroupsGiveTheSameBytes) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  const Impl<Params>* wgmma = nullptr;
  for (const auto& impl : Implementations()) {
    if (impl.name == "cuda_wgmma") wgmma = &impl;
  }
  if (wgmma == nullptr) GTEST_SKIP() << "no cuda_wgmma in this build";
  PrefillCase c;
  c.heads = 12;
  c.heads_kv = 4;
  c.lens = {{300, 300}, {0, 40}, {150, 90}, {45, 400}, {260, 260}};
  c.extra_q_rows = 3;
  c.extra_k_rows = 5;
  auto rng = testing::MakeRng();
  PrefillTensors t(c, rng);
  Params p = t.params();
  std::string why;
  if (!wgmma->supports(p, &why)) GTEST_SKIP() << why;
  const int32_t hg = gpu::WgmmaHeadGroup(p);
  EXPECT_GE(hg, 1);
  EXPECT_LE(hg, 12);
  std::vector<double> ref_out, ref_lse, ref_abs;
  Reference(p, &ref_out, &ref_lse, &ref_abs);
  for (const Precision precision : testing::kPrecisions) {
    p.precision = precision;
    SCOPED_TRACE(PrecisionName(precision));
    std::vector<uint8_t> want_out, want_lse;
    for (const int32_t group : {1, 0, 2, 5, 12, 40}) {
      SCOPED_TRACE("head_group " + std::to_string(group));
      testing::PoisonNaN(t.out());
      testing::PoisonNaN(t.lse());
      const absl::Status status = testing::RunOnGpu(HeadGroupImpl(*wgmma, group), p);
      ASSERT_TRUE(status.ok()) << status;
      std::vector<uint8_t> out(t.out().raw(), t.out().raw() + t.out().bytes());
      std::vector<uint8_t> lse(t.lse().raw(), t.lse().raw() + t.lse().bytes());
      if (group == 1) {
        testing::ExpectAttentionOut(testing::ToDoubles(t.out()), ref_out, ref_abs, precision,
                                    kOutTol, "out");
        ExpectClose(testing::ToDoubles(t.lse()), ref_lse, kLseTol, "lse");
        want_out = out;
        want_lse = lse;
      } else {
        EXPECT_TRUE(out == want_out) << "out bytes differ from head_group 1";
        EXPECT_TRUE(lse == want_lse) << "lse bytes differ from head_group 1";
      }
    }
  }
}
#endif  // ATTND_GPU_CUDA

}  // namespace
}  // namespace attnd::kernels::mla_prefill
