#include "kernels/topk/row_select.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <new>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace attnd::kernels::topk {
namespace {

// Rows at least this many times k are sampled for a threshold first; shorter ones are filtered
// at the selectable floor directly (most of the row survives anyway).
constexpr int64_t kSampleMinRowsPerK = 4;
constexpr int64_t kSampleMin = 256;
constexpr int64_t kSampleMax = 2048;
constexpr int64_t kColumnsPerSample = 64;

constexpr int kMaxDigitBits = 10;  // radix-select histograms of at most 1024 bins ...
constexpr int kMinDigitBits = 4;
constexpr int kHistWays = 4;         // ... four of them, so repeated bins do not chain increments
constexpr int64_t kSortCutoff = 32;  // fewer keys than this are sorted instead

#if defined(__AVX2__)
// For each 8-lane mask, the indices of its set lanes, lowest first, padded with zeros: as a vpermd
// permutation it moves the kept lanes to the front; added to eight consecutive columns it lists
// the kept columns.
struct CompressTable {
  alignas(8) uint8_t lanes[256][8];
  constexpr CompressTable() : lanes() {
    for (int m = 0; m < 256; ++m) {
      int out = 0;
      for (int lane = 0; lane < 8; ++lane) {
        if (m & (1 << lane)) lanes[m][out++] = static_cast<uint8_t>(lane);
      }
    }
  }
};
constexpr CompressTable kCompress;

inline __m256i CompressLanes(int mask) {
  return _mm256_cvtepu8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kCompress.lanes[mask])));
}

inline int32_t AsSigned(uint32_t u) { return static_cast<int32_t>(u ^ 0x80000000u); }
#endif

void MinMax(const uint32_t* keys, int64_t n, uint32_t* lo, uint32_t* hi) {
  uint32_t mn = 0xffffffffu, mx = 0;
  for (int64_t i = 0; i < n; ++i) {  // vectorises (vpminud / vpmaxud)
    mn = std::min(mn, keys[i]);
    mx = std::max(mx, keys[i]);
  }
  *lo = mn;
  *hi = mx;
}

}  // namespace

int64_t FilterAtLeast(const float* row, int64_t len, float threshold, int32_t col0, uint32_t* keys,
                      int32_t* cols) {
  int64_t count = 0;
  int64_t i = 0;
#if defined(__AVX2__)
  // Columns only: one compare, a table lookup and one store per eight entries.
  const __m256 t = _mm256_set1_ps(threshold);
  const __m256i eight = _mm256_set1_epi32(8);
  __m256i base = _mm256_set1_epi32(col0);
  for (; i + 8 <= len; i += 8) {
    const __m256 v = _mm256_loadu_ps(row + i);
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(v, t, _CMP_GE_OQ));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cols + count),
                        _mm256_add_epi32(base, CompressLanes(mask)));
    count += __builtin_popcount(static_cast<unsigned>(mask));
    base = _mm256_add_epi32(base, eight);
  }
#endif
  for (; i < len; ++i) {
    cols[count] = col0 + static_cast<int32_t>(i);
    count += row[i] >= threshold ? 1 : 0;
  }
  // The survivors' keys (a small fraction of the row when the threshold was sampled).
  const float* base_row = row - col0;
  for (int64_t j = 0; j < count; ++j) keys[j] = LogitKey(base_row[cols[j]]);
  return count;
}

uint32_t KthLargestKey(const uint32_t* keys, int64_t n, int64_t k, uint32_t* tmp,
                       int64_t* greater) {
  uint32_t hist[kHistWays][1 << kMaxDigitBits];
  const uint32_t* cur = keys;
  int64_t cur_n = n;
  int64_t need = k;  // rank of the answer among cur, 1-based from the top
  int64_t above = 0;
  uint32_t lo, hi;
  MinMax(cur, cur_n, &lo, &hi);
  for (;;) {
    if (lo == hi) {  // every remaining key is the answer
      *greater = above;
      return lo;
    }
    if (cur_n <= kSortCutoff) {
      uint32_t small[kSortCutoff];
      std::copy(cur, cur + cur_n, small);
      std::sort(small, small + cur_n, std::greater<uint32_t>());
      const uint32_t kth = small[need - 1];
      *greater =
          above + (std::lower_bound(small, small + cur_n, kth, std::greater<uint32_t>()) - small);
      return kth;
    }
    // Digits of up to kMaxDigitBits over [lo, hi], about one bin per key.
    const int width = 32 - __builtin_clz(hi - lo);
    const int bits = std::clamp(64 - __builtin_clzll(static_cast<uint64_t>(cur_n)), kMinDigitBits,
                                kMaxDigitBits);
    const int shift = std::max(0, width - bits);
    const uint32_t bins = ((hi - lo) >> shift) + 1;
    for (auto& way : hist) std::fill(way, way + bins, 0u);
    int64_t i = 0;
    for (; i + kHistWays <= cur_n; i += kHistWays) {
      for (int w = 0; w < kHistWays; ++w) ++hist[w][(cur[i + w] - lo) >> shift];
    }
    for (; i < cur_n; ++i) ++hist[0][(cur[i] - lo) >> shift];
    for (uint32_t b = 0; b < bins; ++b) {
      for (int w = 1; w < kHistWays; ++w) hist[0][b] += hist[w][b];
    }
    uint32_t bin = bins - 1;
    int64_t acc = 0;
    while (acc + hist[0][bin] < need) acc += hist[0][bin--];
    above += acc;
    need -= acc;
    if (shift == 0) {
      *greater = above;
      return lo + bin;
    }
    // Keep only the keys of the chosen bin; the next digit resolves them further.
    int64_t m = 0;
    int64_t j = 0;
#if defined(__AVX2__)
    const __m256i lo_v = _mm256_set1_epi32(static_cast<int32_t>(lo));
    const __m256i bin_v = _mm256_set1_epi32(static_cast<int32_t>(bin));
    const __m128i shift_v = _mm_cvtsi32_si128(shift);
    for (; j + 8 <= cur_n; j += 8) {  // m <= j: the compacted prefix trails the reads
      const __m256i key = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cur + j));
      const __m256i digit = _mm256_srl_epi32(_mm256_sub_epi32(key, lo_v), shift_v);
      const int mask = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(digit, bin_v)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(tmp + m),
                          _mm256_permutevar8x32_epi32(key, CompressLanes(mask)));
      m += __builtin_popcount(static_cast<unsigned>(mask));
    }
