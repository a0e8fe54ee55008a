// Every implementation of indexer_logits, in each precision it supports, against the fp64
// reference on fresh random data: the six window modes with and without clean_logits (also at the
// tensor-core shapes), the head counts and head dims, padded strides, long rows and row offsets
// past 2^31 elements.
#include "kernels/indexer_logits/indexer_logits.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <iostream>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/indexer_logits/reference.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/kernels/indexer_logits/logits_check.h"
#include "tests/kernels/indexer_logits/mapped_region.h"

namespace attnd::kernels::indexer_logits {
namespace {

using testing::ExpectLogits;
using testing::HostTensor;
using testing::MakeRng;
using testing::RunEachImpl;
using testing::ToleranceFor;

struct Shape {
  int64_t m, n, heads, dim;
  int64_t pad = 0;  // extra elements on every leading stride (q, k, weights, logits)
};

// Owned inputs and output of one call, filled with fresh random data; windows set by the caller.
struct Problem {
  Problem(const Shape& s, std::mt19937_64& rng)
      : shape(s),
        q(HostTensor::RowStrided(DType::kFp8E4M3, {s.m, s.heads, s.dim}, s.heads * s.dim + s.pad)),
        k(HostTensor::RowStrided(DType::kFp8E4M3, {s.n, s.dim}, s.dim + s.pad)),
        k_scale(HostTensor::Dense(DType::kF32, {s.n})),
        weights(HostTensor::RowStrided(DType::kF32, {s.m, s.heads}, s.heads + s.pad)),
        ks(HostTensor::Dense(DType::kI32, {s.m})),
        ke(HostTensor::Dense(DType::kI32, {s.m})),
        logits(HostTensor::RowStrided(DType::kF32, {s.m, s.n}, s.n + s.pad)) {
    testing::FillNormal(q, rng, 1.0);
    testing::FillNormal(k, rng, 1.0);
    testing::FillUniform(k_scale, rng, 0.01, 0.1);
    testing::FillNormal(weights, rng, 1.0);
  }

  void SetWindows(const std::vector<int64_t>& starts, const std::vector<int64_t>& ends) {
    for (int64_t i = 0; i < shape.m; ++i) {
      ks.data<int32_t>()[i] = static_cast<int32_t>(starts[i]);
      ke.data<int32_t>()[i] = static_cast<int32_t>(ends[i]);
    }
  }

  Params params(bool clean, Precision precision = Precision::kHigh) {
    Params p;
    p.precision = precision;
    p.q = q.tensor();
    p.k = k.tensor();
    p.k_scale = k_scale.tensor();
    p.weights = weights.tensor();
    p.ks = ks.tensor();
    p.ke = ke.tensor();
    p.clean_logits = clean;
    p.logits = logits.tensor();
    return p;
  }

  // Runs every implementation in each precision it supports and checks each against the
  // reference with that precision's bound; returns the fewest runs of a precision.
  int RunAndCheck(bool clean) {
    const RefLogits ref = Reference(params(clean));
    int runs = INT_MAX;
    for (const Precision precision : testing::kPrecisions) {
      const Params p = params(clean, precision);
      EXPECT_TRUE(Validate(p).ok()) << Validate(p);
      const testing::LogitsTolerance tol = ToleranceFor(shape.heads, shape.dim, precision);
      runs = std::min(
          runs, RunEachImpl(Implementations(), p, {&logits}, [&](const std::string& impl) {
            ExpectLogits(logits.tensor(), ref, tol, impl + " (" + PrecisionName(precision) + ")");
          }));
    }
    return runs;
  }

