// cuda_mma_auto's device-side choice (gpu/launch.h, gpu/mma_auto.cu): the header its estimate
// kernel writes at the start of the workspace is read back after each run and checked against
// a host mirror of the documented sampling (groups, blocks, valid entries, distinct rows), and
// the choice against the selection's sharing: pools of neighbours with the same rows -> the
// low-head union kernel, uniform rows -> its alternative (the ping-pong wgmma kernel where it
// runs: sm_90a and FAST; else cuda_mma). Every run's output is checked against the
// fp64 reference with NaN guard rows around the device KV (the harness in sparse_mla_test.cc
// runs cuda_mma_auto on all its cases too). Skipped without a CUDA build and device.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/sparse_mla/reference.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "tests/harness/harness.h"
#include "tests/kernels/sparse_mla/case.h"

#if defined(ATTND_GPU_CUDA)
#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/gpu/runtime.h"
#include "kernels/sparse_mla/gpu/launch.h"
#endif

namespace attnd::testing {
namespace {

#if defined(ATTND_GPU_CUDA)

using kernels::sparse_mla::ComputeReference;
using kernels::sparse_mla::Params;
using kernels::sparse_mla::Reference;
using kernels::sparse_mla::gpu::kAutoBlocksPerGroup;
using kernels::sparse_mla::gpu::kAutoChoseLowh;
using kernels::sparse_mla::gpu::kAutoChoseMma;
using kernels::sparse_mla::gpu::kAutoChosePp;
using kernels::sparse_mla::gpu::kAutoSampleGroups;
using kernels::sparse_mla::gpu::MmaAutoHeader;

// Runs cuda_mma_auto on device mirrors of `p` with its workspace (or none when `no_workspace`)
// and copies the header back. The device KV carries the case's NaN guard rows.
absl::Status RunAuto(const Params& p, MmaAutoHeader* header, bool no_workspace = false) {
  *header = MmaAutoHeader{-1, -1, -1, -1, 0, {}};
  kernels::Impl<Params> impl(
      "auto", GpuBackend(), nullptr,
      [header, no_workspace](const Params& d, const kernels::ExecContext& ctx) -> absl::Status {
        const auto stream = static_cast<gpu::Stream>(ctx.stream);
        GPU_RETURN_IF_ERROR(kernels::sparse_mla::gpu::LaunchSparseMlaMmaAuto(
            d, no_workspace ? nullptr : ctx.workspace, no_workspace ? 0 : ctx.workspace_bytes,
            stream));
        if (!no_workspace && d.q.dim(0) > 0) {
          GPU_RETURN_IF_ERROR(gpu::MemcpyD2HAsync(header, ctx.workspace, sizeof(*header), stream));
          GPU_RETURN_IF_ERROR(gpu::StreamSynchronize(stream));
        }
        return absl::OkStatus();
      },
      [](const Params& h) { return kernels::sparse_mla::gpu::MmaAutoWorkspaceBytes(h); });
  return RunOnGpuWithKvGuards(impl, p);
}

// The sums the estimate must write for rows `rows` (each token's row after topk_length): groups
// of `tokens`, blocks of `block_n` (cuda_mma_lowh's: 64 / Hs tokens; 64 slots at d512, 48 at
// d576), the sampled groups and blocks of mma_auto.cu.
MmaAutoHeader ExpectedHeader(const std::vector<std::vector<int32_t>>& rows, int64_t s,
                             int64_t tokens, int64_t block_n) {
  const int64_t t_count = static_cast<int64_t>(rows.size());
  const int64_t groups = (t_count + tokens - 1) / tokens;
  const int64_t n = std::min<int64_t>(groups, kAutoSampleGroups);
  int64_t distinct = 0, valid = 0, walked = 0;
  for (int64_t w = 0; w < n; ++w) {
    const int64_t group = (2 * w + 1) * groups / (2 * n);
    int64_t longest = 0;
    for (int64_t t = group * tokens; t < std::min(t_count, (group + 1) * tokens); ++t) {
      longest = std::max<int64_t>(longest, static_cast<int64_t>(rows[t].size()));
    }
    const int64_t blocks = (longest + block_n - 1) / block_n;
    const int64_t nb = std::min<int64_t>(blocks, kAutoBlocksPerGroup);
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t blk = (2 * j + 1) * blocks / (2 * nb);
      std::set<int32_t> seen;
      for (int64_t t = group * tokens; t < std::min(t_count, (group + 1) * tokens); ++t) {
        for (int64_t i = blk * block_n; i < std::min<int64_t>((blk + 1) * block_n, rows[t].size());
             ++i) {
          const int32_t r = rows[t][i];
          ++walked;
          if (r < 0 || r >= s) continue;
          ++valid;
          seen.insert(r);
        }
      }
      distinct += static_cast<int64_t>(seen.size());
    }
  }
  MmaAutoHeader h;
  h.choice = -1;  // not mirrored: the tests state what they expect
  h.union_rows = static_cast<int32_t>(distinct);
  h.valid_entries = static_cast<int32_t>(valid);
  h.walked_slots = static_cast<int32_t>(walked);
  return h;
}

int64_t GroupTokens(int64_t h) { return 64 / (h <= 8 ? 8 : h <= 16 ? 16 : 32); }

// Rows where each pool of `pool` consecutive tokens has the same K slots (uniform over [0, S),
// masked_fraction of them invalid); pool 1 is a uniform selection.
std::vector<std::vector<int32_t>> PooledSlots(const SparseMlaSpec& spec, int64_t pool,
                                              std::mt19937_64& rng) {
  SparseMlaSpec base = spec;
  base.t = (spec.t + pool - 1) / pool;
  const std::vector<std::vector<int32_t>> pools = RandomSlots(base, rng);
  std::vector<std::vector<int32_t>> slots(spec.t);
  for (int64_t t = 0; t < spec.t; ++t) slots[t] = pools[t / pool];
  return slots;
}

// The rows the kernels see: the first clamp(topk_length[t], 0, K) slots.
std::vector<std::vector<int32_t>> Effective(std::vector<std::vector<int32_t>> slots,
                                            const std::vector<int32_t>& lengths) {
  if (lengths.empty()) return slots;
  for (size_t t = 0; t < slots.size(); ++t) {
    slots[t].resize(std::clamp<int64_t>(lengths[t], 0, static_cast<int64_t>(slots[t].size())));
  }
  return slots;
}

struct AutoCase {
  int64_t h, d_qk, t, k, s, pool;
  bool topk_length;
  bool lowh;      // the union kernel, or else the alternative (whichever `p` gets)
  double masked;  // the fraction of invalid slots (never a union row)
};

// The choice cuda_mma_auto makes where it does not pick the union kernel, for `p`.
int32_t AlternativeChoice(const Params& p) {
  return kernels::sparse_mla::gpu::MmaAutoAlternative(p) ==
                 kernels::sparse_mla::gpu::GpuKernel::kWgmmaPp
             ? kAutoChosePp
             : kAutoChoseMma;
}

void CheckCase(const AutoCase& ac) {
  SCOPED_TRACE("H " + std::to_string(ac.h) + " d " + std::to_string(ac.d_qk) + " T " +
               std::to_string(ac.t) + " K " + std::to_string(ac.k) + " pool " +
               std::to_string(ac.pool));
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.h = ac.h;
  spec.d_qk = ac.d_qk;
  spec.t = ac.t;
  spec.k = ac.k;
  spec.s = ac.s;
  spec.masked_fraction = ac.masked;
  const std::vector<std::vector<int32_t>> slots = PooledSlots(spec, ac.pool, rng);
  std::vector<int32_t> lengths;  // one per pool, so a pool's rows stay the same
  if (ac.topk_length) {
    std::uniform_int_distribution<int32_t> len(-2, static_cast<int32_t>(ac.k) + 2);
    for (int64_t t = 0; t < ac.t; ++t) {
      lengths.push_back(t % ac.pool == 0 ? len(rng) : lengths.back());
    }
  }
  SparseMlaCase c(spec, rng, slots, lengths);
  MmaAutoHeader want =
      ExpectedHeader(Effective(slots, lengths), ac.s, GroupTokens(ac.h), ac.d_qk == 512 ? 64 : 48);
  for (bool csr : {false, true}) {
    Params p = c.MakeParams(csr);
    std::string why;
    ASSERT_TRUE(kernels::sparse_mla::gpu::MmaAutoSupports(p, &why)) << why;
    const Reference ref = ComputeReference(p);
    for (const kernels::Precision precision : kPrecisions) {
      p.precision = precision;
      for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
      MmaAutoHeader got;
      const absl::Status st = RunAuto(p, &got);
      ASSERT_TRUE(st.ok()) << st;
      const std::string what =
          std::string(csr ? "csr" : "table") + " " + std::string(kernels::PrecisionName(precision));
      const int32_t alternative = AlternativeChoice(p);
      EXPECT_EQ(got.choice, ac.lowh ? kAutoChoseLowh : alternative)
          << what << ": union " << got.union_rows << " of walked " << got.walked_slots;
      EXPECT_EQ(got.choice, kernels::sparse_mla::gpu::MmaAutoPicksLowh(
                                want.union_rows, want.walked_slots, GroupTokens(ac.h),
                                alternative == kAutoChosePp)
                                ? kAutoChoseLowh
                                : alternative)
          << what << ": the documented rule";
      EXPECT_EQ(got.union_rows, want.union_rows) << what;
      EXPECT_EQ(got.valid_entries, want.valid_entries) << what;
      EXPECT_EQ(got.walked_slots, want.walked_slots) << what;
      ExpectOutputs(c, p, ref, what);
    }
  }
}

// Pools of 8 tokens with the same rows, half their slots invalid: a CTA of cuda_mma_lowh (8
// tokens at H8, 4 at H16) gathers each row once for all of them (union / walked slots about 1/16
// or 1/8, a lone token's group 1/2) -> lowh, against either alternative. More groups than are
// sampled (T 160 at H16: 40 groups), T not a multiple of the group, K tails, d 576 (48-slot
// blocks), topk_length.
TEST(SparseMlaAutoGpu, ChoosesLowhWhereNeighboursShareRows) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  for (const AutoCase& ac : {
           AutoCase{16, 512, 160, 300, 5000, 8, false, true, 0.5},
           AutoCase{8, 512, 77, 600, 20000, 8, false, true, 0.5},
           AutoCase{16, 576, 37, 150, 3000, 8, true, true, 0.5},
           AutoCase{12, 512, 9, 130, 700, 8, false, true, 0.5},  // groups 4 + 4 + 1
       }) {
    CheckCase(ac);
  }
}

