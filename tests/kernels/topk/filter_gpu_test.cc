// The threshold-filter GPU top-k (kernels/topk/gpu/filter.cu) under every launch choice it has:
// 256-, 512- and 1024-thread CTAs (the 256-thread one with the smaller buffer), clusters of 1, 2, 4
// and 8 CTAs per row, the sampled floor on and off (off, windows longer than the buffer take the
// exact re-reading path), the 256-thread CTA's floor refined to a level-1 bin or not, the L2
// prefetch off. Each
// must write exactly the CPU implementation's output (bytes of indices and values, ascending
// columns, ties to the lowest columns, -1 / -inf padding): long rows (256K), k = 4096, few and
// many rows, windows, ties and specials, a floor that leaves fewer than k (the fallback), buffer
// overflow (one-octave and tied rows), the buffer's size edges, KV slots, both index bases and
// the request maps. The 2^31-element cases of gpu_test.cc and stream_gpu_test.cc run it too (it
// is registered first). Skipped without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/topk/row_select.h"
#include "kernels/topk/topk.h"
#include "tests/harness/harness.h"
#include "tests/kernels/topk/topk_case.h"

#if defined(ATTND_GPU_CUDA)
#include "kernels/common/gpu/runtime.h"
#include "kernels/topk/gpu/filter.h"
#endif