  Shape shape;
  HostTensor q, k, k_scale, weights, ks, ke, logits;
};

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

enum class Mode { kCausal, kContextParallel, kMisaligned, kEmpty, kPastEnd, kMultiRequest };

// ks/ke of each mode (vLLM / DeepGEMM conventions; docs/CONTRACTS.md "indexer_logits").
void MakeWindows(Mode mode, int64_t m, int64_t n, std::mt19937_64& rng, std::vector<int64_t>* ks,
                 std::vector<int64_t>* ke) {
  ks->assign(m, 0);
  ke->assign(m, 0);
  switch (mode) {
    case Mode::kCausal:  // one request whose last m tokens are the queries
      for (int64_t i = 0; i < m; ++i) (*ke)[i] = n - m + i + 1;
      break;
    case Mode::kContextParallel: {  // DeepGEMM's CP split: two query chunks of one rank
      const int64_t chunk = m / 2, cp_size = n / m, cp_id = cp_size / 3;
      for (int64_t i = 0; i < chunk; ++i) {
        (*ke)[i] = cp_id * chunk + i;  // row 0 is empty when cp_id == 0
        (*ke)[i + chunk] = (cp_size * 2 - 1 - cp_id) * chunk + i;
      }
      break;
    }
    case Mode::kMisaligned:  // odd starts and ends, off every tile boundary
      for (int64_t i = 0; i < m; ++i) {
        (*ks)[i] = Uniform(rng, 0, n / 2) | 1;
        (*ke)[i] = std::min(n, (*ks)[i] + Uniform(rng, 1, n / 2)) | 1;
      }
      break;
    case Mode::kEmpty:  // ke <= ks or ke < 0; every fourth row non-empty so blocks mix
      for (int64_t i = 0; i < m; ++i) {
        switch (i % 4) {
          case 0:
            (*ks)[i] = Uniform(rng, -5, n);
            (*ke)[i] = -Uniform(rng, 1, 100);
            break;
          case 1: (*ks)[i] = (*ke)[i] = Uniform(rng, 0, n); break;
          case 2:
            (*ks)[i] = Uniform(rng, 1, n);
            (*ke)[i] = (*ks)[i] - Uniform(rng, 1, (*ks)[i]);
            break;
          case 3:
            (*ks)[i] = Uniform(rng, 0, n / 2);
            (*ke)[i] = (*ks)[i] + Uniform(rng, 1, n / 2);
            break;
        }
      }
      break;
    case Mode::kPastEnd:  // ke > N, ks > N, ks < 0, extremes of int32
      for (int64_t i = 0; i < m; ++i) {
        switch (i % 4) {
          case 0:
            (*ks)[i] = Uniform(rng, 0, n - 1);
            (*ke)[i] = n + Uniform(rng, 1, 1000);
            break;
          case 1:
            (*ks)[i] = n + Uniform(rng, 0, 1000);
            (*ke)[i] = (*ks)[i] + Uniform(rng, 1, 100);
            break;
          case 2:
            (*ks)[i] = -Uniform(rng, 1, 1000);
            (*ke)[i] = n + Uniform(rng, 1, 1000);
            break;
          case 3:
            (*ks)[i] = INT32_MIN;
            (*ke)[i] = INT32_MAX;
            break;
        }
      }
      break;
    case Mode::kMultiRequest: {  // several causal requests packed in one chunk, K concatenated
      int64_t row = 0, base = 0;
      while (row < m) {
        const int64_t queries = std::min(m - row, Uniform(rng, 1, m / 3 + 1));
        const int64_t spare = n - base - (m - row);  // keys beyond one per query left: >= 0
        const int64_t context =
            row + queries == m ? n - base : queries + Uniform(rng, 0, spare / 2);
        for (int64_t i = 0; i < queries; ++i) {
          (*ks)[row + i] = base;
          (*ke)[row + i] = base + context - queries + i + 1;
        }
        row += queries;
        base += context;
      }
      break;
    }
  }
}

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kCausal: return "Causal";
    case Mode::kContextParallel: return "ContextParallel";
    case Mode::kMisaligned: return "Misaligned";
    case Mode::kEmpty: return "Empty";
    case Mode::kPastEnd: return "PastEnd";
    case Mode::kMultiRequest: return "MultiRequest";
  }
  return "?";
}

void PrintTo(Mode mode, std::ostream* os) { *os << ModeName(mode); }

