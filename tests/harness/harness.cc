#include "tests/harness/harness.h"

#include <cmath>
#include <sstream>

namespace attnd::testing {

kernels::ThreadPool* TestPool() {
  static kernels::ThreadPool* pool = new kernels::ThreadPool(2);
  return pool;
}

std::mt19937_64 MakeRng() {
  static uint64_t counter = 0;
  std::random_device rd;
  const uint64_t seed =
      (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (++counter * 0x9e3779b97f4a7c15ull);
  return std::mt19937_64(seed);
}

namespace {

// ‖got − ref‖ / ‖ref‖ <= rel_l2 over finite reference values, and per element |got − ref| <=
// bound(i); non-finite reference values must match exactly, NaN in `got` fails.
template <class Bound>
void ExpectWithin(const std::vector<double>& got, const std::vector<double>& ref, double rel_l2,
                  const Bound& bound, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double err2 = 0, ref2 = 0;
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], g = got[i];
    bool ok;
    if (!std::isfinite(r)) {
      ok = (std::isinf(r) && g == r);
    } else if (!std::isfinite(g)) {
      ok = false;
    } else {
      err2 += (g - r) * (g - r);
      ref2 += r * r;
      ok = std::fabs(g - r) <= bound(i);
    }
    if (!ok && bad++ < 5) {
      first << " [" << i << "] got " << g << " want " << r << " (bound " << bound(i) << ");";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size()
                    << " elements out of bounds:" << first.str();
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  EXPECT_LE(rel, rel_l2) << what << ": relative L2 error " << rel;
}

}  // namespace

void ExpectAttentionOut(const std::vector<double>& got, const std::vector<double>& ref,
                        const std::vector<double>& ref_abs, kernels::Precision precision,
                        const Tolerance& high, const std::string& what) {
  const std::string name = what + " (" + kernels::PrecisionName(precision) + ")";
  if (precision == kernels::Precision::kHigh) {
    ExpectClose(got, ref, high, name);
    return;
  }
  ASSERT_EQ(ref_abs.size(), ref.size()) << name << ": the reference's out_abs";
  // The L2 form of the weighted term: bf16 P moves each element by at most 2^-9·ref_abs, so
  // ‖Δ‖ grows by at most ‖2^-9·ref_abs‖ (taken at 2^-8) over the rest's 4e-3·‖ref‖. Where out
  // is a mean of values of both signs (d_v = 1, long rows) ref_abs ≫ |ref| and this term leads.
  double ref2 = 0, abs2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i])) continue;
    ref2 += ref[i] * ref[i];
    abs2 += ref_abs[i] * ref_abs[i];
  }
  const double rel_l2 =
      kFastOutRelL2 + (ref2 > 0 ? kFastOutWeighted * std::sqrt(abs2) / std::sqrt(ref2) : 0.0);
  ExpectWithin(
      got, ref, rel_l2,
      [&](size_t i) {
        return kFastOutRel * std::fabs(ref[i]) + kFastOutWeighted * ref_abs[i] + kFastOutAtol;
      },
      name);
}

void ExpectClose(const std::vector<double>& got, const std::vector<double>& ref,
                 const Tolerance& tol, const std::string& what) {
  ExpectWithin(
      got, ref, tol.rel_l2, [&](size_t i) { return tol.atol + tol.rtol * std::fabs(ref[i]); },
      what);
}

}  // namespace attnd::testing
