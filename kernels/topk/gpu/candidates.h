// The arithmetic of the indexer → top-k candidate form (docs/KERNELS.md "Indexer → top-k
// candidates"), shared by the indexer kernel (kernels/indexer_logits/gpu/wgmma.cuh) and the host
// test of the scheme: the histogram of candidate keys' level-0 digits and the floor it gives.
// Plain C++ on top of radix.h (no vendor headers):
//   const uint32_t floor = CandidateFloorKey(hist, k);  // 0: fewer than k counted
#pragma once

#include <stdint.h>

#include "kernels/topk/gpu/radix.h"

namespace attnd::kernels::topk::gpu {

// Bins of a row's candidate histogram: radix.h's level-0 digit, key >> 21.
inline constexpr int kCandidateBins = radix::kBins;
inline constexpr int kCandidateShift = 21;
// The indexer refreshes each row's floor once every this many 64-key tiles.
inline constexpr uint32_t kCandidateFloorEvery = 8;

// The lower edge (a key) of the highest bin b such that the histogram counts at least k keys in
// bins >= b; 0 when it counts fewer than k. Every key below it has k counted keys strictly
// above it. The kernel computes the same with one warp (CandidateFloor in wgmma.cuh).
ATTND_TOPK_HD uint32_t CandidateFloorKey(const uint32_t* hist, uint32_t k) {
  uint32_t acc = 0;
  for (int b = kCandidateBins - 1; b >= 0; --b) {
    acc += hist[b];
    if (acc >= k) return static_cast<uint32_t>(b) << kCandidateShift;
  }
  return 0u;
}

}  // namespace attnd::kernels::topk::gpu