class WindowModeTest : public ::testing::TestWithParam<std::tuple<Mode, bool>> {};

// m spans several query blocks (16 heads: 16 queries per block) and a partial one; n spans two
// key chunks (2048) and many key tiles; strides padded.
TEST_P(WindowModeTest, MatchesReference) {
  const auto [mode, clean] = GetParam();
  auto rng = MakeRng();
  const Shape shape{70, 2240, 16, 64, 3};
  Problem prob(shape, rng);
  std::vector<int64_t> ks, ke;
  MakeWindows(mode, shape.m, shape.n, rng, &ks, &ke);
  prob.SetWindows(ks, ke);
  EXPECT_GE(prob.RunAndCheck(clean), 1);
}

// The same modes at the tensor-core shapes (H 32 / 64, D 128) with 16-byte-aligned padding, so
// the GPU's fast path sees every window mode, the fill and the no-clean path too.
TEST_P(WindowModeTest, TensorCoreShapes) {
  const auto [mode, clean] = GetParam();
  auto rng = MakeRng();
  const Shape shape{37, 1500, clean ? 64 : 32, 128, 16};
  Problem prob(shape, rng);
  std::vector<int64_t> ks, ke;
  MakeWindows(mode, shape.m, shape.n, rng, &ks, &ke);
  prob.SetWindows(ks, ke);
  EXPECT_GE(prob.RunAndCheck(clean), 1);
}

