// GPU-only cases of indexer_logits_paged (skipped without a GPU): the block table read only below
// each context, checked against a device allocation that ends right after the last request's
// used entries, so compute-sanitizer (memcheck) reports any later read; and the Hopper kernel,
// called directly, against the reference on compute capability 9.0.
#include <climits>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/harness/harness.h"
#include "tests/kernels/indexer_logits_paged/paged_problem.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/common/gpu/runtime.h"
#endif
#if defined(ATTND_GPU_CUDA)
#include "kernels/indexer_logits/gpu/device_info.h"
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

#if defined(ATTND_GPU_CUDA)
// The Hopper kernel (not dispatched yet, so called directly) against the reference on compute
// capability 9.0: next_n 1/2/4 × H 32, 64, 7 and 128 (padded to 32/64/128 heads) with contexts
// 0, 1, 63, 130, one past max_blocks · 64 and a random one (1600 columns: a partial last block);
// padded strides; long contexts over several CTAs per request, each wrapping its stage ring;
// masked table entries.
TEST(IndexerLogitsPagedGpu, WgmmaMatchesReference) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  if (indexer_logits::gpu::CurrentDeviceCapability() != 90) GTEST_SKIP() << "not sm_90";
  const std::vector<Impl<Params>> wgmma = {
      GpuImpl<Params>("wgmma", gpu::WgmmaSupports, gpu::LaunchWgmma)};
  auto rng = MakeRng();
  auto check = [&](const PagedShape& shape, const std::vector<int64_t>& contexts) {
    SCOPED_TRACE("next_n " + std::to_string(shape.next_n) + " H " + std::to_string(shape.heads) +
                 " cols " + std::to_string(shape.cols));
    PagedProblem prob(shape, rng);
    prob.SetContexts(contexts);
    std::string why;
    ASSERT_TRUE(gpu::WgmmaSupports(prob.params(), &why)) << why;
    EXPECT_EQ(prob.RunAndCheck(prob.params(), wgmma), 1);
  };
  for (const int64_t next_n : {1, 2, 4}) {
    for (const int64_t heads : {32, 64, 7, 128}) {
      const int64_t random = std::uniform_int_distribution<int64_t>(2, 1400)(rng);
      check({6, next_n, heads, 128, 64, 24, 150, 1600}, {0, 1, 63, 130, 2000, random});
    }
  }
  check({3, 2, 64, 128, 64, 20, 50, 1280, 16}, {1280, 577, 65});
  check({4, 1, 64, 128, 64, 160, 700, 10240}, {10240, 7000, 64, 3});
  check({4, 4, 32, 128, 64, 160, 700, 10240}, {10240, 9999, 130, 4});
  {  // masked table entries inside the contexts: -inf on their 64 positions
    PagedProblem prob({3, 2, 64, 128, 64, 8, 30, 512}, rng);
    prob.SetContexts({512, 300, 200});
    int32_t* table = prob.block_table.data<int32_t>();
    const int64_t ts = prob.block_table.tensor().stride(0);
    table[0 * ts + 1] = -1;
    table[1 * ts + 4] = 30;
    table[2 * ts + 0] = INT32_MIN;
    EXPECT_EQ(prob.RunAndCheck(prob.params(), wgmma), 1);
  }
}
#endif

#else

TEST(IndexerLogitsPagedGpu, ReadsBlockTableOnlyBelowContext) {
  GTEST_SKIP() << "no GPU backend in this build";
}

#endif

}  // namespace
}  // namespace attnd::kernels::indexer_logits_paged
