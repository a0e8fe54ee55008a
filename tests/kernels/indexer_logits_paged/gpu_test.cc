// GPU-only cases of indexer_logits_paged (skipped without a GPU): the block table read only below
// each context, checked against a device allocation that ends right after the last request's
// used entries, so compute-sanitizer (memcheck) reports any later read; the ROCm frontends'
// caches on the GPU implementations alone; the Hopper kernel (cuda_wgmma, FAST, and its opt-in
// forms) on its own at every wgmma width, with masked pages, many key chunks, per-token lengths,
// padded strides and, for the split from the lengths, ragged batches.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/harness/harness.h"
#include "tests/kernels/indexer_logits_paged/frontend_caches.h"
#include "tests/kernels/indexer_logits_paged/paged_problem.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/common/gpu/runtime.h"
#include "kernels/indexer_logits_paged/gpu/launch.h"
#endif

namespace attnd::kernels::indexer_logits_paged {
namespace {

using testing::MakeRng;

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)

// Each GPU implementation of this build in each precision (unsupported pairs are skipped by
// the callers through Supports).
std::vector<std::pair<Impl<Params>, Precision>> GpuRuns() {
  std::vector<std::pair<Impl<Params>, Precision>> runs;
  for (const auto& impl : Implementations()) {
    if (impl.backend != testing::GpuBackend()) continue;
    for (const Precision precision : testing::kPrecisions) runs.emplace_back(impl, precision);
  }
  return runs;
}

// A device buffer of exactly `bytes` (no slack: memcheck flags a read past it).
class TightDeviceBuffer {
 public:
  explicit TightDeviceBuffer(int64_t bytes) {
    if (::attnd::gpu::Malloc(&data_, static_cast<size_t>(bytes)) != ::attnd::gpu::kSuccess)
      data_ = nullptr;
  }
  ~TightDeviceBuffer() {
    if (data_ != nullptr) ::attnd::gpu::Free(data_);
  }
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
};

// Row b of the table holds its 3 used entries (contexts 130, 150, 192 at block size 64) and
// max_blocks is 8; the allocation stops after the last row's third entry.
TEST(IndexerLogitsPagedGpu, ReadsBlockTableOnlyBelowContext) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  auto rng = MakeRng();
  const PagedShape shape{3, 2, 32, 128, 64, 8, 12, 512};  // D 128: cuda_wgmma's shape too
  PagedProblem prob(shape, rng);
  prob.SetContexts({130, 150, 192});
  Params host = prob.params();
  const int64_t used = 3, table_ints = (shape.batch - 1) * shape.max_blocks + used;
  TightDeviceBuffer table(4 * table_ints);
  ASSERT_NE(table.data(), nullptr);
  ASSERT_EQ(::attnd::gpu::MemcpyH2DAsync(table.data(), prob.block_table.data<int32_t>(),
                                         static_cast<size_t>(4 * table_ints), nullptr),
            ::attnd::gpu::kSuccess);
  ASSERT_EQ(::attnd::gpu::StreamSynchronize(nullptr),
            ::attnd::gpu::kSuccess);  // before the mirrors' streams read it
  const RefLogits ref = Reference(host);
  int runs = 0;
  for (const auto& [impl, precision] : GpuRuns()) {
    host.precision = precision;
    std::string why;
    if (impl.supports && !impl.supports(host, &why)) continue;
    SCOPED_TRACE("implementation " + impl.name + " (" + PrecisionName(precision) + ")");
    testing::PoisonNaN(prob.logits);
    testing::DeviceMirror mirror;
    Params device = host;
    for (Tensor* t :
         {&device.q, &device.kv_cache, &device.context_lens, &device.weights, &device.logits}) {
      ASSERT_TRUE(mirror.Mirror(*t).ok());
    }
    device.block_table.data = table.data();  // spans past the allocation: the point of the test
    ExecContext ctx;
    ctx.backend = testing::GpuBackend();
    ctx.stream = mirror.stream();
    const absl::Status status = impl.run(device, ctx);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(mirror.CopyBack(device.logits, host.logits).ok());
    ASSERT_TRUE(mirror.Synchronize().ok());
    testing::ExpectLogits(host.logits, ref,
                          testing::ToleranceFor(shape.heads, shape.dim, precision), impl.name);
    ++runs;
  }
  EXPECT_GE(runs, 3);  // cuda_mma and cuda_simt (HIGH); cuda_wgmma too on compute capability 9.0
}

