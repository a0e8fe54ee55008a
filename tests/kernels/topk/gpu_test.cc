// GPU-only checks of top-k where the GPU is the point: the GPU implementation writes exactly the
// CPU implementation's output (same columns or slots, ascending order, ties to the lowest
// columns, padding, untouched row padding), which the set-based harness cases do not pin down;
// and logits / outputs whose offsets pass 2^31 elements (real multi-GB allocations). Skipped
// without a GPU; builds everywhere.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/topk/topk.h"
#include "tests/harness/harness.h"
#include "tests/kernels/topk/topk_case.h"

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#include "kernels/common/gpu/runtime.h"
#endif
#if defined(ATTND_GPU_CUDA)
#include "kernels/topk/gpu/filter.h"
#endif

namespace attnd::kernels::topk {
namespace {

using testing::HostTensor;
using testing::MakeRng;

// Every GPU implementation of the op list (the streaming kernel first on CUDA, then SIMT).
std::vector<const Impl<Params>*> GpuImpls() {
  std::vector<const Impl<Params>*> out;
  for (const auto& impl : Implementations()) {
    if (impl.backend != Backend::kCpu && impl.backend == testing::GpuBackend())
      out.push_back(&impl);
  }
  return out;
}

const Impl<Params>* CpuImpl() {
  for (const auto& impl : Implementations()) {
    if (impl.backend == Backend::kCpu) return &impl;
  }
  return nullptr;
}

std::vector<uint8_t> Bytes(const HostTensor& t) {
  return std::vector<uint8_t>(t.raw(), t.raw() + t.bytes());
}

// Runs `gpu_impl` on the case (outputs poisoned first) and expects the CPU's output bytes.
void ExpectImplEqualsCpu(const Impl<Params>& gpu_impl, TopKCase& c,
                         const std::vector<uint8_t>& want_indices,
                         const std::vector<uint8_t>& want_values) {
  testing::PoisonNaN(c.indices);
  if (c.p.values.present()) testing::PoisonNaN(c.values);
  const absl::Status status = testing::RunOnGpu(gpu_impl, c.p);
  ASSERT_TRUE(status.ok()) << status;
  const int32_t* got = c.indices.data<int32_t>();
  const int32_t* want = reinterpret_cast<const int32_t*>(want_indices.data());
  const int64_t n = c.indices.bytes() / 4;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (got[i] != want[i] && bad++ < 5) {
      ADD_FAILURE() << "indices element " << i << " (row " << i / c.indices.tensor().stride(0)
                    << ") is " << got[i] << ", cpu wrote " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << "indices differ from the cpu's";
  if (c.p.values.present()) {
    EXPECT_TRUE(Bytes(c.values) == want_values) << "values differ from the cpu's";
  }
}

// Runs the CPU and each GPU implementation on the case (outputs poisoned before each) and expects
// identical output bytes, padding between rows included.
void ExpectGpuEqualsCpu(TopKCase& c) {
  ASSERT_TRUE(Validate(c.p).ok()) << Validate(c.p);
  ASSERT_FALSE(GpuImpls().empty());
  testing::PoisonNaN(c.indices);
  if (c.p.values.present()) testing::PoisonNaN(c.values);
  ExecContext cpu;
  cpu.pool = testing::TestPool();
  ASSERT_TRUE(CpuImpl()->run(c.p, cpu).ok());
  const std::vector<uint8_t> want_indices = Bytes(c.indices);
  const std::vector<uint8_t> want_values =
      c.p.values.present() ? Bytes(c.values) : std::vector<uint8_t>{};
  for (const Impl<Params>* gpu_impl : GpuImpls()) {
    SCOPED_TRACE(gpu_impl->name);
    std::string why;
#if defined(ATTND_GPU_CUDA)
    if (gpu_impl->name == "cuda_filter" && !gpu::FilterTakesShape(c.rows(), c.cols())) {
      continue;  // those go to cuda_stream; TopKFilterGpu forces them through
    }
#endif
    ASSERT_TRUE(gpu_impl->supports(c.p, &why)) << why;
    ExpectImplEqualsCpu(*gpu_impl, c, want_indices, want_values);
  }
}

// Rows whose requests come from req_id_per_row (`by_cu` false; ids out of range included) or
// cu_seqlens_q (`hostile`: non-monotone), pages of `page` slots `2 * page` apart.
void SetRequestMap(TopKCase& c, int64_t page, bool by_cu, bool hostile) {
  const int64_t m = c.rows(), requests = 3;
  const int64_t blocks = (c.cols() + page - 1) / page - 5;  // the last pages are past the table
  std::vector<int32_t> ids, cu;
  if (by_cu) {
    cu = hostile ? std::vector<int32_t>{0, 5, 2, static_cast<int32_t>(m) - 1}
                 : std::vector<int32_t>{0, 2, 2, static_cast<int32_t>(m) - 1};
  } else {
    const int32_t pattern[] = {0, 2, 1, -1, 3, std::numeric_limits<int32_t>::min(), 1, 2};
    for (int64_t r = 0; r < m; ++r) ids.push_back(pattern[r % 8]);
  }
  c.AddRequestTable(requests, blocks, page, 2 * page, ids, cu);
  for (int64_t q = 0; q < requests; ++q) {
    for (int64_t b = 0; b < blocks; ++b) {
      c.Block(q, b) = static_cast<int32_t>((b * 7 + q * 13) % 100003);
    }
    c.Block(q, 1) = -1;
  }
}

class TopKGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  }
};

TEST_F(TopKGpu, SameOutputAsCpuOnTiesAndSpecials) {
  auto rng = MakeRng();
  const int64_t n = 32768 + 5;
  TopKCase c(6, n, 2048, WindowForm::kKsKe, /*with_values=*/true, /*logits_ld=*/n + 3,
             /*out_ld=*/2048 + 7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f, -0.0f, nan, -nan, -inf};
  for (int64_t j = 0; j < n; ++j) {
    c.Logit(0, j) = static_cast<float>(rng() % 16);                 // ties at every level
    c.Logit(1, j) = std::round(normal(rng) * 256.0f) / 256.0f;      // ties in a small bin
    c.Logit(2, j) = (rng() % 64 == 0) ? inf : specials[rng() % 5];  // threshold at +0
    c.Logit(3, j) = (rng() % 20 == 0) ? normal(rng) : -inf;         // fewer selectable than k
    c.Logit(4, j) = 0.5f;                                           // all equal
    c.Logit(5, j) = normal(rng);                                    // unique
  }
  c.SetFullWindows();
  c.SetWindow(5, 17, n - 9);
  ExpectGpuEqualsCpu(c);
}

TEST_F(TopKGpu, SameOutputAsCpuOnLongAndShortRows) {
  auto rng = MakeRng();
  TopKCase c(4, 131072, 2048, WindowForm::kLengths, /*with_values=*/true);
  testing::FillUniform(c.logits, rng, 1.0, 2.0);  // one octave: level 0 cannot gather
  const int64_t lengths[4] = {131072, 2047, 5, 0};
  for (int64_t r = 0; r < 4; ++r) c.SetWindow(r, 0, lengths[r]);
  ExpectGpuEqualsCpu(c);
}

TEST_F(TopKGpu, SameOutputAsCpuOnManyRows) {  // the 512-thread variant (many rows)
  auto rng = MakeRng();
  const int64_t m = 600, n = 9000;
  TopKCase c(m, n, 1024, WindowForm::kKsKe, /*with_values=*/true);
  testing::FillNormal(c.logits, rng, 1.0);
  for (int64_t r = 0; r < m; ++r) c.SetWindow(r, r % 7 - 3, n - m + r + 1);  // causal
  c.SetWindow(5, 100, 50);                                                   // empty
  ExpectGpuEqualsCpu(c);
}

TEST_F(TopKGpu, SameOutputAsCpuWithKvSlots) {
  auto rng = MakeRng();
  for (int64_t page : {48, 64}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << page);
    const int64_t m = 6, n = 20000, k = 2048;
    TopKCase c(m, n, k, WindowForm::kLengths, /*with_values=*/true);
    testing::FillNormal(c.logits, rng, 1.0);
    const int64_t lengths[m] = {n, n - 1, 3000, 1000, n / 2, n / 2 + 1};
    for (int64_t r = 0; r < m; ++r) c.SetWindow(r, 0, lengths[r]);
    const int64_t blocks = (n + page - 1) / page - 10;  // the last pages are past the table
    c.AddBlockTable(blocks, page, /*rows_per_request=*/2);
    for (int64_t q = 0; q < m / 2; ++q) {
      for (int64_t b = 0; b < blocks; ++b) c.Block(q, b) = static_cast<int32_t>((b * 7 + q) % 1000);
      c.Block(q, 3) = -1;
      c.Block(q, 9) = std::numeric_limits<int32_t>::max() / 16;  // slot past INT32_MAX
    }
    ExpectGpuEqualsCpu(c);
  }
}

