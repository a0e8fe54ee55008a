// The indexer → top-k candidate form on a GPU (docs/KERNELS.md "Indexer → top-k candidates"),
// each half checked on its own against the logits form of the same wgmma kernel, so that a
// failure of dsa_test's Dsa.FusedTopk* names the half that broke:
//   - LaunchWgmmaCandidates: per row, the count within the window, every candidate a column of
//     the window with the key of that column's logit (radix.h's map), no column twice, the floor
//     at most the k-th largest key, and every column at or above the k-th largest key a candidate
//     at or above the floor; the logits it writes when asked for are the logits form's bytes.
//   - topk::gpu::LaunchTopkFromCandidates: the filter top-k's output bytes on those logits.
// Skipped without a CUDA device of compute capability 9.0 (the candidate form is sm_90a only).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/topk/gpu/radix.h"
#include "kernels/topk/topk.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"

#if defined(ATTND_GPU_CUDA)
#include "kernels/indexer_logits/gpu/launch.h"
#include "kernels/topk/gpu/filter.h"
#endif

namespace attnd::kernels::indexer_logits {
namespace {

using testing::HostTensor;

#if defined(ATTND_GPU_CUDA)

uint32_t KeyOf(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return topk::gpu::radix::KeyOfBits(bits);
}

void CheckCandidates(int64_t m, int64_t n, int64_t topk_k, uint64_t salt, uint32_t floor_every = 0,
                     bool helpers = false) {
  if (!testing::GpuAvailable()) GTEST_SKIP() << "no GPU";
  auto rng = testing::MakeRng();
  rng.discard(salt);
  const int64_t heads = 64, dim = 128;
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
  for (int64_t i = 0; i < m; ++i) {  // causal after a prefix, then the odd shapes
    ks.data<int32_t>()[i] = 0;
    ke.data<int32_t>()[i] = static_cast<int32_t>(n - m + i + 1);
  }
  const auto set = [&](int64_t row, int64_t s, int64_t e) {
    if (row < m) {
      ks.data<int32_t>()[row] = static_cast<int32_t>(s);
      ke.data<int32_t>()[row] = static_cast<int32_t>(e);
    }
  };
  set(1, 40, 40);                                                                // empty
  set(2, 100, 100 + topk_k / 2);                                                 // shorter than k
  set(3, -5, n + 100);                                                           // clamped
  set(4, n / 2, n / 4);                                                          // reversed: empty
  set(5, n / 3, n / 3 + topk_k);                                                 // exactly k
  for (int64_t c = 500; c < 700 && c < n; ++c) k_scale.data<float>()[c] = 0.0f;  // ties (±0)

  Params p;
  p.q = q.tensor();
  p.k = k.tensor();
  p.k_scale = k_scale.tensor();
  p.weights = weights.tensor();
  p.ks = ks.tensor();
  p.ke = ke.tensor();
  p.clean_logits = true;
  p.precision = Precision::kFast;
  testing::DeviceMirror mirror;
  Params device = p;
  for (Tensor* t :
       {&device.q, &device.k, &device.k_scale, &device.weights, &device.ks, &device.ke}) {
    ASSERT_TRUE(mirror.Mirror(*t).ok());
  }
  void *logits = nullptr, *logits2 = nullptr, *entries = nullptr, *counts = nullptr,
       *floors = nullptr, *idx_a = nullptr, *idx_b = nullptr;
  for (auto [ptr, bytes] :
       {std::pair{&logits, 4 * m * n}, std::pair{&logits2, 4 * m * n},
        std::pair{&entries, 8 * m * n}, std::pair{&counts, 4 * m}, std::pair{&floors, 4 * m},
        std::pair{&idx_a, 4 * m * topk_k}, std::pair{&idx_b, 4 * m * topk_k}}) {
    ASSERT_TRUE(mirror.Allocate(bytes, ptr).ok());
  }
  device.logits = MakeTensor(logits, DType::kF32, {m, n});
  std::string why;
  if (!gpu::WgmmaSupports(device, &why)) GTEST_SKIP() << "no sm_90a device: " << why;
  const auto stream = static_cast<::attnd::gpu::Stream>(mirror.stream());
  ASSERT_EQ(gpu::LaunchWgmma(device, stream), 0);
  gpu::WgmmaCandidates c;
  c.entries = static_cast<uint32_t*>(entries);
  c.ld = n;
  c.counts = static_cast<uint32_t*>(counts);
  c.floors = static_cast<uint32_t*>(floors);
  c.k = static_cast<uint32_t>(topk_k);
  c.floor_every = floor_every;
  c.helpers = helpers;
  Params fused = device;
  fused.logits = Tensor{};
  ASSERT_TRUE(gpu::WgmmaCandidatesSupports(fused, topk_k, &why)) << why;
  ASSERT_EQ(gpu::LaunchWgmmaCandidates(fused, c, stream), 0);
  // The candidate form asked for the logits as well: the logits form's bytes.
  Params both = device;
  both.logits = MakeTensor(logits2, DType::kF32, {m, n});
  gpu::WgmmaCandidates c2 = c;
  void *entries2 = nullptr, *counts2 = nullptr, *floors2 = nullptr;
  ASSERT_TRUE(mirror.Allocate(8 * m * n, &entries2).ok());
  ASSERT_TRUE(mirror.Allocate(4 * m, &counts2).ok());
  ASSERT_TRUE(mirror.Allocate(4 * m, &floors2).ok());
  c2.entries = static_cast<uint32_t*>(entries2);
  c2.counts = static_cast<uint32_t*>(counts2);
  c2.floors = static_cast<uint32_t*>(floors2);
  ASSERT_EQ(gpu::LaunchWgmmaCandidates(both, c2, stream), 0);

  // The select on the candidates against the filter top-k on the logits.
  topk::Params tp;
  tp.logits = device.logits;
  tp.ks = device.ks;
  tp.ke = device.ke;
  tp.k = topk_k;
  tp.indices = MakeTensor(idx_a, DType::kI32, {m, topk_k});
  ASSERT_TRUE(topk::gpu::SupportsFilter(tp, &why)) << why;
  ASSERT_EQ(topk::gpu::LaunchTopkFilter(tp, stream), 0);
  topk::Params tq = tp;
  tq.indices = MakeTensor(idx_b, DType::kI32, {m, topk_k});
  topk::gpu::TopkCandidateRows rows;
  rows.entries = c.entries;
  rows.ld = c.ld;
  rows.counts = c.counts;
  rows.floors = c.floors;
  for (const int threads : {256, 512}) {
    rows.threads = topk_k <= 2048 ? threads : 512;
    ASSERT_EQ(topk::gpu::LaunchTopkFromCandidates(tq, rows, stream), 0);
    HostTensor a = HostTensor::Dense(DType::kI32, {m, topk_k});
    HostTensor b = HostTensor::Dense(DType::kI32, {m, topk_k});
    ASSERT_TRUE(mirror.CopyBack(tp.indices, a.tensor()).ok());
    ASSERT_TRUE(mirror.CopyBack(tq.indices, b.tensor()).ok());
    ASSERT_TRUE(mirror.Synchronize().ok());
    EXPECT_EQ(std::memcmp(a.data<int32_t>(), b.data<int32_t>(), 4 * m * topk_k), 0)
        << "the select's output differs from the filter's (" << rows.threads << " threads)";
  }

  HostTensor l = HostTensor::Dense(DType::kF32, {m, n});
  HostTensor l2 = HostTensor::Dense(DType::kF32, {m, n});
  HostTensor e = HostTensor::Dense(DType::kI32, {m, 2 * n});
  HostTensor cnt = HostTensor::Dense(DType::kI32, {m});
  HostTensor fl = HostTensor::Dense(DType::kI32, {m});
  ASSERT_TRUE(mirror.CopyBack(device.logits, l.tensor()).ok());
  ASSERT_TRUE(mirror.CopyBack(both.logits, l2.tensor()).ok());
  ASSERT_TRUE(mirror.CopyBack(MakeTensor(entries, DType::kI32, {m, 2 * n}), e.tensor()).ok());
  ASSERT_TRUE(mirror.CopyBack(MakeTensor(counts, DType::kI32, {m}), cnt.tensor()).ok());
  ASSERT_TRUE(mirror.CopyBack(MakeTensor(floors, DType::kI32, {m}), fl.tensor()).ok());
  ASSERT_TRUE(mirror.Synchronize().ok());
  EXPECT_EQ(std::memcmp(l.data<float>(), l2.data<float>(), 4 * m * n), 0)
      << "the candidate form's logits differ from the logits form's";

  for (int64_t r = 0; r < m; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const int64_t lo = std::clamp<int64_t>(ks.data<int32_t>()[r], 0, n);
    const int64_t hi = std::clamp<int64_t>(ke.data<int32_t>()[r], lo, n);
    const uint32_t count = static_cast<uint32_t>(cnt.data<int32_t>()[r]);
    const uint32_t floor = static_cast<uint32_t>(fl.data<int32_t>()[r]);
    ASSERT_LE(count, static_cast<uint32_t>(hi - lo));
    const float* row = l.data<float>() + r * n;
    const uint32_t* pairs = reinterpret_cast<const uint32_t*>(e.data<int32_t>() + r * 2 * n);
    std::set<int64_t> seen;
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t key = pairs[2 * i], col = pairs[2 * i + 1];
      ASSERT_TRUE(col >= lo && col < hi) << "candidate " << i << " column " << col;
      ASSERT_TRUE(seen.insert(col).second) << "column " << col << " twice";
      ASSERT_EQ(key, KeyOf(row[col])) << "column " << col;
      ASSERT_GE(key, topk::gpu::radix::kMinSelectableKey) << "column " << col;
    }
    std::vector<uint32_t> keys;
    for (int64_t col = lo; col < hi; ++col) {
      const uint32_t key = KeyOf(row[col]);
      if (key >= topk::gpu::radix::kMinSelectableKey) keys.push_back(key);
    }
    std::sort(keys.rbegin(), keys.rend());
    const uint32_t kth = static_cast<int64_t>(keys.size()) >= topk_k
                             ? keys[static_cast<size_t>(topk_k - 1)]
                             : topk::gpu::radix::kMinSelectableKey;
    ASSERT_LE(floor, kth);
    std::set<int64_t> kept;
    for (uint32_t i = 0; i < count; ++i) {
      if (pairs[2 * i] >= floor) kept.insert(pairs[2 * i + 1]);
    }
    for (int64_t col = lo; col < hi; ++col) {
      if (KeyOf(row[col]) >= kth && KeyOf(row[col]) >= topk::gpu::radix::kMinSelectableKey) {
        ASSERT_EQ(kept.count(col), 1u) << "column " << col << " of the top k is not kept";
      }
    }
  }
}

TEST(IndexerCandidatesGpu, EveryTopkEntryIsACandidateK256) { CheckCandidates(37, 3000, 256, 1); }
TEST(IndexerCandidatesGpu, EveryTopkEntryIsACandidateK2048) { CheckCandidates(20, 9000, 2048, 2); }
TEST(IndexerCandidatesGpu, EveryTopkEntryIsACandidateK3000) { CheckCandidates(11, 5000, 3000, 3); }
// The floors raised after every tile (the most reads racing the appends) and every 64.
TEST(IndexerCandidatesGpu, EveryTopkEntryIsACandidateFloorEveryTile) {
  CheckCandidates(37, 6000, 256, 4, 1);
}
TEST(IndexerCandidatesGpu, EveryTopkEntryIsACandidateFloorEvery64Tiles) {
  CheckCandidates(20, 9000, 2048, 5, 64);
}
// The appends on the producer warpgroup's helper warps (WgmmaCandidates::helpers): the same
// checks, also with the floors raised after every tile and with the logits asked for (the
// filler runs before the helpers' loop: the `both` launch).
TEST(IndexerCandidatesGpu, HelpersEveryTopkEntryIsACandidateK256) {
  CheckCandidates(37, 3000, 256, 6, 0, true);
}
TEST(IndexerCandidatesGpu, HelpersEveryTopkEntryIsACandidateK2048) {
  CheckCandidates(20, 9000, 2048, 7, 0, true);
}
TEST(IndexerCandidatesGpu, HelpersEveryTopkEntryIsACandidateK3000FloorEveryTile) {
  CheckCandidates(11, 5000, 3000, 8, 1, true);
}

#else

TEST(IndexerCandidatesGpu, NeedsACudaBuild) { GTEST_SKIP() << "the candidate form is CUDA-only"; }

#endif

}  // namespace
}  // namespace attnd::kernels::indexer_logits