#if defined(ATTND_GPU_CUDA)
// The Hopper kernel in FAST on `prob`, in each of its forms (cuda_wgmma, cuda_wgmma2p with a
// producer per consumer, cuda_wgmma_bal with the split from the lengths), each against the
// reference on poisoned logits; skips off compute capability 9.0. Fails when a form refuses the
// params for any other reason.
void ExpectWgmmaRuns(PagedProblem& prob, const Params& p) {
  for (const char* name : {"cuda_wgmma", "cuda_wgmma2p", "cuda_wgmma_bal"}) {
    std::string why;
    const bool ran = prob.RunOne(p, name, Precision::kFast, &why);
    if (!ran && why.find("compute capability") != std::string::npos) {
      GTEST_SKIP() << why;
    }
    EXPECT_TRUE(ran) << name << ": " << why;
  }
}

class WgmmaShapeTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

// next_n 1 to 5 × H 32 / 64 (wgmma N 64, 128 and 256, and next_n past one block's queries):
// contexts 0, 1, 63, 64, 65, one past the table (clamped), and ragged ones, N 1600 (not a
// multiple of 64), pages shuffled over a pool.
TEST_P(WgmmaShapeTest, MatchesReference) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  const auto [next_n, heads] = GetParam();
  auto rng = MakeRng();
  PagedProblem prob({9, next_n, heads, 128, 64, 24, 260, 1600}, rng);
  std::uniform_int_distribution<int64_t> len(2, 1599);
  prob.SetContexts({0, 1, 63, 64, 65, 2000, len(rng), len(rng), 1600});
  ExpectWgmmaRuns(prob, prob.params());
}

INSTANTIATE_TEST_SUITE_P(IndexerLogitsPagedGpu, WgmmaShapeTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::Values(32, 64)),
                         [](const auto& info) {
                           return "NextN" + std::to_string(std::get<0>(info.param)) + "_H" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Masked pages inside the windows (ids -1, num_blocks, INT32_MAX, INT32_MIN; a run of two):
// -inf there, never read; the rest of each row as usual. One request with a long context and a
// short N split into many key chunks (one page each at the extreme).
TEST(IndexerLogitsPagedGpu, WgmmaMaskedPagesAndChunks) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  auto rng = MakeRng();
  {
    PagedProblem prob({3, 2, 64, 128, 64, 12, 40, 768}, rng);
    prob.SetContexts({768, 700, 300});
    int32_t* table = prob.block_table.data<int32_t>();
    const int64_t ts = prob.block_table.tensor().stride(0);
    table[0 * ts + 0] = -1;
    table[0 * ts + 5] = 40;
    table[0 * ts + 6] = INT32_MAX;
    table[1 * ts + 10] = INT32_MIN;
    table[2 * ts + 4] = -3;  // the last, partial page of request 2
    ExpectWgmmaRuns(prob, prob.params());
  }
  for (const int64_t cols : {int64_t{64}, int64_t{4096}, int64_t{20000}}) {
    SCOPED_TRACE("N " + std::to_string(cols));
    PagedProblem prob({1, 1, 64, 128, 64, (cols + 63) / 64, (cols + 63) / 64, cols}, rng);
    prob.SetContexts({cols - 3});
    ExpectWgmmaRuns(prob, prob.params());
  }
}