INSTANTIATE_TEST_SUITE_P(IndexerLogits, WindowModeTest,
                         ::testing::Combine(::testing::Values(Mode::kCausal, Mode::kContextParallel,
                                                              Mode::kMisaligned, Mode::kEmpty,
                                                              Mode::kPastEnd, Mode::kMultiRequest),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(ModeName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_Clean" : "_NoClean");
                         });

class HeadShapeTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

// The model shapes (H 32 / 64, D 128) and the ones that must still run, causal windows.
TEST_P(HeadShapeTest, MatchesReference) {
  const auto [heads, dim] = GetParam();
  auto rng = MakeRng();
  const Shape shape{19, 300, heads, dim};
  Problem prob(shape, rng);
  std::vector<int64_t> ks, ke;
  MakeWindows(Mode::kCausal, shape.m, shape.n, rng, &ks, &ke);
  prob.SetWindows(ks, ke);
  EXPECT_GE(prob.RunAndCheck(/*clean=*/true), 1);
}

INSTANTIATE_TEST_SUITE_P(IndexerLogits, HeadShapeTest,
                         ::testing::Combine(::testing::Values(32, 64, 128),
                                            ::testing::Values(64, 128)),
                         [](const auto& info) {
                           return "H" + std::to_string(std::get<0>(info.param)) + "_D" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Head counts that fill no 16-column panel and head dims other than 64 / 128.
INSTANTIATE_TEST_SUITE_P(IndexerLogitsOdd, HeadShapeTest,
                         ::testing::Values(std::make_tuple(1, 16), std::make_tuple(7, 48),
                                           std::make_tuple(33, 192), std::make_tuple(127, 32)),
                         [](const auto& info) {
                           return "H" + std::to_string(std::get<0>(info.param)) + "_D" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The Hopper kernel's (cuda_wgmma) edges at its shapes (H 32 / 64, D 128; every other
// implementation runs them too): query blocks of 8 (H64) / 16 (H32) rows with a partial last
// block (at H64 its second consumer warpgroup has no row), 64-key tiles with a partial last tile,
// windows that start and end mid-tile or on tile edges, single keys, empty rows, and whole tiles
// between the windows of one block that no row sees (filled, never computed).
class WgmmaEdgeTest : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

TEST_P(WgmmaEdgeTest, TilesAndWindows) {
  const auto [heads, clean] = GetParam();
  auto rng = MakeRng();
  const Shape shape{19, 64 * 9 + 13, heads, 128, 16};
  Problem prob(shape, rng);
  std::vector<int64_t> ks(shape.m), ke(shape.m);
  for (int64_t i = 0; i < shape.m; ++i) {
    switch (i % 5) {
      case 0: ks[i] = 100, ke[i] = 100 - i; break;  // empty (ke <= ks)
      case 1: ks[i] = 5, ke[i] = 70; break;         // tiles 0-1, both ends mid-tile
      case 2: ks[i] = 450, ke[i] = shape.n; break;  // tiles 7-9, the last one partial
      case 3: ks[i] = 130, ke[i] = 131; break;      // one key, mid-tile
      case 4: ks[i] = 64, ke[i] = 128; break;       // exactly tile 1
    }
  }
  prob.SetWindows(ks, ke);
  EXPECT_GE(prob.RunAndCheck(clean), 1);
}

// Few rows against many keys: the keys are cut into chunks (one CTA each), windows cross chunk
// edges, and one row sees only the last key.
TEST_P(WgmmaEdgeTest, KeyChunks) {
  const auto [heads, clean] = GetParam();
  auto rng = MakeRng();
  const Shape shape{3, 64 * 70 + 5, heads, 128};
  Problem prob(shape, rng);
  prob.SetWindows({0, 1007, shape.n - 1}, {shape.n, 3009, shape.n});
  EXPECT_GE(prob.RunAndCheck(clean), 1);
}

// Causal rows over several blocks (the longest-first order) with a partial last block.
TEST_P(WgmmaEdgeTest, Causal) {
  const auto [heads, clean] = GetParam();
  auto rng = MakeRng();
  const Shape shape{70, 1000, heads, 128};
  Problem prob(shape, rng);
  std::vector<int64_t> ks, ke;
  MakeWindows(Mode::kCausal, shape.m, shape.n, rng, &ks, &ke);
  prob.SetWindows(ks, ke);
  EXPECT_GE(prob.RunAndCheck(clean), 1);
}

INSTANTIATE_TEST_SUITE_P(IndexerLogits, WgmmaEdgeTest,
                         ::testing::Combine(::testing::Values(32, 64), ::testing::Bool()),
                         [](const auto& info) {
                           return "H" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_Clean" : "_NoClean");
                         });

const Impl<Params>* FindImpl(const std::string& name) {
  for (const auto& impl : Implementations()) {
    if (impl.name == name) return &impl;
  }
  return nullptr;
}

// cuda_wgmma refuses the shapes it has no kernel for, with a reason (dispatch then picks another
// implementation, which still runs them).
TEST(IndexerLogits, WgmmaRefusesOtherShapes) {
  const Impl<Params>* wgmma = FindImpl("cuda_wgmma");
  if (wgmma == nullptr) GTEST_SKIP() << "no cuda_wgmma in this build";
  auto rng = MakeRng();
  for (const Shape& shape : {Shape{5, 100, 16, 128}, Shape{5, 100, 64, 64}, Shape{5, 100, 128, 128},
                             Shape{5, 100, 33, 128}}) {
    Problem prob(shape, rng);
    prob.SetWindows(std::vector<int64_t>(shape.m, 0), std::vector<int64_t>(shape.m, 77));
    std::string why;
    EXPECT_FALSE(wgmma->supports(prob.params(true, Precision::kFast), &why))
        << shape.heads << " " << shape.dim;
    EXPECT_FALSE(why.empty());
    EXPECT_EQ(why.find("precision"), std::string::npos) << why;
    EXPECT_GE(prob.RunAndCheck(/*clean=*/true), 1);
  }
}

// cuda_wgmma runs FAST only: at its own shape it refuses HIGH naming the precision, so dispatch
// gives HIGH to cuda_mma and FAST to cuda_wgmma (on a compute capability 9.0 device). M = 0 keeps
// Supports from encoding tensor maps over host memory.
TEST(IndexerLogits, DispatchPicksByPrecision) {
  const Impl<Params>* wgmma = FindImpl("cuda_wgmma");
  if (wgmma == nullptr) GTEST_SKIP() << "no cuda_wgmma in this build";
  auto rng = MakeRng();
  Problem prob({0, 100, 64, 128}, rng);
  std::string why;
  EXPECT_FALSE(wgmma->supports(prob.params(true, Precision::kHigh), &why));
  EXPECT_NE(why.find("precision"), std::string::npos) << why;
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  ExecContext ctx;
  ctx.backend = testing::GpuBackend();
  why.clear();
  const Impl<Params>* high = SelectImpl(Implementations(), prob.params(true), ctx, &why);
  ASSERT_NE(high, nullptr) << why;
  EXPECT_NE(high->name, "cuda_wgmma");
  why.clear();
  const bool fast_ok = wgmma->supports(prob.params(true, Precision::kFast), &why);
  const Impl<Params>* fast =
      SelectImpl(Implementations(), prob.params(true, Precision::kFast), ctx, &why);
  ASSERT_NE(fast, nullptr) << why;
  if (fast_ok) {  // a Hopper (sm_90) device
    EXPECT_EQ(fast->name, "cuda_wgmma");
  }
  std::cout << "HIGH runs " << high->name << ", FAST runs " << fast->name << "\n";
}

// Every leading stride padded by an odd amount; the padding must stay untouched.
TEST(IndexerLogits, PaddedStrides) {
  auto rng = MakeRng();
  const Shape shape{21, 333, 32, 128, 37};
  Problem prob(shape, rng);
  std::vector<int64_t> ks, ke;
  MakeWindows(Mode::kMisaligned, shape.m, shape.n, rng, &ks, &ke);
  prob.SetWindows(ks, ke);
  EXPECT_GE(prob.RunAndCheck(/*clean=*/false), 1);
  EXPECT_GE(prob.RunAndCheck(/*clean=*/true), 1);
}

// Few queries against 32K+ columns (16 key chunks in parallel), windows over most of the row.
TEST(IndexerLogits, LongRows) {
  auto rng = MakeRng();
  const Shape shape{3, 32768 + 5, 8, 64};
  Problem prob(shape, rng);
  prob.SetWindows({0, 17, 4095}, {32768 + 5, 30001, 32768});
  EXPECT_GE(prob.RunAndCheck(/*clean=*/true), 1);
}

// Single rows, single columns.
TEST(IndexerLogits, OneRowOneColumn) {
  auto rng = MakeRng();
  Problem prob({1, 1, 64, 128}, rng);
  prob.SetWindows({0}, {1});
  EXPECT_GE(prob.RunAndCheck(/*clean=*/true), 1);
}

// Zero rows or zero columns: valid, nothing written (the poison stays).
TEST(IndexerLogits, ZeroRowsOrColumns) {
  auto rng = MakeRng();
  for (const Shape& shape : {Shape{0, 50, 32, 64}, Shape{5, 0, 32, 64}}) {
    Problem prob(shape, rng);
    prob.SetWindows(std::vector<int64_t>(shape.m, 0), std::vector<int64_t>(shape.m, 10));
    EXPECT_GE(prob.RunAndCheck(/*clean=*/true), 1);
  }
}

// logits row stride 2^32 + 48 elements (row 1 starts 16 GiB in) and k row stride 2^25 + 16 bytes
// (key 64 onwards lies past 2^31 bytes, key 128 past 2^32): offsets computed in 32 bits, signed
// or not, land in row 0 (or outside the buffer) and read the wrong keys.
TEST(IndexerLogits, OffsetsPast2To31Elements) {
  auto rng = MakeRng();
  const int64_t m = 2, n = 200, heads = 32, dim = 64;
  const int64_t ld = (int64_t{1} << 32) + 48, k_stride = (int64_t{1} << 25) + 16;
  testing::MappedRegion logits_mem(static_cast<size_t>(((m - 1) * ld + n) * 4));
  testing::MappedRegion k_mem(static_cast<size_t>((n - 1) * k_stride + dim));
  if (logits_mem.data() == nullptr || k_mem.data() == nullptr) {  // strict overcommit (mode 2)
    GTEST_SKIP() << "this machine refuses to reserve 23 GB of address space";
  }

  Problem prob({m, n, heads, dim}, rng);
  Params p = prob.params(/*clean=*/true);
  p.logits = MakeStridedTensor(logits_mem.data(), DType::kF32, {m, n}, {ld, 1});
  p.k = MakeStridedTensor(k_mem.data(), DType::kFp8E4M3, {n, dim}, {k_stride, 1});
  for (int64_t r = 0; r < n; ++r) {  // fresh fp8 values from the dense k of the Problem
    std::memcpy(k_mem.data() + r * k_stride, prob.k.data<uint8_t>() + r * dim, dim);
  }
  prob.SetWindows({0, 3}, {n, 190});
  ASSERT_TRUE(Validate(p).ok()) << Validate(p);
  const RefLogits ref = Reference(p);
  auto poison = [&] {  // only the two rows: PoisonNaN would commit the whole span
    HostTensor one = HostTensor::Dense(DType::kF32, {1});
    testing::PoisonNaN(one);
    for (int64_t r = 0; r < m; ++r) {
      std::fill_n(p.logits.ptr<float>() + r * ld, n, one.data<float>()[0]);
    }
  };
  poison();
  for (const Precision precision : testing::kPrecisions) {
    p.precision = precision;
    const int runs = RunEachImpl(Implementations(), p, {}, [&](const std::string& impl) {
      ExpectLogits(p.logits, ref, ToleranceFor(heads, dim, precision),
                   impl + " (" + PrecisionName(precision) + ")", /*padding_poisoned=*/false);
      poison();
    });
    EXPECT_GE(runs, 1);
  }
}

// Count: FLOPs from the valid pairs only; bytes with and without the -inf fill.
TEST(IndexerLogits, CountsValidPairs) {
  auto rng = MakeRng();
  Problem prob({3, 100, 64, 128}, rng);
  prob.SetWindows({0, 50, -5}, {10, 40, 200});  // 10 + 0 + 100 pairs
  const WorkCount clean = Count(prob.params(true));
  const WorkCount raw = Count(prob.params(false));
  EXPECT_EQ(clean.flops, 2.0 * 64 * 128 * 110);
  const double inputs = 3 * 64 * 128 + 100 * (128 + 4) + 4 * 3 * 64 + 8 * 3;
  EXPECT_EQ(clean.bytes, inputs + 4.0 * 300);
  EXPECT_EQ(raw.bytes, inputs + 4.0 * 110);
}

// Run = Validate + Dispatch: names the implementation, refuses bad params before running.
TEST(IndexerLogits, RunValidatesThenDispatches) {
  auto rng = MakeRng();
  Problem prob({4, 40, 32, 64}, rng);
  prob.SetWindows({0, 0, 0, 0}, {37, 38, 39, 40});
  ExecContext ctx;
  ctx.pool = testing::TestPool();
  std::string impl;
  ASSERT_TRUE(indexer_logits::Run(prob.params(true), ctx, &impl).ok());
  EXPECT_EQ(impl, "cpu");
  ASSERT_TRUE(indexer_logits::Run(prob.params(true, Precision::kFast), ctx, &impl).ok());
  EXPECT_EQ(impl, "cpu");
  Params bad = prob.params(true);
  bad.ke = Tensor();
  testing::PoisonNaN(prob.logits);
  const absl::Status status = indexer_logits::Run(bad, ctx, &impl);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(testing::IsPoisonF32(prob.logits.data<float>()[0])) << "ran despite bad params";
  Params bad_precision = prob.params(true);
  bad_precision.precision = static_cast<Precision>(7);  // a cast from untrusted input
  const absl::Status refused = indexer_logits::Run(bad_precision, ctx, &impl);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("precision"), std::string::npos) << refused;
  EXPECT_TRUE(testing::IsPoisonF32(prob.logits.data<float>()[0])) << "ran despite bad params";
}

}  // namespace
}  // namespace attnd::kernels::indexer_logits
