// The arithmetic of the threshold-filter GPU top-k (filter.cu), shared by the kernel and its host
// test: the candidate buffer's size, the sample rank of the floor, and the shared-memory layout's
// size for a column count. Plain C++ on top of radix.h (no vendor headers):
//   const uint32_t rank = FloorRank(k, sample_columns, window_length);  // 0: no floor
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/topk/gpu/radix.h"

namespace attnd::kernels::topk::gpu {

// Candidates one row keeps in shared memory ((key, column), 8 bytes each): windows up to this
// long are buffered whole; longer ones get a floor from a sample. Room for k <= kMaxK (4096)
// plus the floor's margin and its bin (docs/KERNELS.md "Top-k, threshold filter").
inline constexpr uint32_t kFilterCapacity = 8192;
// The buffer of the 256-thread CTA, four of which share an SM at N <= 32K (rows past one wave):
// room for k = 2048 plus the margin of a floor refined to the sample's rank (FineFloor in
// filter.cu), not for k = 4096 (a row that overflows takes the exact path).
inline constexpr uint32_t kFilterCapacitySmall = 4608;

// The buffer of a `threads`-thread CTA.
ATTND_TOPK_HD constexpr uint32_t FilterCapacity(int threads) {
  return threads <= 256 ? kFilterCapacitySmall : kFilterCapacity;
}

// -FLT_MAX: the floor that admits every selectable logit.
inline constexpr uint32_t kMinSelectableBits = 0xff7fffffu;

// The rank, among `sample` sampled window entries, whose level-0 bin becomes the floor: the
// expected number of sampled entries above the window's k-th largest plus `sigmas` standard
// deviations and two, so that the floor very likely leaves >= k of the `len` entries (a miss
// costs the exact re-reading path, never a wrong answer). 0 when the rank would not be below the
// sample's size (no floor). In f32 with correctly rounded division and square root: the same on
// host and device.
ATTND_TOPK_HD uint32_t FloorRank(uint32_t k, uint32_t sample, uint32_t len, float sigmas = 3.0f) {
  if (sample == 0 || len == 0) return 0;
  const float mean = static_cast<float>(k) * (static_cast<float>(sample) / static_cast<float>(len));
  const float rank = mean + sigmas * sqrtf(mean) + 2.0f;
  if (rank >= static_cast<float>(sample)) return 0;
  return static_cast<uint32_t>(rank) + 1u;
}

// Words of one column bitmap for rows of `cols` columns.
ATTND_TOPK_HD uint32_t FilterBitmapWords(int64_t cols) {
  return static_cast<uint32_t>((cols + 31) / 32);
}

// Dynamic shared memory of one CTA: the header, a buffer of `capacity` entries and two column
// bitmaps.
ATTND_TOPK_HD int64_t FilterSmemBytes(uint32_t header_bytes, int64_t cols,
                                      uint32_t capacity = kFilterCapacity) {
  return static_cast<int64_t>(header_bytes) + 8 * static_cast<int64_t>(capacity) +
         8 * static_cast<int64_t>(FilterBitmapWords(cols));
}

}  // namespace attnd::kernels::topk::gpu