namespace attnd::kernels::topk {
namespace {

using testing::MakeRng;

#if defined(ATTND_GPU_CUDA)

namespace vendor = ::attnd::gpu;

constexpr float kInf = std::numeric_limits<float>::infinity();

std::string Name(const gpu::FilterConfig& c) {
  return "t" + std::to_string(c.threads) + "_c" + std::to_string(c.cluster) +
         (c.speculate ? "_spec" : "_nospec") + (c.prefetch ? "" : "_noprefetch") +
         (c.fine_floor ? "" : "_coarse") +
         (c.floor_sigmas >= 0.0f ? "_sigma" + std::to_string(static_cast<int>(c.floor_sigmas))
                                 : "");
}

// Every forced launch choice.
std::vector<gpu::FilterConfig> AllConfigs() {
  std::vector<gpu::FilterConfig> out;
  for (int threads : {256, 512, 1024}) {
    for (int cluster : {1, 2, 4, 8}) {
      for (bool speculate : {true, false}) {
        gpu::FilterConfig c;
        c.threads = threads;
        c.cluster = cluster;
        c.speculate = speculate;
        out.push_back(c);
      }
    }
  }
  for (int threads : {512, 1024}) {  // without the L2 prefetch of each next segment
    gpu::FilterConfig c;
    c.threads = threads;
    c.cluster = threads == 512 ? 1 : 8;
    c.prefetch = false;
    out.push_back(c);
  }
  for (bool speculate : {true, false}) {  // 256 threads, the floor at the sample's level-0 bin
    gpu::FilterConfig c;
    c.threads = 256;
    c.cluster = 1;
    c.speculate = speculate;
    c.fine_floor = false;
    out.push_back(c);
  }
  for (int threads : {256, 512, 1024}) {  // floor margins other than the defaults
    gpu::FilterConfig c;
    c.threads = threads;
    c.cluster = threads == 1024 ? 4 : 1;
    c.floor_sigmas = threads == 256 ? 3.0f : 5.0f;
    out.push_back(c);
  }
  return out;
}

Impl<Params> ForcedImpl(const gpu::FilterConfig& config) {
  return Impl<Params>(Name(config), testing::GpuBackend(), nullptr,
                      [config](const Params& p, const ExecContext& ctx) -> absl::Status {
                        const vendor::Error e = gpu::LaunchTopkFilterWith(
                            p, config, static_cast<vendor::Stream>(ctx.stream));
                        if (e != vendor::kSuccess)
                          return absl::InternalError(vendor::ErrorString(e));
                        return absl::OkStatus();
                      });
}

const Impl<Params>* CpuImpl() {
  for (const auto& impl : Implementations()) {
    if (impl.backend == Backend::kCpu) return &impl;
  }
  return nullptr;
}

std::vector<uint8_t> Bytes(const testing::HostTensor& t) {
  return std::vector<uint8_t>(t.raw(), t.raw() + t.bytes());
}

// Runs the CPU implementation once and every forced configuration (outputs poisoned before each
// run) and expects the CPU's bytes, padding between output rows included.
void ExpectEveryConfigEqualsCpu(TopKCase& c) {
  ASSERT_TRUE(Validate(c.p).ok()) << Validate(c.p);
  testing::PoisonNaN(c.indices);
  if (c.p.values.present()) testing::PoisonNaN(c.values);
  ExecContext cpu;
  cpu.pool = testing::TestPool();
  ASSERT_TRUE(CpuImpl()->run(c.p, cpu).ok());
  const std::vector<uint8_t> want_indices = Bytes(c.indices);
  const std::vector<uint8_t> want_values =
      c.p.values.present() ? Bytes(c.values) : std::vector<uint8_t>{};
  for (const gpu::FilterConfig& config : AllConfigs()) {
    SCOPED_TRACE(Name(config));
    testing::PoisonNaN(c.indices);
    if (c.p.values.present()) testing::PoisonNaN(c.values);
    const absl::Status status = testing::RunOnGpu(ForcedImpl(config), c.p);
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
    ASSERT_EQ(bad, 0) << "indices differ from the cpu's";
    if (c.p.values.present()) {
      ASSERT_TRUE(Bytes(c.values) == want_values) << "values differ from the cpu's";
    }
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

class TopKFilterGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
    std::string why;
    if (!gpu::SupportsFilter(Params{}, &why)) GTEST_SKIP() << why;
  }
};

// Rows of 256K columns, k 2048 and 4096: normal, one octave (huge level-0 bins), ties at every
// level; full, misaligned and short windows.
TEST_F(TopKFilterGpu, LongRows256K) {
  auto rng = MakeRng();
  const int64_t n = 262144;
  for (int64_t k : {2048, 4096}) {
    SCOPED_TRACE(::testing::Message() << "k " << k);
    TopKCase c(4, n, k, WindowForm::kKsKe, /*with_values=*/true);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> octave(1.0f, 2.0f);
    for (int64_t j = 0; j < n; ++j) {
      c.Logit(0, j) = normal(rng);
      c.Logit(1, j) = octave(rng);
      c.Logit(2, j) = static_cast<float>(rng() % 64);
      c.Logit(3, j) = normal(rng);
    }
    c.SetWindow(0, 0, n);
    c.SetWindow(1, 5, n - 3);
    c.SetWindow(2, 1, n);
    c.SetWindow(3, 100, 100 + 3 * k + 1);
    ExpectEveryConfigEqualsCpu(c);
  }
}

// More rows than resident CTAs (the persistent loop) with causal, misaligned and empty windows.
TEST_F(TopKFilterGpu, ManyRowsCausalWindows) {
  auto rng = MakeRng();
  const int64_t m = 700, n = 9000;
  TopKCase c(m, n, 1024, WindowForm::kKsKe, /*with_values=*/true, /*logits_ld=*/n + 1,
             /*out_ld=*/1024 + 3);
  testing::FillNormal(c.logits, rng, 1.0);
  for (int64_t r = 0; r < m; ++r) c.SetWindow(r, r % 7 - 3, n - m + r + 1);
  c.SetWindow(5, 100, 50);       // empty
  c.SetWindow(6, n + 3, n + 9);  // past the end
  c.SetWindow(7, 17, 18);        // one column
  ExpectEveryConfigEqualsCpu(c);
}

// Indices only and no block table, the bench's and the indexer's form (WriteRow stages each
// warp's indices in the buffer and stores them in order), over the persistent loop: causal
// windows, misaligned starts, rows shorter than k, k 2048 and 4096 (the 256-thread CTA stages
// 4096 indices in its smaller buffer), both index bases.
TEST_F(TopKFilterGpu, IndicesOnly) {
  auto rng = MakeRng();
  for (int64_t k : {2048, 4096}) {
    SCOPED_TRACE(::testing::Message() << "k " << k);
    const int64_t m = 300, n = 40000;
    TopKCase c(m, n, k, WindowForm::kKsKe, /*with_values=*/false, /*logits_ld=*/0,
               /*out_ld=*/k + 5);
    testing::FillNormal(c.logits, rng, 1.0);
    for (int64_t r = 0; r < m; ++r) c.SetWindow(r, r % 3 == 0 ? r % 29 : 0, n - m + r + 1);
    c.SetWindow(3, 10, 10 + k / 2);  // shorter than k: -1 padding
    c.SetWindow(4, 7, 7);            // empty
    c.SetWindow(5, 1, 2 + k);        // k + 1 columns
    if (k == 4096) c.p.index_base = IndexBase::kRowStart;
    ExpectEveryConfigEqualsCpu(c);
  }
}

// Rows of up to 32K columns in a 32768-column tensor (bitmaps of 1024 words): WriteRow reads a
// thread's four bitmap words as one 16-byte load each, where 256 threads have four words each
// (windows of 24577..32768 columns) — with the last thread's words partly past the window, and
// misaligned starts — with and without values.
TEST_F(TopKFilterGpu, WordsInRegisters) {
  auto rng = MakeRng();
  for (const bool with_values : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "values " << with_values);
    const int64_t m = 260, n = 32768, k = 2048;
    TopKCase c(m, n, k, WindowForm::kKsKe, with_values, /*logits_ld=*/0, /*out_ld=*/k + 3);
    testing::FillNormal(c.logits, rng, 1.0);
    for (int64_t r = 0; r < m; ++r) {
      const int64_t start = r % 5 == 0 ? r % 37 : 0;
      const int64_t len = r % 2 == 0 ? n - start - r : 24577 + 31 * r;
      c.SetWindow(r, start, std::min(n, start + len));
    }
    ExpectEveryConfigEqualsCpu(c);
  }
}

TEST_F(TopKFilterGpu, TiesAndSpecials) {
  auto rng = MakeRng();
  const int64_t n = 40000 + 3;
  TopKCase c(6, n, 2048, WindowForm::kLengths, /*with_values=*/true);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {0.0f, -0.0f, nan, -nan, -kInf};
  for (int64_t j = 0; j < n; ++j) {
    c.Logit(0, j) = static_cast<float>(rng() % 16);                  // ties at every level
    c.Logit(1, j) = std::round(normal(rng) * 256.0f) / 256.0f;       // ties in a small bin
    c.Logit(2, j) = (rng() % 64 == 0) ? kInf : specials[rng() % 5];  // threshold at +0
    c.Logit(3, j) = (rng() % 20 == 0) ? normal(rng) : -kInf;         // fewer selectable than k
    c.Logit(4, j) = 0.5f;                                            // all equal
    c.Logit(5, j) = (j % 2) ? nan : -nan;                            // nothing selectable
  }
  c.SetFullWindows();
  ExpectEveryConfigEqualsCpu(c);
}

// A short run of large values at the front (fewer than k past the speculative floor: the row is
// read again), rising values (a compaction every chunk), and falling values.
TEST_F(TopKFilterGpu, SpeculationFallbackAndCompactions) {
  auto rng = MakeRng();
  const int64_t n = 65536;
  TopKCase c(3, n, 2048, WindowForm::kLengths, /*with_values=*/true);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t j = 0; j < n; ++j) {
    c.Logit(0, j) = normal(rng) + (j < 1000 ? 100.0f : 0.0f);
    c.Logit(1, j) = static_cast<float>(j) * 0.001f;
    c.Logit(2, j) = -static_cast<float>(j) * 0.001f;
  }
  c.SetFullWindows();
  ExpectEveryConfigEqualsCpu(c);
}

