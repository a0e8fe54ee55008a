// MLA decode's length-aware schedule (a launch option of the wgmma kernels, opt-in; docs/
// KERNELS.md "A schedule from the lengths"). Plain C++: the arithmetic the schedule kernel
// (gpu/schedule.cu) runs on the device, and the host reference its tests compare with.
//
// Even splits give every request the same number of CTAs, so a batch of ragged lengths waits
// for its longest request: B128 H64 over a 32K table with lengths spread over [1, 32K] runs
// 128 CTAs of up to 512 tiles while the mean is ~256. Here the requests' own tiles (from
// cache_seqlens, on the device) are laid end to end and cut every `width` tiles, width =
// ceil(total / groups) (groups: the CTA slots over the row blocks of a request); each cut
// piece of a request is one CTA group, its partial in piece slot `first[b] + k` (the pieces of a
// request are consecutive, so the combine reads a contiguous run). The groups run the pieces
// longest first (ties: the earlier piece), so slots that free early take the short ones: a
// range of `width` split in two becomes a long piece in the first wave and a short one taken
// by whichever slot frees first.
//   const int64_t w = ScheduleWidth(total, longest, groups, 2, kMaxSplits);
//   const int32_t n = SchedulePiecesOf(prefix, tiles, w);  // pieces of a request
//   const ScheduleSpan s = SchedulePiece(prefix, tiles, w, k);  // its k-th, tiles [lo, hi)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace attnd::kernels::mla_decode {

// Groups plus requests at most: the schedule kernel runs a thread per request and counts each
// piece's rank against the others (at most groups + requests - 1 pieces), so this bounds its
// work and shared memory. Larger batches keep the even plan.
inline constexpr int32_t kScheduleMaxLaunched = 512;
// Tiles a piece spans at least (the even plan's two tiles a split, gpu/plan.cu).
inline constexpr int64_t kScheduleMinWidth = 2;

// Tiles a piece spans at most: the total over the groups, at least `min_width`, and wide
// enough that no request is cut into more than `max_pieces` (>= 2) pieces. 0 when the total
// is 0.
constexpr int64_t ScheduleWidth(int64_t total, int64_t longest, int64_t groups, int64_t min_width,
                                int64_t max_pieces) {
  if (total <= 0 || groups <= 0 || max_pieces < 2) return 0;
  int64_t w = (total + groups - 1) / groups;
  if (w < min_width) w = min_width;
  // A request of t tiles is cut into at most floor((t - 1) / w) + 2 pieces.
  const int64_t need = (longest - 1) / (max_pieces - 1) + 1;
  return w < need ? need : w;
}

// The even plan's cut, kept where the end-to-end cut gains too little (measured 2026-12-07 on
// an H100: at equal lengths the end-to-end cut ran 5-6 % slower than even splits, its short
// remainders of cut requests running last, few to an SM, after the long pieces): the width
// of a request's own pieces when each request is cut alone into pieces of
// ceil(longest / even_splits) tiles, or 0 to keep the end-to-end cut of `width`. Kept where
// that width is under 7/8 of the even plan's makespan (its width times its waves over the
// groups, assuming a piece's time grows with its tiles), or where the even cut's pieces
// (requests x even_splits at most) would not fit the `launched` groups. even_splits < 1: never.
inline constexpr int64_t kScheduleGainNum = 7, kScheduleGainDen = 8;
constexpr int64_t ScheduleEvenWidth(int64_t width, int64_t longest, int64_t requests,
                                    int64_t groups, int64_t launched, int64_t even_splits,
                                    int64_t min_width) {
  if (width <= 0 || longest <= 0 || requests <= 0 || groups <= 0 || even_splits < 1 ||
      requests * even_splits > launched) {
    return 0;
  }
  int64_t w = (longest + even_splits - 1) / even_splits;
  if (w < min_width) w = min_width;
  const int64_t waves = (requests * even_splits + groups - 1) / groups;
  return width * kScheduleGainDen < w * waves * kScheduleGainNum ? 0 : w;
}