// IndexBase::kRowStart: positions from each window start, plain and through the block table.
TEST_F(TopKGpu, SameOutputAsCpuRowStart) {
  auto rng = MakeRng();
  for (bool mapped : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "mapped " << mapped);
    const int64_t m = 8, n = 20000, k = 2048;
    TopKCase c(m, n, k, WindowForm::kKsKe, /*with_values=*/true);
    testing::FillNormal(c.logits, rng, 1.0);
    const int64_t begins[m] = {0, 1, 4097, 10000, -5, 19990, 300, n + 2};
    const int64_t ends[m] = {n, n, 4097 + 3000, 10000 + 2048, 5000, n + 7, 300, n + 9};
    for (int64_t r = 0; r < m; ++r) c.SetWindow(r, begins[r], ends[r]);
    c.p.index_base = IndexBase::kRowStart;
    if (mapped) {
      const int64_t page = 64, blocks = (n + page - 1) / page - 100;  // the last positions: -1
      c.AddBlockTable(blocks, page, /*rows_per_request=*/2);
      for (int64_t q = 0; q < m / 2; ++q) {
        for (int64_t b = 0; b < blocks; ++b)
          c.Block(q, b) = static_cast<int32_t>((b * 5 + q) % 997);
        c.Block(q, 2) = -1;
      }
    }
    ExpectGpuEqualsCpu(c);
  }
}