TEST_F(TopKFilterGpu, ShortRowsAndSmallK) {
  auto rng = MakeRng();
  for (int64_t k : {1, 7, 4096}) {
    SCOPED_TRACE(::testing::Message() << "k " << k);
    const int64_t n = 3 * k + 4100;
    TopKCase c(6, n, k, WindowForm::kKsKe, /*with_values=*/true);
    testing::FillNormal(c.logits, rng, 1.0);
    c.SetWindow(0, 0, n);
    c.SetWindow(1, 1, k);  // fewer than k
    c.SetWindow(2, 2, 2 + k);
    c.SetWindow(3, 3, 4 + k);
    c.SetWindow(4, 0, 0);
    c.SetWindow(5, n - 1, n);
    ExpectEveryConfigEqualsCpu(c);
  }
}

TEST_F(TopKFilterGpu, KvSlotsAndNoValues) {
  auto rng = MakeRng();
  for (int64_t page : {48, 64}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << page);
    const int64_t m = 6, n = 40000, k = 2048;
    TopKCase c(m, n, k, WindowForm::kLengths, /*with_values=*/page == 64);
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
    ExpectEveryConfigEqualsCpu(c);
  }
}

// IndexBase::kRowStart under every launch choice (a row split over a cluster writes positions
// from the window start, not from its segment).
TEST_F(TopKFilterGpu, RowStartWindowsAndKvSlots) {
  auto rng = MakeRng();
  for (bool mapped : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "mapped " << mapped);
    const int64_t m = 6, n = 40000, k = 2048;
    TopKCase c(m, n, k, WindowForm::kKsKe, /*with_values=*/!mapped);
    testing::FillNormal(c.logits, rng, 1.0);
    const int64_t begins[m] = {0, 3, 20001, 100, n - 10, -9};
    const int64_t ends[m] = {n, n - 3, n, 100 + k / 2, n + 50, 9000};
    for (int64_t r = 0; r < m; ++r) c.SetWindow(r, begins[r], ends[r]);
    c.p.index_base = IndexBase::kRowStart;
    if (mapped) {
      const int64_t page = 64, blocks = (n + page - 1) / page - 10;
      c.AddBlockTable(blocks, page, /*rows_per_request=*/3);
      for (int64_t q = 0; q < m / 3; ++q) {
        for (int64_t b = 0; b < blocks; ++b)
          c.Block(q, b) = static_cast<int32_t>((b * 3 + q) % 2000);
        c.Block(q, 5) = -1;
      }
    }
    ExpectEveryConfigEqualsCpu(c);
  }
}

