// Sparse MLA with KV rows whose element offsets pass 2^31 (index × row stride in 64 bit;
// docs/CONTRACTS.md "Common rules"), bf16 and FP8 caches. The cache is a multi-GB MAP_NORESERVE
// mapping of which only the selected rows are ever touched.
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "kernels/common/bf16.h"
#include "kernels/sparse_mla/reference.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "tests/harness/harness.h"
#include "tests/kernels/sparse_mla/case.h"

namespace attnd::testing {
namespace {

using kernels::DType;
using kernels::sparse_mla::Params;

class LazyMapping {
 public:
  explicit LazyMapping(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : p;
  }
  ~LazyMapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  void* data() const { return data_; }

 private:
  size_t bytes_;
  void* data_;
};

// bf16: 3.8M rows x 576 (4.4 GB; row 3'728'271 is the first past 2^31 elements). FP8: 3.4M rows
// x 656 bytes (2.2 GB; row 3'273'604 is the first past 2^31 bytes).
class SparseMlaOffsets : public ::testing::TestWithParam<KvFormat> {};

TEST_P(SparseMlaOffsets, OffsetsPast2To31Elements) {
  const bool fp8 = GetParam() == KvFormat::kFp8;
  constexpr int64_t kDqk = 576;
  const int64_t rows_total = fp8 ? 3'400'000 : 3'800'000;
  const int64_t row_bytes = fp8 ? kernels::sparse_mla::kFp8RowBytes : kDqk * 2;
  const int32_t first_high = fp8 ? 3'273'700 : 3'728'000;
  LazyMapping cache(static_cast<size_t>(rows_total * row_bytes));
  if (cache.data() == nullptr) GTEST_SKIP() << "cannot map a multi-GB lazy region here";
  std::mt19937_64 rng = MakeRng();
  std::normal_distribution<float> normal(0.0f, 1.0f);

  const int64_t t = 2, h = 16, k = 96;
  Params p;
  p.kv = fp8 ? kernels::MakeTensor(cache.data(), DType::kU8, {rows_total, row_bytes})
             : kernels::MakeTensor(cache.data(), DType::kBF16, {rows_total, kDqk});
  HostTensor q = HostTensor::Dense(DType::kBF16, {t, h, kDqk});
  FillNormal(q, rng, 1.0);
  HostTensor indices = HostTensor::Dense(DType::kI32, {t, k});
  std::uniform_int_distribution<int32_t> high(first_high, static_cast<int32_t>(rows_total - 1)),
      low(0, 1000);
  auto* bytes = static_cast<uint8_t*>(cache.data());
  for (int64_t i = 0; i < t * k; ++i) {
    const int32_t row = i % 4 == 0 ? low(rng) : high(rng);  // mostly rows past 2^31 elements
    indices.data<int32_t>()[i] = row;
    uint8_t* dst = bytes + row * row_bytes;
    if (fp8) {
      FillFp8Row(dst, rng, /*pow2_scales=*/true);
    } else {
      for (int64_t d = 0; d < kDqk; ++d) {
        const kernels::bf16_t b = kernels::FloatToBf16(normal(rng));
        std::memcpy(dst + 2 * d, &b, 2);
      }
    }
  }
  HostTensor out = HostTensor::Dense(DType::kBF16, {t, h, 512});
  HostTensor lse = HostTensor::Dense(DType::kF32, {t, h});
  p.q = q.tensor();
  p.indices = indices.tensor();
  p.sm_scale = 0.0417f;
  p.out = out.tensor();
  p.lse = lse.tensor();
  ASSERT_TRUE(kernels::sparse_mla::Validate(p).ok()) << kernels::sparse_mla::Validate(p);

  const kernels::sparse_mla::Reference ref = kernels::sparse_mla::ComputeReference(p);
  for (const kernels::Precision precision : kPrecisions) {
    p.precision = precision;
    const int runs = RunEachImpl(kernels::sparse_mla::Implementations(), p, {&out, &lse},
                                 [&](const std::string& impl) {
                                   // Same bounds as sparse_mla_test.cc (bf16 out, f32 lse).
                                   ExpectAttentionOut(ToDoubles(out), ref.out, ref.out_abs,
                                                      precision, kOutTol, impl + " out");
                                   ExpectClose(ToDoubles(lse), ref.lse, kLseTol, impl + " lse");
                                 });
    EXPECT_GE(runs, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, SparseMlaOffsets,
                         ::testing::Values(KvFormat::kBf16, KvFormat::kFp8),
                         [](const auto& info) { return KvFormatName(info.param); });

}  // namespace
}  // namespace attnd::testing
