#include "tests/kernels/topk/topk_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/common/reference.h"

namespace attnd::kernels::topk {
namespace {

constexpr int kMaxReportedRows = 3;

int32_t IndexAt(const Params& p, int64_t r, int64_t j) {
  return static_cast<const int32_t*>(p.indices.data)[RefOffset(p.indices, {r, j})];
}
float ValueAt(const Params& p, int64_t r, int64_t j) {
  return static_cast<const float*>(p.values.data)[RefOffset(p.values, {r, j})];
}
float LogitAt(const Params& p, int64_t r, int64_t n) {
  return static_cast<const float*>(p.logits.data)[RefOffset(p.logits, {r, n})];
}
bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

// Checks one row; returns an empty string when it is valid, else what is wrong.
std::string CheckRow(const Params& p, const RefRow& ref, int64_t r) {
  const int64_t want = static_cast<int64_t>(ref.values.size());
  std::set<int64_t> chosen;
  std::vector<double> got_values;
  // Under IndexBase::kRowStart an entry is a position from the window start: back to a column.
  const int64_t origin = p.index_base == IndexBase::kRowStart ? ref.begin : 0;
  for (int64_t j = 0; j < p.k; ++j) {
    const int64_t written = IndexAt(p, r, j);
    if (j >= want) {
      if (written != -1) {
        return "entry " + std::to_string(j) + " is " + std::to_string(written) + ", want -1";
      }
      continue;
    }
    const int64_t n = written + origin;
    if (n < ref.begin || n >= ref.end) {
      return "entry " + std::to_string(j) + " is " + std::to_string(n) + ", outside window [" +
             std::to_string(ref.begin) + ", " + std::to_string(ref.end) + ")";
    }
    if (!chosen.insert(n).second) return "column " + std::to_string(n) + " chosen twice";
    const double v = LogitAt(p, r, n);
    if (std::isnan(v) || v == -INFINITY) {
      return "column " + std::to_string(n) + " is not selectable (" + std::to_string(v) + ")";
    }
    got_values.push_back(v);
  }
  std::sort(got_values.begin(), got_values.end(), std::greater<double>());
  if (got_values != ref.values) return "chosen values differ from the reference's top values";
  // The threshold property, directly: no unchosen selectable value beats the smallest chosen.
  if (!got_values.empty()) {
    const double min_chosen = got_values.back();
    for (int64_t n = ref.begin; n < ref.end; ++n) {
      const double v = LogitAt(p, r, n);
      if (chosen.count(n) == 0 && v > min_chosen) {
        return "unchosen column " + std::to_string(n) + " (" + std::to_string(v) +
               ") beats chosen " + std::to_string(min_chosen);
      }
    }
  }
  if (p.values.present()) {
    for (int64_t j = 0; j < p.k; ++j) {
      const float v = ValueAt(p, r, j);
      const float expect = j < want ? LogitAt(p, r, IndexAt(p, r, j) + origin)
                                    : -std::numeric_limits<float>::infinity();
      if (!SameBits(v, expect)) {
        return "values entry " + std::to_string(j) + " is " + std::to_string(v) + ", want " +
               std::to_string(expect);
      }
    }
  }
  return "";
}

}  // namespace

void ExpectValidTopK(const Params& p, const std::vector<RefRow>& ref, const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(ref.size()), p.logits.dim(0)) << what;
  int bad = 0;
  for (int64_t r = 0; r < p.logits.dim(0); ++r) {
    const std::string err = CheckRow(p, ref[static_cast<size_t>(r)], r);
    if (err.empty()) continue;
    if (bad++ < kMaxReportedRows) ADD_FAILURE() << what << ": row " << r << ": " << err;
  }
  EXPECT_EQ(bad, 0) << what << ": invalid rows";
}

void ExpectMappedTopK(const Params& p, const std::vector<RefRow>& ref, const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(ref.size()), p.logits.dim(0)) << what;
  int bad = 0;
  for (int64_t r = 0; r < p.logits.dim(0); ++r) {
    const RefRow& row = ref[static_cast<size_t>(r)];
    // A unique top-k: the value just below the cut must be strictly smaller (set by the test).
    std::vector<std::pair<int64_t, double>> want, got;
    for (size_t i = 0; i < row.cols.size(); ++i) {
      want.emplace_back(ReferenceSlot(p, r, row.cols[i]), row.values[i]);
    }
    while (static_cast<int64_t>(want.size()) < p.k) want.emplace_back(-1, -INFINITY);
    bool nan = false;
    for (int64_t j = 0; j < p.k; ++j) {
      const double v = p.values.present() ? ValueAt(p, r, j) : 0.0;
      nan = nan || std::isnan(v);
      got.emplace_back(IndexAt(p, r, j), v);
    }
    if (nan) {
      if (bad++ < kMaxReportedRows) ADD_FAILURE() << what << ": row " << r << ": NaN value";
      continue;
    }
    if (!p.values.present()) {
      for (auto& w : want) w.second = 0.0;
    }
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    if (got == want) continue;
    if (bad++ < kMaxReportedRows) {
      size_t i = 0;
      while (i < want.size() && got[i] == want[i]) ++i;
      ADD_FAILURE() << what << ": row " << r << ": sorted (slot, value) pair " << i << " is ("
                    << got[i].first << ", " << got[i].second << "), want (" << want[i].first << ", "
                    << want[i].second << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": invalid rows";
}

}  // namespace attnd::kernels::topk