// The request of a row by req_id_per_row or cu_seqlens_q (hostile values included), a block
// stride of two pages, page 1 (token tables) and 64; both index bases.
TEST_F(TopKFilterGpu, RequestMapAndBlockStride) {
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
      ExpectEveryConfigEqualsCpu(c);
    }
  }
}

// Rows shaped for each way the select on the buffer (FittedSelect) can end, in windows buffered
// whole (8000 columns) and floored from a sample (40000): the threshold bin taken whole (k equal
// large values), a last bin of at most 32 keys ranked by one warp with ties at the threshold, a
// first-level bin of thousands of keys (one huge value widens the range) that needs a second
// level before the warp, and a bin of 100 equal keys that walks down to single keys (shift 0).
// Positions are shuffled so a sample sees each kind of value.
TEST_F(TopKFilterGpu, FittedSelectLevels) {
  auto rng = MakeRng();
  for (int64_t n : {int64_t{8000}, int64_t{40000}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    const int64_t k = 2048;
    TopKCase c(4, n, k, WindowForm::kLengths, /*with_values=*/true);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<int64_t> cols(static_cast<size_t>(n));
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        cols[static_cast<size_t>(j)] = j;
        c.Logit(r, j) = normal(rng) - 4.0f;  // below every planted value
      }
      std::shuffle(cols.begin(), cols.end(), rng);
      auto plant = [&](int64_t i, float v) { c.Logit(r, cols[static_cast<size_t>(i)]) = v; };
      if (r == 0) {  // exactly k equal values: their bin is taken whole
        for (int64_t i = 0; i < k; ++i) plant(i, 5.0f);
      } else if (r == 1) {  // k - 8 distinct large values, then 20 ties of which 8 are taken
        for (int64_t i = 0; i < k - 8; ++i) plant(i, 100.0f + 0.001f * static_cast<float>(i));
        for (int64_t i = 0; i < 20; ++i) plant(k - 8 + i, 50.0f);
      } else if (r == 2) {  // one huge value; 3000 values 100 ulps apart just above 1
        plant(0, 1e30f);
        for (int64_t i = 1; i <= 3000; ++i) {
          plant(i, std::nextafter(1.0f, 2.0f) + 100.0f * static_cast<float>(i) * 1.1920929e-7f);
        }
      } else {  // k - 52 distinct large values, then 100 equal ones of which 52 are taken
        for (int64_t i = 0; i < k - 52; ++i) plant(i, 10.0f + 0.01f * static_cast<float>(i));
        for (int64_t i = 0; i < 100; ++i) plant(k - 52 + i, 7.0f);
      }
    }
    c.SetFullWindows();
    ExpectEveryConfigEqualsCpu(c);
  }
}

// Windows around the buffers' sizes (buffered whole up to 8192 columns, floored from 8193; 4608
// and 4609 in the 256-thread CTA), rows whose selectable entries fit the buffer although the
// window does not (the floor-less path without speculation), and a window whose floor leaves
// exactly k.
TEST_F(TopKFilterGpu, BufferEdges) {
  auto rng = MakeRng();
  const int64_t n = 8192 * 3 + 5, k = 2048;
  TopKCase c(10, n, k, WindowForm::kKsKe, /*with_values=*/true, /*logits_ld=*/n + 2);
  testing::FillNormal(c.logits, rng, 1.0);
  for (int64_t j = 0; j < n; ++j) {  // row 4: 3000 selectable among -inf
    if (j % 8 != 0) c.Logit(4, j) = -kInf;
  }
  for (int64_t j = 0; j < n; ++j) c.Logit(5, j) = j < k ? 10.0f : -1.0f;  // exactly k large
  c.SetWindow(0, 0, 8192);
  c.SetWindow(1, 1, 8194);
  c.SetWindow(2, 3, 3 + 8191);
  c.SetWindow(3, 2, n);
  c.SetWindow(4, 0, n);
  c.SetWindow(5, 0, n);
  c.SetWindow(6, 7, 7 + k);
  c.SetWindow(7, 0, 4608);
  c.SetWindow(8, 1, 4610);
  c.SetWindow(9, 3, 3 + 4607);
  ExpectEveryConfigEqualsCpu(c);
}

#else

TEST(TopKFilterGpu, NeedsCuda) {
  GTEST_SKIP() << "the threshold-filter top-k is built for CUDA only";
}

#endif  // defined(ATTND_GPU_CUDA)

}  // namespace
}  // namespace attnd::kernels::topk
