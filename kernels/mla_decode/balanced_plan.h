// MLA decode's wave-balanced split plan (a launch option of the wgmma kernels, opt-in; docs/
// KERNELS.md "Wave-balanced splits"). Plain C++ shared by the host plan, the kernels, the
// combine and the tests.
//
// With fewer (request, row block) items than CTA slots, even splits leave slots idle or make
// every slot wait for the same number of tiles (B128 H64 over 32K: 128 CTAs of 512 tiles on 132
// SMs). Here the requests' tiles (each request its table's capacity, `tiles`) are laid end to
// end and cut into `ranges` ranges of `width` tiles, one per slot group (a group is the
// m_blocks CTAs of one range: the row blocks of a request read the same pages together). A
// range is one piece, or two where a request boundary falls inside it (width < tiles, so at
// most one does). Each piece is its own CTA group: the first wave runs every range's smaller
// piece (or its only one), ordered by that piece's size; the second wave runs the larger
// pieces of the cut ranges in the same order, so the group that finishes k-th (the k-th
// smallest first piece, if CTAs start in launch order as slots free) takes the k-th largest
// second piece, and every slot ends near `width` tiles. The launch order only moves the
// balance: every piece runs once whatever the order. A piece's partial goes to slot
// `range - first range of its request` of that request, which the combine merges.
//   const BalancedShape s = BalancedShapeFor(requests, tiles, slots / m_blocks, 2, kMaxSplits);
//   uint8_t order[kBalancedMaxRanges];
//   const int32_t cut = BalancedOrder(s, order);  // launch (s.ranges + cut) · m_blocks CTAs
//   const BalancedPiece piece = BalancedPieceAt(s, order, cut, blockIdx.x / m_blocks);
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

namespace attnd::kernels::mla_decode {

// Range ids are bytes in the launch's order table.
inline constexpr int32_t kBalancedMaxRanges = 255;

struct BalancedShape {
  int64_t requests = 0;    // B
  int64_t tiles = 0;       // tiles of each request (its table's capacity in kernel tiles)
  int64_t width = 0;       // tiles of a range
  int32_t ranges = 0;      // ceil(requests · tiles / width); 0: the plan does not apply
  int32_t max_pieces = 0;  // partial slots a request may need (at most ranges it meets)
};

// One CTA group's work: tiles [begin, end) of `request` (before its own length clips them),
// its partial in slot `slot`.
struct BalancedPiece {
  int64_t request;
  int64_t begin, end;
  int32_t slot;
};

// The plan for `requests` requests of `tiles` tiles over about `ranges_wanted` ranges, each
// range at least `min_width` tiles, or ranges 0 where it does not apply: fewer range slots than
// requests plus one (a range per request already), ranges that would hold a whole request, or
// more than `max_pieces_allowed` partial slots a request.
constexpr BalancedShape BalancedShapeFor(int64_t requests, int64_t tiles, int64_t ranges_wanted,
                                         int64_t min_width, int64_t max_pieces_allowed) {
  BalancedShape s;
  if (requests <= 0 || tiles <= 0 || tiles > (int64_t{1} << 40)) return s;
  if (ranges_wanted > kBalancedMaxRanges) ranges_wanted = kBalancedMaxRanges;
  if (ranges_wanted <= requests) return s;
  const int64_t total = requests * tiles;  // < 2^8 · 2^40
  int64_t width = (total + ranges_wanted - 1) / ranges_wanted;
  if (width < min_width) width = min_width;
  if (width < 1 || width >= tiles) return s;
  // A request of `tiles` tiles meets at most floor((tiles - 1) / width) + 2 ranges.
  const int64_t max_pieces = (tiles - 1) / width + 2;
  if (max_pieces > max_pieces_allowed) return s;
  s.requests = requests;
  s.tiles = tiles;
  s.width = width;
  s.ranges = static_cast<int32_t>((total + width - 1) / width);
  s.max_pieces = static_cast<int32_t>(max_pieces);
  return s;
}

// Range c's tiles [lo, hi) in the requests laid end to end, and the request boundary inside it
// (cut, lo < cut < hi) or -1.
struct BalancedRange {
  int64_t lo, hi, cut;
};
constexpr BalancedRange BalancedRangeOf(const BalancedShape& s, int64_t c) {
  const int64_t total = s.requests * s.tiles;
  const int64_t lo = c * s.width;
  const int64_t hi = lo + s.width < total ? lo + s.width : total;
  const int64_t next = (lo / s.tiles + 1) * s.tiles;  // the first boundary above lo
  return {lo, hi, next < hi ? next : -1};
}

// Tiles of range c's first-wave piece: the smaller side of its cut (the first on a tie), or the
// whole range.
constexpr int64_t BalancedFirstTiles(const BalancedRange& r) {
  if (r.cut < 0) return r.hi - r.lo;
  return r.cut - r.lo <= r.hi - r.cut ? r.cut - r.lo : r.hi - r.cut;
}

// Fills order[0, s.ranges) with the range ids in launch order: the cut ranges first, by their
// first piece's tiles (then id), then the others by tiles (then id). Returns the number of cut
// ranges, i.e. of second-wave groups. Host only (every launch: each key computed once).
inline int32_t BalancedOrder(const BalancedShape& s, uint8_t* order) {
  std::pair<int64_t, int32_t> keyed[kBalancedMaxRanges];
  int32_t cut = 0;
  for (int32_t c = 0; c < s.ranges; ++c) {
    const BalancedRange r = BalancedRangeOf(s, c);
    if (r.cut >= 0) ++cut;
    keyed[c] = {(r.cut >= 0 ? 0 : s.tiles + 1) + BalancedFirstTiles(r), c};
  }
  std::sort(keyed, keyed + s.ranges);
  for (int32_t i = 0; i < s.ranges; ++i) order[i] = static_cast<uint8_t>(keyed[i].second);
  return cut;
}

// Partial slots request b fills: the ranges it meets.
constexpr int32_t BalancedPiecesOf(const BalancedShape& s, int64_t b) {
  return static_cast<int32_t>(((b + 1) * s.tiles - 1) / s.width - (b * s.tiles) / s.width + 1);
}

// The piece of CTA group `group` (0 <= group < s.ranges + cut): group < s.ranges runs the first
// piece of range order[group], else the second piece of range order[group - s.ranges] (a cut
// range: BalancedOrder puts them first).
constexpr BalancedPiece BalancedPieceAt(const BalancedShape& s, const uint8_t* order,
                                        int64_t group) {
  const bool second = group >= s.ranges;
  const int64_t c = order[second ? group - s.ranges : group];
  const BalancedRange r = BalancedRangeOf(s, c);
  int64_t lo = r.lo, hi = r.hi;
  if (r.cut >= 0) {
    const bool first_is_left = r.cut - r.lo <= r.hi - r.cut;
    if (first_is_left != second) {
      hi = r.cut;
    } else {
      lo = r.cut;
    }
  }
  const int64_t request = lo / s.tiles;
  const int64_t base = request * s.tiles;
  return {request, lo - base, hi - base, static_cast<int32_t>(c - base / s.width)};
}

}  // namespace attnd::kernels::mla_decode