// Pieces of a request of `tiles` tiles starting at `prefix` in the end-to-end order.
constexpr int32_t SchedulePiecesOf(int64_t prefix, int64_t tiles, int64_t width) {
  if (tiles <= 0 || width <= 0) return 0;
  return static_cast<int32_t>((prefix + tiles - 1) / width - prefix / width + 1);
}

struct ScheduleSpan {
  int64_t lo, hi;  // the request's tiles [lo, hi)
};

// The k-th piece (0 <= k < SchedulePiecesOf) of that request.
constexpr ScheduleSpan SchedulePiece(int64_t prefix, int64_t tiles, int64_t width, int64_t k) {
  const int64_t first = prefix / width;
  const int64_t lo = k == 0 ? 0 : (first + k) * width - prefix;
  const int64_t end = (first + k + 1) * width - prefix;
  return {lo, end < tiles ? end : tiles};
}

// One launched CTA group: request, tiles [lo, hi), and its partial's piece slot. Groups past
// the pieces get request 0, an empty span and a slot no request reads (their own index).
struct ScheduleEntry {
  int32_t request, lo, hi, slot;
};

// Host reference of the schedule kernel: the entries of `groups_launched` groups in launch
// order, first[b] and pieces[b] per request (width from ScheduleWidth over `groups`, or each
// request cut alone where ScheduleEvenWidth with `even_splits` says so).
inline std::vector<ScheduleEntry> BuildSchedule(const std::vector<int64_t>& tiles, int64_t groups,
                                                int64_t groups_launched, int64_t min_width,
                                                int64_t max_pieces, std::vector<int32_t>* first,
                                                std::vector<int32_t>* pieces,
                                                int64_t even_splits = 0) {
  int64_t total = 0, longest = 0;
  for (const int64_t t : tiles) {
    total += t;
    longest = t > longest ? t : longest;
  }
  const int64_t e2e = ScheduleWidth(total, longest, groups, min_width, max_pieces);
  const int64_t even = ScheduleEvenWidth(e2e, longest, static_cast<int64_t>(tiles.size()), groups,
                                         groups_launched, even_splits, min_width);
  const int64_t w = even > 0 ? even : e2e;
  std::vector<ScheduleEntry> flat;
  first->assign(tiles.size(), 0);
  pieces->assign(tiles.size(), 0);
  int64_t prefix = 0;
  for (std::size_t b = 0; b < tiles.size(); ++b) {
    const int64_t at = even > 0 ? 0 : prefix;  // the even cut starts every request afresh
    const int32_t n = SchedulePiecesOf(at, tiles[b], w);
    (*first)[b] = static_cast<int32_t>(flat.size());
    (*pieces)[b] = n;
    for (int32_t k = 0; k < n; ++k) {
      const ScheduleSpan s = SchedulePiece(at, tiles[b], w, k);
      flat.push_back({static_cast<int32_t>(b), static_cast<int32_t>(s.lo),
                      static_cast<int32_t>(s.hi), static_cast<int32_t>(flat.size())});
    }
    prefix += tiles[b];
  }
  // Longest first, ties in piece order (the device's rank: the pieces longer than it, or as
  // long and earlier).
  std::vector<ScheduleEntry> out(static_cast<std::size_t>(groups_launched));
  for (std::size_t i = 0; i < flat.size(); ++i) {
    int64_t rank = 0;
    const int32_t len = flat[i].hi - flat[i].lo;
    for (std::size_t j = 0; j < flat.size(); ++j) {
      const int32_t lj = flat[j].hi - flat[j].lo;
      rank += lj > len || (lj == len && j < i) ? 1 : 0;
    }
    if (rank < groups_launched) out[static_cast<std::size_t>(rank)] = flat[i];
  }
  for (int64_t g = static_cast<int64_t>(flat.size()); g < groups_launched; ++g) {
    out[static_cast<std::size_t>(g)] = {0, 0, 0, static_cast<int32_t>(g)};
  }
  return out;
}

}  // namespace attnd::kernels::mla_decode
