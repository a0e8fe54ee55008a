// The threshold-filter GPU top-k's plan (kernels/topk/gpu/filter_plan.h) on the host: the sample
// rank of the floor and the shared-memory size. Runs without a GPU.
#include "kernels/topk/gpu/filter_plan.h"

#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"
#include "kernels/topk/params.h"

namespace attnd::kernels::topk {
namespace {

using gpu::FloorRank;

TEST(TopKFilterPlan, FloorRankIsAMarginAboveTheExpectedRank) {
  EXPECT_EQ(FloorRank(2048, 0, 32768), 0u);
  EXPECT_EQ(FloorRank(2048, 2048, 0), 0u);
  // k 2048 of 32K, 2048 sampled: mean 128, + 3 * sqrt(128) + 2 = 163.9 -> 164.
  EXPECT_EQ(FloorRank(2048, 2048, 32768), 164u);
  for (uint32_t k : {1u, 7u, 2048u, 4096u}) {
    for (uint32_t len : {8193u, 32768u, 131072u, 262144u}) {
      for (uint32_t sample : {2048u, 4096u, 32768u}) {
        const uint32_t rank = FloorRank(k, sample, len);
        SCOPED_TRACE(::testing::Message() << k << " " << len << " " << sample);
        if (rank == 0) {  // only when the margin reaches the sample's size
          const double mean = static_cast<double>(k) * sample / len;
          EXPECT_GE(mean + 3 * std::sqrt(mean) + 2, sample - 1.0);
          continue;
        }
        EXPECT_LT(rank, sample + 1);
        EXPECT_GT(static_cast<double>(rank), static_cast<double>(k) * sample / len);
      }
    }
  }
}

TEST(TopKFilterPlan, SharedMemoryFitsTheH200UpTo256KColumns) {
  constexpr int64_t kH200OptIn = 232448;  // 227 KB per block
  EXPECT_EQ(gpu::FilterBitmapWords(1), 1u);
  EXPECT_EQ(gpu::FilterBitmapWords(32), 1u);
  EXPECT_EQ(gpu::FilterBitmapWords(33), 2u);
  EXPECT_LE(gpu::FilterSmemBytes(16384, 262144), kH200OptIn);
  // Two 512-thread CTAs per SM at 32K and 64K columns (228 KB per SM, 1 KB reserved per CTA).
  EXPECT_LE(2 * (gpu::FilterSmemBytes(9216, 65536) + 1024), 233472);
  EXPECT_GE(gpu::kFilterCapacity, static_cast<uint32_t>(2 * kMaxK));
  // Four 256-thread CTAs per SM at 32K columns with the smaller buffer.
  EXPECT_LE(4 * (gpu::FilterSmemBytes(8704, 32768, gpu::FilterCapacity(256)) + 1024), 233472);
  EXPECT_EQ(gpu::FilterCapacity(512), gpu::kFilterCapacity);
  EXPECT_EQ(gpu::FilterCapacity(1024), gpu::kFilterCapacity);
}

}  // namespace
}  // namespace attnd::kernels::topk
