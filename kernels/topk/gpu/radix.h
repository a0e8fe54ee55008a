// The arithmetic of the GPU top-k's radix select, shared by the kernel (device) and its host test:
// order-preserving keys, the three digit levels (11, 11 and 10 bits), the threshold a row's final
// ordered pass applies, and the KV-slot mapping. Plain C++ (no vendor headers), so the CPU-only
// build can test it:
//   Threshold t = FirstThreshold(bin, above, k);  ...  if (IsChosen(t, key, eq_before)) ...
#pragma once

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define ATTND_TOPK_HD __host__ __device__ __forceinline__
#else
#define ATTND_TOPK_HD inline
#endif

namespace attnd::kernels::topk::gpu::radix {

// Keys compare like the floats they encode (+0 just above -0); NaN of either sign maps to 0, so
// NaN and -inf (0x007fffff) sit below kMinSelectableKey, the key of -FLT_MAX. The same map as
// row_select.h's LogitKey, on the float's bits.
inline constexpr uint32_t kMinSelectableKey = 0x00800000u;
inline constexpr uint32_t kPosInfKey = 0xff800000u;

ATTND_TOPK_HD uint32_t KeyOfBits(uint32_t bits) {
  const uint32_t key = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return key > kPosInfKey ? 0u : key;
}

// Digit levels, most significant first: level 0 is key >> 21 (11 bits), level 1 the next 11
// bits, level 2 the last 10. Histograms have kBins bins (level 2 uses the lower half).
inline constexpr int kLevels = 3;
inline constexpr int kBins = 2048;

ATTND_TOPK_HD int DigitShift(int level) { return level == 0 ? 21 : (level == 1 ? 10 : 0); }
ATTND_TOPK_HD int DigitBits(int level) { return level == 2 ? 10 : 11; }
ATTND_TOPK_HD uint32_t Digit(uint32_t key, int level) {
  return (key >> DigitShift(level)) & ((1u << DigitBits(level)) - 1u);
}

// The selection a row's ordered pass applies: every key with (key >> shift) > prefix, plus the
// first `need` keys (lowest columns) with (key >> shift) == prefix. Built level by level; once
// shift is 0 the equal keys are exact ties; when the threshold bin holds exactly `need` keys the
// whole bin is taken and no further level is needed.
struct Threshold {
  uint32_t prefix = 0;
  int shift = 0;
  uint32_t need = 0;
};

// Every selectable key and nothing else: (key >> 21) > 3 is key >= kMinSelectableKey.
ATTND_TOPK_HD Threshold AllSelectable() {
  Threshold t;
  t.prefix = (kMinSelectableKey >> 21) - 1u;
  t.shift = 21;
  t.need = 0;
  return t;
}

// Whether `key` is counted in the histogram of `level` under the threshold `t` built by the
// levels before it: level 0 counts the selectable keys, later levels the keys in t's bin.
ATTND_TOPK_HD bool InLevel(uint32_t key, int level, const Threshold& t) {
  return level == 0 ? key >= kMinSelectableKey : (key >> t.shift) == t.prefix;
}

// The threshold after `level` chose `bin`, above which `above` counted keys lie; `t` is the
// threshold before it (its need is the rank still to fill, k at level 0).
ATTND_TOPK_HD Threshold Refine(const Threshold& t, int level, uint32_t bin, uint32_t above) {
  Threshold next;
  next.prefix = level == 0 ? bin : ((t.prefix << DigitBits(level)) | bin);
  next.shift = DigitShift(level);
  next.need = t.need - above;
  return next;
}

// The start of the walk: level 0 counts every selectable key and must fill rank k.
ATTND_TOPK_HD Threshold Start(uint32_t k) {
  Threshold t;
  t.need = k;
  return t;
}

// One bin of a histogram walked from the top: `above` keys lie in higher bins. The bin holds the
// need-th largest key when above < need <= above + count (at most one bin of a walk does).
ATTND_TOPK_HD bool HoldsRank(uint32_t above, uint32_t count, uint32_t need) {
  return above < need && need - above <= count;
}

ATTND_TOPK_HD bool AboveThreshold(const Threshold& t, uint32_t key) {
  return (key >> t.shift) > t.prefix;
}
ATTND_TOPK_HD bool AtThreshold(const Threshold& t, uint32_t key) {
  return (key >> t.shift) == t.prefix;
}

// In the ordered pass, with gt_before / eq_before keys above / at the threshold in lower columns:
// whether this column is chosen, and its output position (chosen keys in column order).
ATTND_TOPK_HD bool IsChosen(const Threshold& t, bool above, bool at, uint32_t eq_before) {
  return above || (at && eq_before < t.need);
}
ATTND_TOPK_HD uint32_t OutputPosition(const Threshold& t, uint32_t gt_before, uint32_t eq_before) {
  return gt_before + (eq_before < t.need ? eq_before : t.need);
}

// Global KV slot of column `col` through one block-table row: -1 when its page is past
// max_blocks, unmapped (negative entry) or the slot does not fit in int32 (as cpu.cc's
// SlotMapper). page_shift is log2(page_size) when it is a power of two, else -1; a slot is
// block * block_stride + col % page_size. max_blocks 0 (a row without a request) reads nothing.
ATTND_TOPK_HD int32_t SlotOf(int32_t col, const int32_t* table_row, int64_t max_blocks,
                             uint32_t page_size, int page_shift, uint32_t block_stride) {
  const uint32_t c = static_cast<uint32_t>(col);
  const uint32_t page = page_shift >= 0 ? c >> page_shift : c / page_size;
  const uint32_t offset = c - page * page_size;
  if (static_cast<int64_t>(page) >= max_blocks) return -1;
  const int64_t block = table_row[page];
  if (block < 0) return -1;
  const int64_t slot = block * static_cast<int64_t>(block_stride) + offset;
  return slot <= 0x7fffffffLL ? static_cast<int32_t>(slot) : -1;
}

}  // namespace attnd::kernels::topk::gpu::radix
