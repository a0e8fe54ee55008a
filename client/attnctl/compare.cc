#include "client/attnctl/compare.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"

namespace attnd::attnctl {
namespace {

// Logical elements of a (validated) view as doubles, row-major.
std::vector<double> ToDoubles(const kernels::Tensor& t) {
  std::vector<double> out;
  if (!t.present()) return out;
  out.reserve(static_cast<size_t>(t.numel()));
  int64_t index[kernels::kMaxRank] = {};
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) return out;
  }
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < t.rank; ++d) off += index[d] * t.strides[d];
    double v = 0;
    switch (t.dtype) {
      case kernels::DType::kF32: v = t.ptr<const float>()[off]; break;
      case kernels::DType::kBF16: v = kernels::Bf16ToFloat(t.ptr<const uint16_t>()[off]); break;
      case kernels::DType::kFp8E4M3:
        v = kernels::Fp8E4M3ToFloat(t.ptr<const uint8_t>()[off]);
        break;
      case kernels::DType::kI32: v = t.ptr<const int32_t>()[off]; break;
      case kernels::DType::kU8: v = t.ptr<const uint8_t>()[off]; break;
      case kernels::DType::kInvalid: break;
    }
    out.push_back(v);
    int d = t.rank - 1;
    while (d >= 0 && ++index[d] == t.shape[d]) index[d--] = 0;
    if (d < 0) return out;
  }
}

std::string SameLayout(const kernels::Tensor& got, const kernels::Tensor& ref) {
  if (!got.present() || got.data == nullptr) return "no remote output";
  if (got.dtype != ref.dtype) {
    return absl::StrCat("dtype ", kernels::DTypeName(got.dtype), ", want ",
                        kernels::DTypeName(ref.dtype));
  }
  if (got.rank != ref.rank) return absl::StrCat("rank ", got.rank, ", want ", ref.rank);
  for (int i = 0; i < got.rank; ++i) {
    if (got.shape[i] != ref.shape[i]) {
      return absl::StrCat("dim ", i, " is ", got.shape[i], ", want ", ref.shape[i]);
    }
  }
  return "";
}

}  // namespace

Check FailedCheck(const std::string& name, const std::string& detail) {
  Check c;
  c.name = name;
  c.kind = "missing";
  c.pass = false;
  c.detail = detail;
  return c;
}

namespace {

Check CompareDoubles(const std::string& name, const std::vector<double>& g,
                     const std::vector<double>& r, const Tolerance& tol) {
  Check c;
  c.name = name;
  c.kind = "float";
  c.tolerance = tol;
  c.elements = static_cast<int64_t>(r.size());
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    bool bad;
    if (!std::isfinite(r[i])) {
      bad = std::isnan(r[i]) || g[i] != r[i];
    } else if (!std::isfinite(g[i])) {
      bad = true;
    } else {
      const double d = std::fabs(g[i] - r[i]);
      c.max_abs_err = std::max(c.max_abs_err, d);
      diff2 += d * d;
      ref2 += r[i] * r[i];
      bad = d > tol.atol + tol.rtol * std::fabs(r[i]);
    }
    if (bad) {
      if (c.mismatches == 0) {
        c.detail =
            absl::StrFormat("first mismatch at flat index %d: got %g, want %g", i, g[i], r[i]);
      }
      ++c.mismatches;
    }
  }
  c.rel_l2_err = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  c.pass = c.mismatches == 0 && c.rel_l2_err <= tol.rel_l2;
  if (c.mismatches == 0 && !c.pass) {
    c.detail = absl::StrFormat("relative L2 error %g > %g", c.rel_l2_err, tol.rel_l2);
  }
  return c;
}

void SortRows(std::vector<double>* v, int64_t k) {
  if (k <= 0) return;
  for (size_t row = 0; row + static_cast<size_t>(k) <= v->size(); row += static_cast<size_t>(k)) {
    // NaN sorts last (it never equals anything, so a NaN row still mismatches).
    std::sort(v->begin() + row, v->begin() + row + k,
              [](double a, double b) { return std::isnan(b) ? !std::isnan(a) : a < b; });
  }
}

}  // namespace

Check CompareFloat(const std::string& name, const kernels::Tensor& got, const kernels::Tensor& ref,
                   const Tolerance& tol) {
  if (std::string why = SameLayout(got, ref); !why.empty()) return FailedCheck(name, why);
  return CompareDoubles(name, ToDoubles(got), ToDoubles(ref), tol);
}

Check CompareFloatRows(const std::string& name, const kernels::Tensor& got,
                       const kernels::Tensor& ref, const Tolerance& tol) {
  if (std::string why = SameLayout(got, ref); !why.empty()) return FailedCheck(name, why);
  std::vector<double> g = ToDoubles(got), r = ToDoubles(ref);
  const int64_t k = ref.rank > 0 ? ref.shape[ref.rank - 1] : 0;
  SortRows(&g, k);
  SortRows(&r, k);
  Check c = CompareDoubles(name, g, r, tol);
  c.kind = "float_row_set";
  return c;
}

Check CompareIndexRows(const std::string& name, const kernels::Tensor& got,
                       const kernels::Tensor& ref) {
  if (std::string why = SameLayout(got, ref); !why.empty()) return FailedCheck(name, why);
  Check c;
  c.name = name;
  c.kind = "index_set";
  if (ref.dtype != kernels::DType::kI32 || ref.rank < 1) {
    return FailedCheck(name, "index outputs must be i32");
  }
  const int64_t k = ref.shape[ref.rank - 1];
  std::vector<double> g = ToDoubles(got);
  std::vector<double> r = ToDoubles(ref);
  c.elements = static_cast<int64_t>(r.size());
  const int64_t rows = k > 0 ? c.elements / k : 0;
  for (int64_t row = 0; row < rows; ++row) {
    auto gb = g.begin() + row * k, rb = r.begin() + row * k;
    std::sort(gb, gb + k);
    std::sort(rb, rb + k);
    if (!std::equal(gb, gb + k, rb)) {
      if (c.mismatches == 0) c.detail = absl::StrCat("first differing row: ", row);
      ++c.mismatches;
    }
  }
  c.pass = c.mismatches == 0;
  return c;
}

}  // namespace attnd::attnctl
