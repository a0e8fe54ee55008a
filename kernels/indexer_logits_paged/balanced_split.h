// The paged indexer's split from the lengths (`cuda_wgmma_bal`, opt-in; docs/KERNELS.md "Paged
// indexer on Hopper", "A split from the lengths"). Plain C++: the arithmetic every CTA of the
// balanced kernel runs on the device (gpu/wgmma.cuh), and the host reference its tests use.
//
// The even split cuts every query block's columns into the same chunks, from the shapes alone,
// so a batch of ragged lengths waits for its longest request. Here each query block j needs
// n_j pages (its longest window over 64, read from context_lens on the device) and is cut
// alone into k_j = max(1, ceil(n_j / t)) pieces of near-equal page counts, t the smallest
// width with sum_j k_j <= the launched CTAs. The indexer has no partials to combine, so a
// piece is a plain chunk of the even kernel: whole pages from a multiple of 64, the block's
// last piece running to N and writing -inf past the pages (an empty block is that piece
// alone).
//   t = the search below (device) or PagedBalancedWidth (host);
//   k = PagedPiecesOf(n, t); piece r of k: pages [PagedPieceStart(n, k, r), ...(r + 1)).
#pragma once

#include <cstdint>
#include <vector>

namespace attnd::kernels::indexer_logits_paged {

// Query blocks the balanced kernel takes at most: every CTA stages each block's page count
// in shared memory (4 bytes a block) and its search passes read them all.
inline constexpr int64_t kPagedBalancedMaxBlocks = 2048;
// Candidate widths a search pass tries (one a warp of the 384-thread CTA).
inline constexpr int32_t kPagedSearchWarps = 12;

// Pieces of a block of n pages at width t (>= 1): one at least (an empty block still writes
// its -inf row), else ceil(n / t). 32-bit: n and t stay below 2^26 (N < 2^31, 64-key pages).
constexpr uint32_t PagedPiecesOf(uint32_t n, uint32_t t) { return n > t ? (n + t - 1) / t : 1u; }

// The first page of piece r of k (r <= k; r = k gives n): even cuts, every piece >= 1 page
// when k <= n.
constexpr uint32_t PagedPieceStart(uint32_t n, uint32_t k, uint32_t r) {
  return static_cast<uint32_t>(uint64_t{r} * n / k);
}

// Bounds of the smallest feasible width over `blocks` blocks of `total` pages (longest the
// largest n_j) for `ctas` CTAs (>= blocks): no t below ceil(total / ctas) fits (its pieces
// alone outnumber the CTAs), and t = ceil(total / (ctas - blocks)) or t = longest always fits
// (sum_j ceil(n_j / t) <= total / t + blocks). Both at least 1.
struct PagedWidthRange {
  uint32_t lo, hi;
};
constexpr PagedWidthRange PagedWidthBounds(int64_t total, int64_t longest, int64_t blocks,
                                           int64_t ctas) {
  int64_t lo = ctas > 0 ? (total + ctas - 1) / ctas : longest;
  int64_t hi = longest;
  if (ctas > blocks) {
    const int64_t fit = (total + (ctas - blocks) - 1) / (ctas - blocks);
    hi = fit < hi ? fit : hi;
  }
  if (hi < 1) hi = 1;
  if (lo < 1) lo = 1;
  if (lo > hi) lo = hi;
  return {static_cast<uint32_t>(lo), static_cast<uint32_t>(hi)};
}

// The even split's width as a first guess: the longest block's pages over the pieces each
// block would get if all were as long (at equal lengths this is the answer).
constexpr uint32_t PagedWidthGuess(int64_t longest, int64_t blocks, int64_t ctas) {
  const int64_t per = blocks > 0 && ctas > blocks ? ctas / blocks : 1;
  const int64_t t = (longest + per - 1) / per;
  return static_cast<uint32_t>(t < 1 ? 1 : t);
}

// The width warp w of a search pass tries over [lo, hi) (lo < hi). The first pass (guess > 0)
// tries guess - 1 and guess (clamped into the range) in warps 0 and 1, so that at equal
// lengths one pass settles it, and spreads the other warps over the range; later passes
// (guess 0) spread all kPagedSearchWarps, the first at lo when the range is narrow. A pass
// keeps hi = the smallest width tried that fits and lo = one past the largest that does not,
// so it ends with lo == hi, the smallest feasible width, after about log13 of the range passes.
constexpr uint32_t PagedSearchCandidate(uint32_t lo, uint32_t hi, int32_t w, uint32_t guess) {
  if (guess > 0) {
    if (w < 2) {
      const uint32_t c = guess - 1 + static_cast<uint32_t>(w);
      return c < lo ? lo : (c >= hi ? hi - 1 : c);
    }
    return lo + static_cast<uint32_t>(uint64_t{hi - lo} * static_cast<uint64_t>(w - 1) /
                                      (kPagedSearchWarps - 1));
  }
  return lo + static_cast<uint32_t>(uint64_t{hi - lo} * static_cast<uint64_t>(w + 1) /
                                    (kPagedSearchWarps + 1));
}

// Host reference: the smallest width t with sum_j PagedPiecesOf(n_j, t) <= ctas (ctas >=
// n.size() >= 1), by bisection.
inline uint32_t PagedBalancedWidth(const std::vector<uint32_t>& n, int64_t ctas) {
  int64_t total = 0, longest = 0;
  for (const uint32_t v : n) {
    total += v;
    longest = v > longest ? v : longest;
  }
  auto fits = [&](uint32_t t) {
    int64_t pieces = 0;
    for (const uint32_t v : n) pieces += PagedPiecesOf(v, t);
    return pieces <= ctas;
  };
  PagedWidthRange r = PagedWidthBounds(total, longest, static_cast<int64_t>(n.size()), ctas);
  while (r.lo < r.hi) {
    const uint32_t mid = r.lo + (r.hi - r.lo) / 2;
    if (fits(mid)) {
      r.hi = mid;
    } else {
      r.lo = mid + 1;
    }
  }
  return r.lo;
}

}  // namespace attnd::kernels::indexer_logits_paged
