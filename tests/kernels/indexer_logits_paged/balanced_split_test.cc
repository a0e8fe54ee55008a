// The paged indexer's split from the lengths (kernels/indexer_logits_paged/balanced_split.h):
// the width is the smallest that fits the CTAs, the device's pass-wise search (mirrored here
// step for step) finds exactly it, and the pieces cover each block's pages once, none wider
// than the width. Host only; the kernel's outputs are checked in gpu_test.cc.
#include "kernels/indexer_logits_paged/balanced_split.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace attnd::kernels::indexer_logits_paged {
namespace {

int64_t Pieces(const std::vector<uint32_t>& n, uint32_t t) {
  int64_t k = 0;
  for (const uint32_t v : n) k += PagedPiecesOf(v, t);
  return k;
}

// The device's search (gpu/wgmma.cuh BalancedBlock): each pass tries kPagedSearchWarps
// candidates at once and keeps the smallest that fits and one past the largest that does not.
uint32_t SearchLikeDevice(const std::vector<uint32_t>& n, int64_t ctas, int* passes) {
  int64_t total = 0, longest = 0;
  for (const uint32_t v : n) {
    total += v;
    longest = std::max<int64_t>(longest, v);
  }
  const int64_t blocks = static_cast<int64_t>(n.size());
  PagedWidthRange r = PagedWidthBounds(total, longest, blocks, ctas);
  uint32_t guess = PagedWidthGuess(longest, blocks, ctas);
  *passes = 0;
  while (r.lo < r.hi) {
    uint32_t lo = r.lo, hi = r.hi;
    for (int32_t w = 0; w < kPagedSearchWarps; ++w) {
      const uint32_t c = PagedSearchCandidate(r.lo, r.hi, w, guess);
      EXPECT_GE(c, r.lo);
      EXPECT_LT(c, r.hi);
      if (Pieces(n, c) <= ctas) {
        hi = std::min(hi, c);
      } else {
        lo = std::max(lo, c + 1);
      }
    }
    EXPECT_LE(lo, hi);
    r = {lo, hi};
    guess = 0;
    if (++*passes > 64) break;
  }
  return r.lo;
}

// The smallest t >= 1 with Pieces(n, t) <= ctas, by trying every t.
uint32_t BruteWidth(const std::vector<uint32_t>& n, int64_t ctas) {
  for (uint32_t t = 1;; ++t) {
    if (Pieces(n, t) <= ctas) return t;
  }
}

TEST(PagedBalancedSplit, EqualLengthsGiveTheEvenSplit) {
  // 32K tokens a request (512 pages) over 264 CTA slots (two a SM of 132): B128 and B132 two
  // pieces of 256 pages, B64 four of 128, as the even split's chunks.
  EXPECT_EQ(PagedBalancedWidth(std::vector<uint32_t>(128, 512), 264), 256u);
  EXPECT_EQ(PagedBalancedWidth(std::vector<uint32_t>(132, 512), 264), 256u);
  EXPECT_EQ(PagedBalancedWidth(std::vector<uint32_t>(64, 512), 264), 128u);
  // As many blocks as CTAs: one piece each.
  EXPECT_EQ(PagedBalancedWidth(std::vector<uint32_t>(264, 512), 264), 512u);
  // Empty blocks still take a piece (their -inf row); all empty: width 1.
  EXPECT_EQ(PagedBalancedWidth(std::vector<uint32_t>(10, 0), 264), 1u);
  EXPECT_EQ(PagedBalancedWidth({0, 0, 7}, 5), 3u);
}

// At equal lengths the device's first pass settles the width (its guess is the answer).
TEST(PagedBalancedSplit, EqualLengthsTakeOnePass) {
  for (const int64_t blocks : {1, 7, 64, 100, 128, 132, 200, 264}) {
    for (const uint32_t pages : {1u, 3u, 64u, 511u, 512u, 4096u}) {
      const std::vector<uint32_t> n(static_cast<size_t>(blocks), pages);
      int passes = 0;
      EXPECT_EQ(SearchLikeDevice(n, 264, &passes), PagedBalancedWidth(n, 264));
      EXPECT_LE(passes, 1) << blocks << " blocks of " << pages << " pages";
    }
  }
}

TEST(PagedBalancedSplit, SmallestWidthAndDeviceSearchAgree) {
  std::mt19937_64 rng(20261208);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t blocks = 1 + static_cast<int64_t>(rng() % 300);
    const int64_t ctas = blocks + static_cast<int64_t>(rng() % 300);
    const uint32_t max_pages = trial % 4 == 0 ? 4096u : 1u + static_cast<uint32_t>(rng() % 600);
    std::vector<uint32_t> n(static_cast<size_t>(blocks));
    for (uint32_t& v : n) v = static_cast<uint32_t>(rng() % (max_pages + 1));
    if (trial % 5 == 0) std::fill(n.begin(), n.end(), max_pages);  // equal lengths
    SCOPED_TRACE("trial " + std::to_string(trial));
    const uint32_t t = PagedBalancedWidth(n, ctas);
    EXPECT_EQ(t, BruteWidth(n, ctas));
    EXPECT_LE(Pieces(n, t), ctas);
    if (t > 1) {
      EXPECT_GT(Pieces(n, t - 1), ctas);
    }
    int passes = 0;
    EXPECT_EQ(SearchLikeDevice(n, ctas, &passes), t);
    EXPECT_LE(passes, 5);  // log13 of a range below 2^14, plus one
    // The bounds hold the answer.
    int64_t total = 0, longest = 0;
    for (const uint32_t v : n) {
      total += v;
      longest = std::max<int64_t>(longest, v);
    }
    const PagedWidthRange r = PagedWidthBounds(total, longest, blocks, ctas);
    EXPECT_LE(r.lo, t);
    EXPECT_GE(r.hi, t);
    EXPECT_LE(Pieces(n, r.hi), ctas);
  }
}

TEST(PagedBalancedSplit, PiecesCoverEachBlockOnce) {
  for (uint32_t n = 0; n <= 300; ++n) {
    for (const uint32_t t : {1u, 2u, 3u, 7u, 64u, 100u, 255u, 256u, 1000u}) {
      const uint32_t k = PagedPiecesOf(n, t);
      ASSERT_GE(k, 1u);
      ASSERT_EQ(PagedPieceStart(n, k, 0), 0u);
      ASSERT_EQ(PagedPieceStart(n, k, k), n);
      for (uint32_t r = 0; r < k; ++r) {
        const uint32_t a = PagedPieceStart(n, k, r), b = PagedPieceStart(n, k, r + 1);
        ASSERT_LE(b - a, t) << "n " << n << " t " << t << " piece " << r;
        if (n > 0) {
          ASSERT_GE(b - a, 1u) << "n " << n << " t " << t << " piece " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace attnd::kernels::indexer_logits_paged