// Uniform rows over a large cache (neighbours share almost nothing: union / walked slots ~ 0.9,
// the valid fraction) -> the alternative (cuda_wgmma_pp in FAST on sm_90a, else cuda_mma); also a
// single token.
TEST(SparseMlaAutoGpu, ChoosesTheAlternativeOnUniformSelections) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  for (const AutoCase& ac : {
           AutoCase{16, 512, 160, 300, 60000, 1, false, false, 0.1},
           AutoCase{8, 576, 20, 600, 60000, 1, true, false, 0.1},
           AutoCase{32, 512, 33, 200, 60000, 1, false, false, 0.1},
           AutoCase{16, 512, 1, 256, 60000, 1, false, false, 0.1},
       }) {
    CheckCase(ac);
  }
}

// No valid entry (every slot -1, -2, S, S + 1 or an int32 extreme): union 0 of the walked
// slots -> the low-head kernel (it skips blocks with nothing to gather), out 0 and lse -inf as
// the reference says; no workspace: cuda_mma alone, still correct; T 0.
TEST(SparseMlaAutoGpu, EmptySelectionsNoWorkspaceAndNoTokens) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng = MakeRng();
  for (int64_t k : {int64_t{64}, int64_t{70}}) {
    SparseMlaSpec spec;
    spec.h = 16;
    spec.d_qk = 512;
    spec.t = 5;
    spec.k = k;
    spec.s = 100;
    spec.masked_fraction = 1.0;
    const std::vector<std::vector<int32_t>> slots = RandomSlots(spec, rng);
    SparseMlaCase c(spec, rng, slots, {});
    const Params p = c.MakeParams(false);
    const Reference ref = ComputeReference(p);
    for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
    MmaAutoHeader got;
    const absl::Status st = RunAuto(p, &got);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(got.choice, kAutoChoseLowh);
    EXPECT_EQ(got.valid_entries, 0);
    EXPECT_EQ(got.union_rows, 0);
    // Two groups (of 4 tokens and of 1); K 64: one block each, every slot; K 70: blocks 0 and
    // 1 of each, every slot.
    EXPECT_EQ(got.walked_slots, 5 * k);
    EXPECT_EQ(got.walked_slots, ExpectedHeader(slots, spec.s, 4, 64).walked_slots);
    ExpectOutputs(c, p, ref, "K " + std::to_string(k));
  }
  {
    SparseMlaSpec spec;
    spec.h = 16;
    spec.d_qk = 512;
    spec.t = 9;
    spec.k = 2051;  // several splits were there a workspace: here one, ungated
    spec.s = 4000;
    SparseMlaCase c(spec, rng, PooledSlots(spec, 8, rng), {});
    const Params p = c.MakeParams(true);
    const Reference ref = ComputeReference(p);
    for (HostTensor* o : c.Outputs()) PoisonNaN(*o);
    MmaAutoHeader got;
    const absl::Status st = RunAuto(p, &got, /*no_workspace=*/true);
    ASSERT_TRUE(st.ok()) << st;
    ExpectOutputs(c, p, ref, "without workspace");
  }
  {
    SparseMlaSpec spec;
    spec.h = 16;
    spec.d_qk = 512;
    spec.t = 0;
    SparseMlaCase c(spec, rng);
    MmaAutoHeader got;
    const absl::Status st = RunAuto(c.MakeParams(false), &got);
    EXPECT_TRUE(st.ok()) << st;
  }
}

