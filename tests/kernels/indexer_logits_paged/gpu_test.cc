// GPU-only cases of indexer_logits_paged (skipped without a GPU): the block table read only below
// each context, checked against a device allocation that ends right after the last request's
// used entries, so compute-sanitizer (memcheck) reports any later read; the ROCm frontends'
// caches on the GPU implementations alone.
#include <cstdint>
#include <cstring>
#include <string>
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
  const PagedShape shape{3, 2, 32, 64, 64, 8, 12, 512};
  PagedProblem prob(shape, rng);
  prob.SetContexts({130, 150, 192});
  const Params host = prob.params();
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
  for (const auto& impl : Implementations()) {
    if (impl.backend != testing::GpuBackend()) continue;
    std::string why;
    if (impl.supports && !impl.supports(host, &why)) continue;
    SCOPED_TRACE("implementation " + impl.name);
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
    testing::ExpectLogits(host.logits, ref, testing::ToleranceFor(shape.heads, shape.dim),
                          impl.name);
    ++runs;
  }
  EXPECT_GE(runs, 1);
}

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