#endif
    for (; j < cur_n; ++j) {
      const uint32_t key = cur[j];
      tmp[m] = key;
      m += ((key - lo) >> shift) == bin ? 1 : 0;
    }
    cur = tmp;
    cur_n = m;
    MinMax(cur, cur_n, &lo, &hi);
  }
}

bool RowSelector::Reserve(int64_t n) {
  if (n <= capacity_) return true;
  // Default-initialised (pages are touched only as far as they are used) and nothrow: a row too
  // long for memory is an error for the caller, never an exception.
  const size_t count = static_cast<size_t>(n);
  keys_.reset(new (std::nothrow) uint32_t[count]);
  cols_.reset(new (std::nothrow) int32_t[count]);
  scratch_.reset(new (std::nothrow) uint32_t[count]);
  capacity_ = (keys_ && cols_ && scratch_) ? n : 0;
  return capacity_ > 0;
}

float RowSelector::EstimateThreshold(const float* row, int64_t len, int64_t k) {
  const int64_t samples =
      std::min(len, std::clamp(len / kColumnsPerSample, kSampleMin, kSampleMax));
  // Rank in the sample whose key, with high probability, has at least k row entries above it:
  // the expected count of sampled entries above the true k-th largest, plus three standard
  // deviations and a little.
  const double mean =
      static_cast<double>(k) * static_cast<double>(samples) / static_cast<double>(len);
  const int64_t rank = static_cast<int64_t>(std::ceil(mean + 3.0 * std::sqrt(mean) + 2.0));
  if (rank >= samples) return kMinSelectable;
  const int64_t stride = len / samples;
  uint32_t* sample = scratch_.get();
  for (int64_t j = 0; j < samples; ++j) sample[j] = LogitKey(row[j * stride + stride / 2]);
  // The rank is small against the sample: nth_element beats the radix select here.
  std::nth_element(sample, sample + (rank - 1), sample + samples, std::greater<uint32_t>());
  return KeyToLogit(std::max(sample[rank - 1], kMinSelectableKey));
}

int64_t RowSelector::Select(const float* row, int64_t lo, int64_t hi, int64_t k) {
  last_path_ = 0;
  const int64_t len = hi - lo;
  if (len <= 0 || k <= 0) return 0;
  if (!Reserve(len + 8)) return -1;
  const float* base = row + lo;
  const int32_t col0 = static_cast<int32_t>(lo);
  uint32_t* keys = keys_.get();
  int32_t* cols = cols_.get();
  float threshold = kMinSelectable;
  if (len >= kSampleMinRowsPerK * k) threshold = EstimateThreshold(base, len, k);
  int64_t n = FilterAtLeast(base, len, threshold, col0, keys, cols);
  if (threshold > kMinSelectable) {
    last_path_ = 1;
    if (n < k) {  // the sample overestimated the k-th largest: take every selectable entry
      last_path_ = 2;
      n = FilterAtLeast(base, len, kMinSelectable, col0, keys, cols);
    }
  }
  if (n <= k) return n;

  int64_t greater = 0;
  const uint32_t kth = KthLargestKey(keys, n, k, scratch_.get(), &greater);
  int64_t ties = k - greater;  // entries equal to kth to keep, lowest columns first
  int64_t out = 0;
  int64_t i = 0;
#if defined(__AVX2__)
  const __m256i kth_s = _mm256_set1_epi32(AsSigned(kth));
  const __m256i sign = _mm256_set1_epi32(static_cast<int32_t>(0x80000000u));
  for (; i + 8 <= n; i += 8) {
    const __m256i key = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + i));
    const __m256i key_s = _mm256_xor_si256(key, sign);  // unsigned order under signed compares
    int mask = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key_s, kth_s)));
    int equal = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(key_s, kth_s)));
    while (equal != 0 && ties > 0) {  // keep ties in lane (column) order while the quota lasts
      const int lane_bit = equal & -equal;
      mask |= lane_bit;
      equal ^= lane_bit;
      --ties;
    }
    const __m256i perm = CompressLanes(mask);  // kept lanes first; the rest repeat lane 0
    const __m256i col = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cols + i));
    // out <= i: the compacted prefix never overtakes the lanes still to be read.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(keys + out),
                        _mm256_permutevar8x32_epi32(key, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cols + out),
                        _mm256_permutevar8x32_epi32(col, perm));
    out += __builtin_popcount(static_cast<unsigned>(mask));
  }
#endif
  for (; i < n; ++i) {
    const uint32_t key = keys[i];
    const bool take = key > kth || (key == kth && ties > 0);
    if (key == kth && take) --ties;
    keys[out] = key;
    cols[out] = cols[i];
    out += take ? 1 : 0;
  }
  return out;
}

}  // namespace attnd::kernels::topk
