// The per-row core of the CPU top-k: order-preserving uint32 keys of f32 logits and RowSelector,
// which picks the k largest selectable entries of one row (sample a threshold, one vectorised
// filter pass, a radix select on the survivors' keys, a stable vectorised collection pass).
//   RowSelector sel;
//   int64_t n = sel.Select(row, lo, hi, k);  // sel.cols()[0..n) ascending, sel.keys() alike
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

namespace attnd::kernels::topk {

// Keys compare like the floats they encode (+0 sorts just above -0). NaN of either sign maps to
// 0, so every NaN and -inf (0x007fffff) sits below kMinSelectableKey, the key of -FLT_MAX.
inline constexpr uint32_t kMinSelectableKey = 0x00800000u;
inline constexpr uint32_t kPosInfKey = 0xff800000u;

inline uint32_t LogitKey(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const uint32_t key = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return key > kPosInfKey ? 0u : key;  // positive NaN; negative NaN is already below -inf
}

// Inverse of LogitKey for selectable keys (exact bits).
inline float KeyToLogit(uint32_t key) {
  const uint32_t u = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// Picks the top k of one row. Owns scratch sized to the longest row seen; not thread-safe (one per
// worker). All positions are absolute columns and fit in int32 (Validate caps N).
class RowSelector {
 public:
  // Chooses the min(k, selectable) largest selectable entries of row[lo, hi) (lo <= hi are
  // already clamped to the row) and returns how many. Afterwards cols()[0..count) holds their
  // columns in ascending order and keys()[0..count) their keys; ties at the threshold go to the
  // lowest columns, so the result is deterministic. Returns -1 when its scratch (12 bytes per
  // column of the window) cannot be allocated.
  int64_t Select(const float* row, int64_t lo, int64_t hi, int64_t k);

  const int32_t* cols() const { return cols_.get(); }
  const uint32_t* keys() const { return keys_.get(); }

  // Which path the last Select took (for tests of the fallback): 0 all candidates filtered at
  // the selectable floor, 1 sampled threshold held, 2 sampled threshold too high, re-filtered.
  int last_path() const { return last_path_; }

 private:
  bool Reserve(int64_t n);  // false when out of memory
  // A threshold with, very likely, somewhat more than k entries of row[0, len) at or above it;
  // kMinSelectable when sampling cannot help.
  float EstimateThreshold(const float* row, int64_t len, int64_t k);

  int64_t capacity_ = 0;
  std::unique_ptr<uint32_t[]> keys_;     // candidate keys, then the chosen keys
  std::unique_ptr<int32_t[]> cols_;      // their columns
  std::unique_ptr<uint32_t[]> scratch_;  // radix select's compaction buffer; also the sample
  int last_path_ = 0;
};

// The lowest selectable value: a threshold that admits every entry but -inf and NaN.
inline constexpr float kMinSelectable = -3.40282347e+38f;  // -FLT_MAX

// Writes to cols[0..) every column of row[0, len) whose value compares >= threshold as floats
// (never NaN; threshold is not NaN), in column order, offset by col0, and to keys[0..) their keys;
// returns the count. The set is an upper set in key order ({key >= LogitKey(threshold)}, plus
// -0.0 when threshold is +0.0). keys and cols need room for len + 8 entries.
int64_t FilterAtLeast(const float* row, int64_t len, float threshold, int32_t col0, uint32_t* keys,
                      int32_t* cols);

// The k-th largest of keys[0..n) (1 <= k <= n) by radix select with digits of up to 10 bits over
// the keys' actual range (so a narrow range still spreads over the bins), small remainders sorted;
// *greater receives how many keys are strictly larger. tmp needs room for n entries; keys is
// unchanged.
uint32_t KthLargestKey(const uint32_t* keys, int64_t n, int64_t k, uint32_t* tmp, int64_t* greater);

}  // namespace attnd::kernels::topk