// Dispatch picks cuda_mma_auto for H <= 32 with a bf16 cache, and not for H 64 or the FP8 cache;
// its alternative is the ping-pong kernel in FAST on compute capability 9.0, else cuda_mma.
TEST(SparseMlaAutoGpu, DispatchOrder) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng = MakeRng();
  SparseMlaSpec spec;
  spec.h = 16;
  SparseMlaCase c(spec, rng);
  std::string why;
  EXPECT_TRUE(kernels::sparse_mla::gpu::MmaAutoSupports(c.MakeParams(false), &why)) << why;
  {
    using kernels::sparse_mla::gpu::GpuKernel;
    using kernels::sparse_mla::gpu::MmaAutoAlternative;
    gpu::DeviceFacts d;
    ASSERT_TRUE(gpu::CurrentDeviceFacts(&d));
    Params p = c.MakeParams(false);
    p.precision = kernels::Precision::kHigh;
    EXPECT_EQ(MmaAutoAlternative(p), GpuKernel::kMma);
    p.precision = kernels::Precision::kFast;
    EXPECT_EQ(MmaAutoAlternative(p),
              d.cc_major == 9 && d.cc_minor == 0 ? GpuKernel::kWgmmaPp : GpuKernel::kMma);
  }
  spec.h = 64;
  SparseMlaCase wide(spec, rng);
  EXPECT_FALSE(kernels::sparse_mla::gpu::MmaAutoSupports(wide.MakeParams(false), &why));
  EXPECT_NE(why.find("q: dim 1 is 64"), std::string::npos) << why;
  spec.h = 16;
  spec.kv_format = KvFormat::kFp8;
  SparseMlaCase fp8(spec, rng);
  why.clear();
  EXPECT_FALSE(kernels::sparse_mla::gpu::MmaAutoSupports(fp8.MakeParams(false), &why));
  EXPECT_NE(why.find("kv:"), std::string::npos) << why;
}

#else  // no CUDA backend in this build

TEST(SparseMlaAutoGpu, NeedsACudaBuild) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif

}  // namespace
}  // namespace attnd::testing