// Per-token lengths in any order along next_n, padded strides (multiples of 16 bytes, as TMA
// needs), and a logits row stride past N whose padding must stay poisoned.
TEST(IndexerLogitsPagedGpu, WgmmaTokenLengthsAndPaddedStrides) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  auto rng = MakeRng();
  PagedProblem prob({3, 4, 32, 128, 64, 10, 30, 640, 16}, rng);
  prob.SetTokenLengths({{640, 0, 65, 64}, {1, 2, 3, 4}, {300, 129, 600, 0}}, /*row_pad=*/3);
  ExpectWgmmaRuns(prob, prob.params());
}

// The split from the lengths (cuda_wgmma_bal) where it cuts unevenly: ragged batches with
// empty, one-page, partial-page and clamped contexts; fewer query blocks than CTA slots (many
// one-page pieces), more (one piece a block), and next_n 3 with per-token lengths (wgmma N
// 256, one CTA per SM). More than kPagedBalancedMaxBlocks query blocks are refused by name.
TEST(IndexerLogitsPagedGpu, WgmmaBalancedRaggedBatches) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  auto rng = MakeRng();
  const auto ragged = [&](int64_t batch, int64_t cols) {
    std::uniform_int_distribution<int64_t> len(0, cols + 100);
    std::vector<int64_t> c(static_cast<size_t>(batch));
    for (int64_t& v : c) v = len(rng);
    c[0] = 0;
    c[1] = 1;
    c[2] = 64;
    c[3] = cols;
    c[4] = cols + 1000;  // past the table: clamped
    return c;
  };
  {
    SCOPED_TRACE("B 200 next_n 1 H64, N 2048");
    PagedProblem prob({200, 1, 64, 128, 64, 32, 900, 2048}, rng);
    prob.SetContexts(ragged(200, 2048));
    ExpectWgmmaRuns(prob, prob.params());
  }
  {
    SCOPED_TRACE("B 300 next_n 1 H32, N 512: more blocks than CTA slots");
    PagedProblem prob({300, 1, 32, 128, 64, 8, 700, 512}, rng);
    prob.SetContexts(ragged(300, 512));
    ExpectWgmmaRuns(prob, prob.params());
  }
  {
    SCOPED_TRACE("B 40 next_n 3 H64, N 1000, per-token lengths");
    PagedProblem prob({40, 3, 64, 128, 64, 16, 400, 1000}, rng);
    std::vector<std::vector<int64_t>> lens(40);
    std::uniform_int_distribution<int64_t> len(0, 1000);
    for (auto& row : lens) row = {len(rng), len(rng), len(rng)};
    lens[0] = {0, 0, 0};
    lens[1] = {1000, 0, 65};
    prob.SetTokenLengths(lens);
    ExpectWgmmaRuns(prob, prob.params());
  }
  {
    PagedProblem prob({2049, 1, 64, 128, 64, 1, 64, 64}, rng);
    prob.SetContexts(std::vector<int64_t>(2049, 64));
    std::string why;
    if (!gpu::WgmmaSupports(prob.params(), &why)) GTEST_SKIP() << why;
    EXPECT_FALSE(gpu::WgmmaBalSupports(prob.params(), &why));
    EXPECT_NE(why.find("query blocks"), std::string::npos) << why;
  }
}

