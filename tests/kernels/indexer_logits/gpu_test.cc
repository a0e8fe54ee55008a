// GPU-only cases of indexer_logits (skipped without a GPU): row offsets past 2^31 elements with a
// real 8.6 GB device output (the seed-003 boundary: m·ld computed in 32 bits lands in the wrong
// row), checked on sampled rows against the fp64 formula — the full reference would not fit.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/fp8.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/indexer_logits/reference.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/kernels/indexer_logits/logits_check.h"

namespace attnd::kernels::indexer_logits {
namespace {

using testing::HostTensor;

// Logit of (row m, key n) in fp64, its magnitude and FAST bound (as RefLogits defines them).
void ExactLogit(const HostTensor& q, const HostTensor& k, const HostTensor& k_scale,
                const HostTensor& weights, int64_t heads, int64_t dim, int64_t m, int64_t n,
                double* value, double* magnitude, double* fast_bound) {
  const uint8_t* qm = q.data<uint8_t>() + m * heads * dim;
  const uint8_t* kn = k.data<uint8_t>() + n * dim;
  const double scale = k_scale.data<float>()[n];
  std::vector<double> products(static_cast<size_t>(dim));
  double acc_bound = 0;
  *value = 0;
  *magnitude = 0;
  for (int64_t h = 0; h < heads; ++h) {
    double dot = 0, abs_dot = 0;
    for (int64_t d = 0; d < dim; ++d) {
      products[d] = static_cast<double>(Fp8E4M3ToFloat(qm[h * dim + d])) *
                    static_cast<double>(Fp8E4M3ToFloat(kn[d]));
      dot += products[d];
      abs_dot += std::fabs(products[d]);
    }
    const double w = weights.data<float>()[m * heads + h];
    *value += std::max(dot, 0.0) * scale * w;
    *magnitude += abs_dot * std::fabs(scale * w);
    acc_bound += FastDotErrorBound(products.data(), dim) * std::fabs(scale * w);
  }
  *fast_bound = FastLogitBound(*magnitude, acc_bound, heads);
}

// 16500 rows of ld = 131072 + 27: rows from 16381 on start past 2^31 elements, row 16380 crosses
// it. Small windows (the -inf fill covers the rest); the padding [N, ld) must stay untouched.
// Each GPU implementation in each precision it supports: D 64 runs cuda_mma, D 128 also
// cuda_wgmma in FAST (TMA coordinates 32-bit, output offsets 64-bit).
void CheckRowOffsetsPast2To31Elements(int64_t dim) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  auto rng = testing::MakeRng();
  const int64_t m = 16500, n = 131072, ld = n + 27, heads = 32;
  HostTensor q = HostTensor::Dense(DType::kFp8E4M3, {m, heads, dim});
  HostTensor k = HostTensor::Dense(DType::kFp8E4M3, {n, dim});
  HostTensor k_scale = HostTensor::Dense(DType::kF32, {n});
  HostTensor weights = HostTensor::Dense(DType::kF32, {m, heads});
  HostTensor ks = HostTensor::Dense(DType::kI32, {m});
  HostTensor ke = HostTensor::Dense(DType::kI32, {m});
  testing::FillNormal(q, rng, 1.0);
  testing::FillNormal(k, rng, 1.0);
  testing::FillUniform(k_scale, rng, 0.01, 0.1);
  testing::FillNormal(weights, rng, 1.0);
  std::uniform_int_distribution<int64_t> start(0, n - 100), length(1, 90);
  for (int64_t i = 0; i < m; ++i) {
    ks.data<int32_t>()[i] = static_cast<int32_t>(start(rng));
    ke.data<int32_t>()[i] = static_cast<int32_t>(ks.data<int32_t>()[i] + length(rng));
  }
  ks.data<int32_t>()[1] = -5;                                 // clamped start
  ke.data<int32_t>()[m - 1] = static_cast<int32_t>(n + 100);  // past the end
  ks.data<int32_t>()[m - 1] = static_cast<int32_t>(n - 70);

  Params p;
  p.q = q.tensor();
  p.k = k.tensor();
  p.k_scale = k_scale.tensor();
  p.weights = weights.tensor();
  p.ks = ks.tensor();
  p.ke = ke.tensor();
  p.clean_logits = true;
  const std::vector<int64_t> rows = {0, 1, 8190, 16379, 16380, 16381, 16382, m - 1};
  for (const Precision precision : testing::kPrecisions) {
    p.precision = precision;
    const testing::LogitsTolerance tol = testing::ToleranceFor(heads, dim, precision);
    int runs = 0;
    for (const auto& impl : Implementations()) {
      if (impl.backend != testing::GpuBackend()) continue;
      SCOPED_TRACE("implementation " + impl.name + " (" + PrecisionName(precision) + ")");
      testing::DeviceMirror mirror;  // freed (8.6 GB) after each implementation
      Params device = p;
      for (Tensor* t :
           {&device.q, &device.k, &device.k_scale, &device.weights, &device.ks, &device.ke}) {
        ASSERT_TRUE(mirror.Mirror(*t).ok());
      }
      void* out = nullptr;  // filled with 0xff bytes (a NaN) by Allocate
      ASSERT_TRUE(mirror.Allocate(((m - 1) * ld + n) * 4, &out).ok());
      device.logits = MakeStridedTensor(out, DType::kF32, {m, n}, {ld, 1});
      ASSERT_TRUE(Validate(device).ok()) << Validate(device);
      std::string why;
      if (impl.supports && !impl.supports(device, &why)) continue;
      ExecContext ctx;
      ctx.backend = testing::GpuBackend();
      ctx.stream = mirror.stream();
      const absl::Status status = impl.run(device, ctx);
      ASSERT_TRUE(status.ok()) << status;
      for (int64_t r : rows) {
        const int64_t width = r + 1 < m ? ld : n;  // the last row has no padding in the buffer
        HostTensor got = HostTensor::Dense(DType::kF32, {width});
        const Tensor row = MakeTensor(static_cast<float*>(out) + r * ld, DType::kF32, {width});
        ASSERT_TRUE(mirror.CopyBack(row, got.tensor()).ok());
        ASSERT_TRUE(mirror.Synchronize().ok());
        const int64_t lo = std::max<int64_t>(ks.data<int32_t>()[r], 0);
        const int64_t hi = std::min<int64_t>(ke.data<int32_t>()[r], n);
        int64_t bad = 0;
        for (int64_t c = 0; c < width; ++c) {
          const float v = got.data<float>()[c];
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          bool ok;
          if (c >= n) {
            ok = bits == 0xffffffffu;
          } else if (c < lo || c >= hi) {
            ok = std::isinf(v) && v < 0;
          } else {
            double want, magnitude, fast_bound;
            ExactLogit(q, k, k_scale, weights, heads, dim, r, c, &want, &magnitude, &fast_bound);
            ok = std::fabs(v - want) <= (tol.fast_bound ? fast_bound : tol.per_element * magnitude);
          }
          if (!ok && bad++ < 3) ADD_FAILURE() << "row " << r << " col " << c << ": got " << v;
        }
        EXPECT_EQ(bad, 0) << "row " << r;
      }
      ++runs;
    }
    EXPECT_GE(runs, 1);
  }
}

TEST(IndexerLogitsGpu, RowOffsetsPast2To31Elements) { CheckRowOffsetsPast2To31Elements(64); }
TEST(IndexerLogitsGpu, RowOffsetsPast2To31ElementsD128) { CheckRowOffsetsPast2To31Elements(128); }

}  // namespace
}  // namespace attnd::kernels::indexer_logits