// The request of a row by req_id_per_row or cu_seqlens_q (hostile values included), a block
// stride of two pages, page 1 (token tables) and 64; both index bases.
TEST_F(TopKGpu, SameOutputAsCpuWithRequestMap) {
  auto rng = MakeRng();
  for (int64_t page : {1, 64}) {
    for (int variant = 0; variant < 3; ++variant) {
      SCOPED_TRACE(::testing::Message() << "page " << page << " variant " << variant);
      const int64_t m = 8, n = 20000, k = 2048;
      TopKCase c(m, n, k, WindowForm::kKsKe, /*with_values=*/variant != 1);
      testing::FillNormal(c.logits, rng, 1.0);
      const int64_t begins[m] = {0, 1, 4097, 10000, -5, 19990, 300, 0};
      const int64_t ends[m] = {n, n, 4097 + 3000, 10000 + 2048, 5000, n + 7, 300, n};
      for (int64_t r = 0; r < m; ++r) c.SetWindow(r, begins[r], ends[r]);
      if (variant == 2) c.p.index_base = IndexBase::kRowStart;
      SetRequestMap(c, page, /*by_cu=*/variant != 0, /*hostile=*/variant == 2);
      ExpectGpuEqualsCpu(c);
    }
  }
}

// Logits rows and output rows 2^27 + a few elements apart: row 16 starts past 2^31 elements
// (8 GiB) in the logits, the indices and the values. ~26 GB of device memory.
TEST_F(TopKGpu, OffsetsPast2To31Elements) {
#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
  auto rng = MakeRng();
  const int64_t m = 17, n = 40000, k = 2048;
  const int64_t logits_ld = (int64_t{1} << 27) + 3, out_ld = (int64_t{1} << 27) + 1;
  TopKCase host(m, n, k, WindowForm::kKsKe, /*with_values=*/true);
  testing::FillNormal(host.logits, rng, 1.0);
  for (int64_t r = 0; r < m; ++r) host.SetWindow(r, r * 100, n - r * 50);
  ExecContext cpu;
  cpu.pool = testing::TestPool();
  ASSERT_TRUE(CpuImpl()->run(host.p, cpu).ok());

  testing::DeviceMirror dev;
  void *logits = nullptr, *indices = nullptr, *values = nullptr, *ks = nullptr, *ke = nullptr;
  ASSERT_TRUE(dev.Allocate(4 * ((m - 1) * logits_ld + n), &logits).ok());
  ASSERT_TRUE(dev.Allocate(4 * ((m - 1) * out_ld + k), &indices).ok());
  ASSERT_TRUE(dev.Allocate(4 * ((m - 1) * out_ld + k), &values).ok());
  ASSERT_TRUE(dev.Allocate(4 * m, &ks).ok());
  ASSERT_TRUE(dev.Allocate(4 * m, &ke).ok());
  const ::attnd::gpu::Stream stream = static_cast<::attnd::gpu::Stream>(dev.stream());
  for (int64_t r = 0; r < m; ++r) {
    ASSERT_EQ(::attnd::gpu::MemcpyH2DAsync(static_cast<float*>(logits) + r * logits_ld,
                                           host.logits.data<float>() + r * n, 4 * n, stream),
              ::attnd::gpu::kSuccess);
  }
  ASSERT_EQ(::attnd::gpu::MemcpyH2DAsync(ks, host.ks.raw(), 4 * m, stream), ::attnd::gpu::kSuccess);
  ASSERT_EQ(::attnd::gpu::MemcpyH2DAsync(ke, host.ke.raw(), 4 * m, stream), ::attnd::gpu::kSuccess);

  Params p = host.p;
  p.logits = MakeStridedTensor(logits, DType::kF32, {m, n}, {logits_ld, 1});
  p.ks = MakeTensor(ks, DType::kI32, {m});
  p.ke = MakeTensor(ke, DType::kI32, {m});
  p.indices = MakeStridedTensor(indices, DType::kI32, {m, k}, {out_ld, 1});
  p.values = MakeStridedTensor(values, DType::kF32, {m, k}, {out_ld, 1});
  ASSERT_TRUE(Validate(p).ok()) << Validate(p);
  ExecContext ctx;
  ctx.backend = testing::GpuBackend();
  ctx.stream = dev.stream();
  for (const Impl<Params>* gpu_impl : GpuImpls()) {
    SCOPED_TRACE(gpu_impl->name);
    ASSERT_EQ(::attnd::gpu::MemsetAsync(indices, 0xff, 4 * ((m - 1) * out_ld + k), stream),
              ::attnd::gpu::kSuccess);
    ASSERT_EQ(::attnd::gpu::MemsetAsync(values, 0xff, 4 * ((m - 1) * out_ld + k), stream),
              ::attnd::gpu::kSuccess);
    ASSERT_TRUE(gpu_impl->run(p, ctx).ok());
    std::vector<int32_t> got_indices(static_cast<size_t>(m * k));
    std::vector<float> got_values(static_cast<size_t>(m * k));
    for (int64_t r = 0; r < m; ++r) {
      ASSERT_EQ(
          ::attnd::gpu::MemcpyD2HAsync(got_indices.data() + r * k,
                                       static_cast<int32_t*>(indices) + r * out_ld, 4 * k, stream),
          ::attnd::gpu::kSuccess);
      ASSERT_EQ(
          ::attnd::gpu::MemcpyD2HAsync(got_values.data() + r * k,
                                       static_cast<float*>(values) + r * out_ld, 4 * k, stream),
          ::attnd::gpu::kSuccess);
    }
    ASSERT_TRUE(dev.Synchronize().ok());
    for (int64_t r = 0; r < m; ++r) {
      SCOPED_TRACE(::testing::Message() << "row " << r);
      ASSERT_EQ(
          std::memcmp(got_indices.data() + r * k, host.indices.data<int32_t>() + r * k, 4 * k), 0);
      ASSERT_EQ(std::memcmp(got_values.data() + r * k, host.values.data<float>() + r * k, 4 * k),
                0);
    }
  }
#else
  GTEST_SKIP() << "no GPU backend in this build";
#endif
}

}  // namespace
}  // namespace attnd::kernels::topk
