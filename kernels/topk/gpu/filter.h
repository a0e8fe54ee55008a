// The threshold-filter GPU top-k (filter.cu, CUDA): each window is read once from HBM with
// 16-byte loads; the logits at or above a floor taken from a sample of the window go to a
// candidate buffer in shared memory (unordered, one shared atomic per warp and chunk); an exact
// radix select on the buffer and an ordered write through per-column bitmaps give exactly the CPU
// implementation's output. Persistent CTAs over rows; a thread-block cluster per row (sm_90, the
// candidates gathered into the leader CTA through DSMEM) when rows are few. Capture-safe
// launchers. docs/KERNELS.md "Top-k, threshold filter".
//   if (gpu::SupportsFilter(p, &why)) GPU_RETURN_IF_ERROR(gpu::LaunchTopkFilter(p, stream));
#pragma once

#include <cstdint>
#include <string>

#include "kernels/common/gpu/vendor.h"
#include "kernels/topk/params.h"

namespace attnd::kernels::topk::gpu {

// Launch choices; 0 picks the default for the shape and device. Tests and benchmarks force them.
struct FilterConfig {
  int threads = 0;        // 256, 512 or 1024 per CTA (0: 1024 for one wave, else 256 for k <= 2048)
  int cluster = 0;        // CTAs per row: 1, 2, 4 or 8 (2+ needs sm_90)
  bool speculate = true;  // off: windows longer than the buffer take the exact re-reading path
  // Bulk-prefetch each CTA's next segment into L2 (sm_90). Off by default: slower at 4096 ×
  // 65536, within noise elsewhere (docs/KERNELS.md "Top-k, threshold filter").
  bool prefetch = false;
  // 256-thread CTAs on rows of their own refine the sampled floor from its level-0 bin to a
  // level-1 bin (two more barriers per row; a floor near the sample's rank instead of up to a
  // quarter octave below it, which their smaller buffer needs). Off only to measure or test it;
  // the wider CTAs never refine (docs/KERNELS.md "Top-k, threshold filter").
  bool fine_floor = true;
  // The sampled floor's margin in standard deviations of the sample's count above the k-th
  // largest (FloorRank; 0–16): a larger one admits more candidates and sends fewer rows down
  // the exact re-reading path. -1: the measured default, 4 for 256-thread CTAs with the refined
  // floor, 3 for the others (docs/KERNELS.md "Top-k, threshold filter").
  float floor_sigmas = -1.0f;
};

// Whether the filter takes `rows` rows of `cols` columns on the current device: at most one wave
// (one row per SM), or rows longer than the candidate buffer (a sampled floor); more rows of at
// most kFilterCapacity columns go to cuda_stream. SupportsFilter refuses the rest with it.
bool FilterTakesShape(int64_t rows, int64_t cols);

// True when the device can run the kernel for p's column count (CUDA, shared memory for the
// buffer and two bitmaps of N bits per block); every validated Params is then supported.
bool SupportsFilter(const Params& p, std::string* why);

::attnd::gpu::Error LaunchTopkFilter(const Params& p, ::attnd::gpu::Stream stream);

// The select of the indexer → top-k candidate form (docs/KERNELS.md "Indexer → top-k
// candidates"): row r's candidates are counts[r] (key, column) u32 pairs at entries + 2·r·ld
// (keys radix.h's order-preserving map), every entry of the row's top k among those with key >=
// floors[r] (kernels/indexer_logits/gpu/launch.h LaunchWgmmaCandidates writes them). p is the
// top-k call the candidates stand in for: p.logits gives the shape only (its data is not read),
// its windows (ks / ke or lengths) are read again, and its output is exactly what the filter
// gives on those logits. values must be absent; ld >= p.logits.dim(1).
struct TopkCandidateRows {
  const uint32_t* entries = nullptr;
  int64_t ld = 0;  // pairs per row
  const uint32_t* counts = nullptr;
  const uint32_t* floors = nullptr;
  // Threads per CTA, 256 (four per SM, a 4608-entry buffer) or 512 (two, 8192); 0: 256 when k
  // <= 2048 and four fit an SM at this column count, as the filter chooses past one wave.
  int threads = 0;
};
bool SupportsTopkFromCandidates(const Params& p, std::string* why);
::attnd::gpu::Error LaunchTopkFromCandidates(const Params& p, const TopkCandidateRows& c,
                                             ::attnd::gpu::Stream stream);
::attnd::gpu::Error LaunchTopkFilterWith(const Params& p, const FilterConfig& config,
                                         ::attnd::gpu::Stream stream);

}  // namespace attnd::kernels::topk::gpu
