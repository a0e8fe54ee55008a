// Launchers of the prefill indexer-logits GPU kernels (kernels in simt.cuh / mma.cuh /
// wgmma.cuh). Each takes a stream, never allocates and never synchronises (capture-safe); params
// were validated and point at device memory. The Supports rules live beside them so that they
// match the kernels.
//   if (MmaSupports(p, &why)) GPU_RETURN_IF_ERROR(LaunchMma(p, stream));
#pragma once

#include <string>

#include "kernels/common/gpu/vendor.h"
#include "kernels/indexer_logits/params.h"

namespace attnd::kernels::indexer_logits::gpu {

// The portable SIMT kernel: any validated params (H <= 128, D a multiple of 16, any strides and
// alignment). False only when the grid would not fit in one dimension (M beyond ~2^37 rows).
bool SimtSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchSimt(const Params& p, ::attnd::gpu::Stream stream);

#if defined(ATTND_GPU_CUDA)
// The Hopper kernel (TMA, fp8 wgmma): precision kFast only (its accumulator keeps 14 significant
// bits: docs/ACCURACY.md), H in {32, 64}, D = 128, q and k 16-B aligned (pointers and strides,
// bytes), k_scale 4-B aligned, M and N below 2^31 − 64, a device of compute capability exactly
// 9.0 (sm_90a).
bool WgmmaSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchWgmma(const Params& p, ::attnd::gpu::Stream stream);

// The same kernel's top-k candidate form (docs/KERNELS.md "Indexer → top-k candidates"): instead
// of (or, with p.logits present, as well as) the logits, each row's logits that may be among its
// k largest go to the row's candidates, (key, column) u32 pairs in radix.h's key order: row r's
// at entries + 2·r·ld, their number in counts[r] (<= the row's window), and a floor key in
// floors[r] such that every entry of the row's top k is a candidate with key >= it. ld must be at
// least N (nothing is dropped). kernels/topk/gpu/filter.h LaunchTopkFromCandidates selects from
// them. H 64 only (the per-query histograms), besides WgmmaSupports' rules.
struct WgmmaCandidates {
  uint32_t* entries = nullptr;
  int64_t ld = 0;  // pairs per row
  uint32_t* counts = nullptr;
  uint32_t* floors = nullptr;
  uint32_t k = 0;
  // Tiles between two raises of a row's floor, 1 to 64; 0: the default (topk/gpu/candidates.h
  // kCandidateFloorEvery). Any value keeps every top-k entry; it trades the consumers' time
  // against the number of candidates.
  uint32_t floor_every = 0;
  // The appends, histograms and floors on the producer warpgroup's three idle warps, fed the
  // tiles' values through shared memory, instead of on the consumers (docs/KERNELS.md "Indexer
  // → top-k candidates"). Every top-k entry is a candidate either way; which others are, and
  // their order in a row, may differ.
  bool helpers = false;
};
bool WgmmaCandidatesSupports(const Params& p, int64_t k, std::string* why);
::attnd::gpu::Error LaunchWgmmaCandidates(const Params& p, const WgmmaCandidates& c,
                                          ::attnd::gpu::Stream stream);

// The tensor-core kernel (fp8 converted to f16 exactly, f32 accumulation: both precisions): H in
// {32, 64}, D in {64, 128}, q and k 16-B aligned (pointers and strides, bytes), k_scale 4-B
// aligned, a device of compute capability >= 8.0.
bool MmaSupports(const Params& p, std::string* why);
::attnd::gpu::Error LaunchMma(const Params& p, ::attnd::gpu::Stream stream);
#endif

}  // namespace attnd::kernels::indexer_logits::gpu
