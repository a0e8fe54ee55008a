// The arithmetic of the streaming GPU top-k (stream.cu), shared by the kernel and its host
// emulation test: how a window splits into 16-byte groups and cluster segments, the speculative
// first-chunk threshold, the admission key a compaction leaves, and the cluster size for a shape.
// Plain C++ on top of radix.h (no vendor headers), so the CPU-only build tests it:
//   const SegmentPlan seg = PlanSegment(begin, len, misalign, rank, cluster);
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/topk/gpu/radix.h"

namespace attnd::kernels::topk::gpu {

// Elements of one 16-byte group (a uint4 load of four f32 logits).
inline constexpr uint32_t kGroupElems = 4;
// Candidates a CTA keeps in shared memory (keys and columns, 8 bytes each): room for k <= kMaxK
// kept entries plus one whole chunk of 4096 admitted ones.
inline constexpr uint32_t kCapacity = 8192;
// Logits one CTA streams per chunk (threads x groups per thread x 4).
inline constexpr uint32_t kChunkElems = 4096;
// Windows at least this many times k get a speculative threshold from their first chunks; shorter
// ones admit every selectable entry until the buffer fills.
inline constexpr uint32_t kSpeculateMinRowsPerK = 4;

// The f32 bits a selectable key encodes (the inverse of radix::KeyOfBits on selectable keys).
ATTND_TOPK_HD uint32_t BitsOfKey(uint32_t key) {
  return (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
}

// The f32 threshold that admits (x >= threshold, as floats) every logit whose key is >= key: the
// float of that key, -FLT_MAX (kMinSelectableKey) included. It also admits -0.0 when key is the
// key of +0.0 (a superset, which the selection tolerates); NaN and -inf never pass.
ATTND_TOPK_HD uint32_t AdmitBits(uint32_t key) {
  return key > radix::kPosInfKey ? 0x7fc00000u /* NaN: admits nothing */ : BitsOfKey(key);
}

// The lowest key a later column may have and still matter, once a select `t` kept exactly the k
// best (ties to the lowest columns) of everything so far: above the k-th key when the walk went
// down to single keys (a later equal key loses the tie), else the bottom of the bin taken whole.
ATTND_TOPK_HD uint32_t AdmitKeyAfter(const radix::Threshold& t) {
  return t.shift == 0 ? t.prefix + 1u : (t.prefix << t.shift);
}

// One CTA's part of a row window [begin, begin + len): the window is read as 16-byte groups from
// column begin - misalign (misalign = the window start's element offset within 16 bytes), group g
// covering columns first_col + 4g .. + 3; the cluster's CTAs take contiguous group ranges in rank
// order (so rank order is column order).
struct SegmentPlan {
  int64_t first_col = 0;  // column of group 0's first element (may be below 0)
  uint32_t groups = 0;    // groups of the whole window
  uint32_t group_lo = 0;  // this CTA's groups [group_lo, group_hi)
  uint32_t group_hi = 0;
  uint32_t full_lo = 0;  // groups [full_lo, full_hi) lie wholly inside the window
  uint32_t full_hi = 0;
};

// floor(groups * part / cluster) in 32-bit arithmetic (part <= cluster). One CTA per row (the
// many-row launches) skips the divisions, which every warp of the filter kernel repeats per row.
ATTND_TOPK_HD uint32_t SplitPoint(uint32_t groups, uint32_t part, uint32_t cluster) {
  if (cluster == 1) return groups * part;
  return groups / cluster * part + groups % cluster * part / cluster;
}

ATTND_TOPK_HD SegmentPlan PlanSegment(int64_t begin, uint32_t len, uint32_t misalign, uint32_t rank,
                                      uint32_t cluster) {
  SegmentPlan s;
  s.first_col = begin - static_cast<int64_t>(misalign);
  const uint32_t span = len + misalign;  // columns from first_col: len < 2^31, so no wrap
  s.groups = span / kGroupElems + (span % kGroupElems != 0 ? 1u : 0u);
  s.group_lo = SplitPoint(s.groups, rank, cluster);
  s.group_hi = SplitPoint(s.groups, rank + 1, cluster);
  s.full_lo = misalign > 0 ? 1u : 0u;
  s.full_hi = span / kGroupElems;
  return s;
}

// Whether a window of `len` columns gets a speculative threshold (see SpeculationRank).
ATTND_TOPK_HD bool Speculates(uint32_t len, uint32_t k) {
  return static_cast<uint64_t>(len) >= static_cast<uint64_t>(kSpeculateMinRowsPerK) * k;
}

// Columns the cluster's first chunks cover (the speculation's sample): each CTA's first
// `chunk_groups` groups, clipped to its segment (and the sample to the window).
ATTND_TOPK_HD uint32_t SampleColumns(uint32_t len, uint32_t misalign, uint32_t cluster,
                                     uint32_t chunk_groups) {
  const uint32_t groups = PlanSegment(0, len, misalign, 0, cluster).groups;
  uint64_t sampled = 0;
  for (uint32_t r = 0; r < cluster; ++r) {
    const uint32_t g = SplitPoint(groups, r + 1, cluster) - SplitPoint(groups, r, cluster);
    sampled += g < chunk_groups ? g : chunk_groups;
  }
  const uint64_t cols = sampled * kGroupElems;
  return cols < len ? static_cast<uint32_t>(cols) : len;
}

// The rank, among the sample's keys, whose level-0 bin becomes the speculative floor: the expected
// number of sampled entries above the window's k-th largest, plus three standard deviations and a
// little (as the CPU's RowSelector), so that the floor very likely leaves >= k entries; a wrong
// guess costs a second read of the row, never a wrong answer. 0 when speculation cannot help: the
// sample is more than half the window, or the rank would not be below the sample's size.
// In f32 (correctly rounded division and square root on host and device alike).
ATTND_TOPK_HD uint32_t SpeculationRank(uint32_t k, uint32_t sample, uint32_t len) {
  if (sample == 0 || static_cast<uint64_t>(sample) * 2 > len) return 0;
  const float mean = static_cast<float>(k) * (static_cast<float>(sample) / static_cast<float>(len));
  const float rank = mean + 3.0f * sqrtf(mean) + 2.0f;
  if (rank >= static_cast<float>(sample)) return 0;
  return static_cast<uint32_t>(rank) + 1u;
}

// CTAs per row (1, 2, 4 or 8): rows that leave SMs idle split each window over a cluster, as far
// as `max_cluster` allows, every CTA keeps an SM of its own (the row's chain of steps is the
// latency) and >= kMinSegmentCols of the N columns.
inline constexpr int64_t kMinSegmentCols = 8192;
inline int ClusterSizeFor(int64_t rows, int64_t cols, int64_t sms, int max_cluster) {
  int cs = 1;
  while (cs * 2 <= max_cluster && rows * cs * 2 <= sms && cols / (cs * 2) >= kMinSegmentCols) {
    cs *= 2;
  }
  return cs;
}

}  // namespace attnd::kernels::topk::gpu