// HIGH is refused naming the precision, so dispatch gives FAST to cuda_wgmma and HIGH to the
// exact kernels; other refusals name their field.
TEST(IndexerLogitsPagedGpu, WgmmaRunsFastOnly) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  auto rng = MakeRng();
  PagedProblem prob({2, 1, 64, 128, 64, 4, 8, 256}, rng);
  prob.SetContexts({256, 100});
  Params p = prob.params();
  std::string why;
  p.precision = Precision::kHigh;
  EXPECT_FALSE(gpu::WgmmaSupports(p, &why));
  EXPECT_NE(why.find("precision"), std::string::npos) << why;
  p.precision = Precision::kFast;
  why.clear();
  if (!gpu::WgmmaSupports(p, &why)) {
    ASSERT_NE(why.find("compute capability"), std::string::npos) << why;
    GTEST_SKIP() << why;
  }
  ExecContext ctx;
  ctx.backend = testing::GpuBackend();
  const Impl<Params>* fast = SelectImpl(Implementations(), p, ctx, &why);
  ASSERT_NE(fast, nullptr) << why;
  EXPECT_EQ(fast->name, "cuda_wgmma");
  p.precision = Precision::kHigh;
  const Impl<Params>* high = SelectImpl(Implementations(), p, ctx, &why);
  ASSERT_NE(high, nullptr) << why;
  EXPECT_EQ(high->name, "cuda_mma");
  p.precision = Precision::kFast;
  Params other = p;
  other.block_size = 32;
  why.clear();
  EXPECT_FALSE(gpu::WgmmaSupports(other, &why));
  EXPECT_NE(why.find("block_size"), std::string::npos) << why;
}
#endif

// The ROCm caches (frontend_caches.h) on the GPU implementations alone: AITER's shuffled layout
// runs on the portable kernel (the CUDA tensor-core kernel refuses it: not an H200 layout), and
// so does vLLM's NORMAL / SGLang's HIP cache at block size 1, against the fp64 reference.
TEST(IndexerLogitsPagedGpu, RocmLayoutsOnPortableKernel) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::vector<Impl<Params>> gpu_impls;
  for (const auto& impl : Implementations()) {
    if (impl.backend == testing::GpuBackend()) gpu_impls.push_back(impl);
  }
  struct Case {
    Frontend frontend;
    CacheLayout layout;
    PagedShape shape;
  };
  const Case cases[] = {
      {Frontend::kVllmRocm, CacheLayout::kIndexerAiterShuffle16, {4, 1, 64, 128, 64, 20, 90, 1280}},
      {Frontend::kVllmRocm,
       CacheLayout::kIndexerAiterShuffle16,
       {3, 2, 32, 128, 64, 8, 30, 500, 5}},
      {Frontend::kAiter, CacheLayout::kIndexerAiterShuffle16, {2, 1, 7, 64, 16, 20, 50, 300}},
      {Frontend::kVllmRocm, CacheLayout::kIndexerFp8Blocks, {3, 1, 64, 128, 1, 400, 1300, 400}},
      {Frontend::kSglangHip, CacheLayout::kUnspecified, {3, 2, 64, 128, 1, 400, 1300, 400}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(CacheLayoutName(c.layout)) + " block " +
                 std::to_string(c.shape.block_size));
    auto rng = MakeRng();
    PagedProblem prob(c.shape, rng);
    FillFrontendCache(prob.kv_cache, c.shape.block_size, c.shape.dim, c.frontend, rng);
    const int64_t cols = c.shape.cols;
    prob.SetContexts(std::vector<int64_t>(c.shape.batch, cols));
    prob.context_lens.data<int32_t>()[0] = 17;  // one short, ragged row
    Params p = prob.params();
    p.kv_cache_layout = c.layout;
#if defined(ATTND_GPU_CUDA)
    std::string why;
    if (c.layout == CacheLayout::kIndexerAiterShuffle16) {
      EXPECT_FALSE(gpu::MmaSupports(p, &why));
      EXPECT_NE(why.find("kv_cache_layout"), std::string::npos) << why;
    }
#endif
    EXPECT_GE(prob.RunAndCheck(p, gpu_impls), 1);
  }
}

#else

TEST(IndexerLogitsPagedGpu, ReadsBlockTableOnlyBelowContext) {
  GTEST_SKIP() << "no GPU backend in this build";
}

TEST(IndexerLogitsPagedGpu, RocmLayoutsOnPortableKernel) {
  GTEST_SKIP() << "no GPU backend in this build";
}

#endif

}  // namespace
}  // namespace attnd::kernels::indexer_logits_paged
