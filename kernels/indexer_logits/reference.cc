#include "kernels/indexer_logits/reference.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/reference.h"

namespace attnd::kernels::indexer_logits {
namespace {

constexpr int64_t kFastStep = 32;  // products per wgmma k-step (fp8: k32)
constexpr int kFastUnitExp = -12;  // the model's unit, 2^-12 (measured 2^-13; docs/ACCURACY.md)

}  // namespace

double FastDotErrorBound(const double* products, int64_t dim) {
  const double u = std::ldexp(1.0, kFastUnitExp);
  // A product is a multiple of 2^(e − 7) (e = its exponent: ≤ 8 significant bits), so it is on
  // the step's grid 2^(E − 12) unless e < E − 5; with 2^E ≤ M that is impossible for |p| ≥
  // 2^-5·M (2^(7 + kFastUnitExp) = 2^-5).
  const double exact_from = std::ldexp(1.0, 7 + kFastUnitExp);
  double eps = 0, partial = 0;
  for (int64_t s0 = 0; s0 < dim; s0 += kFastStep) {
    const int64_t s1 = std::min(dim, s0 + kFastStep);
    double largest = 0, step = 0;
    for (int64_t d = s0; d < s1; ++d) {
      largest = std::max(largest, std::fabs(products[d]));
      step += products[d];
    }
    const double bound_max = std::max(std::fabs(partial) + eps, largest);
    int64_t lossy = s0 > 0 ? 1 : 0;  // the running sum (none before the first step)
    for (int64_t d = s0; d < s1; ++d) {
      if (products[d] != 0 && std::fabs(products[d]) < exact_from * bound_max) ++lossy;
    }
    const double align = static_cast<double>(lossy) * u * bound_max;
    partial += step;
    eps += align + u * (std::fabs(partial) + eps + align);
  }
  return eps;
}

double FastLogitBound(double magnitude, double acc_bound, int64_t heads) {
  return acc_bound +
         static_cast<double>(heads + 4) * std::ldexp(1.0, -24) * (magnitude + acc_bound);
}

RefLogits Reference(const Params& p) {
  const int64_t m_count = p.q.dim(0), heads = p.q.dim(1), dim = p.q.dim(2), n_count = p.k.dim(0);
  // Inputs as doubles first (exact), so the loops below read plain arrays.
  std::vector<double> q(static_cast<size_t>(m_count * heads * dim));
  std::vector<double> k(static_cast<size_t>(n_count * dim));
  for (int64_t m = 0; m < m_count; ++m) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t d = 0; d < dim; ++d) q[(m * heads + h) * dim + d] = RefLoad(p.q, {m, h, d});
    }
  }
  for (int64_t n = 0; n < n_count; ++n) {
    for (int64_t d = 0; d < dim; ++d) k[n * dim + d] = RefLoad(p.k, {n, d});
  }

  RefLogits ref;
  ref.rows = m_count;
  ref.cols = n_count;
  const size_t total = static_cast<size_t>(m_count * n_count);
  ref.expect.assign(total, p.clean_logits ? RefLogits::kNegInf : RefLogits::kUntouched);
  ref.value.assign(total, 0.0);
  ref.magnitude.assign(total, 0.0);
  ref.fast_bound.assign(total, 0.0);
  std::vector<double> products(static_cast<size_t>(dim));
  for (int64_t m = 0; m < m_count; ++m) {
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(RefLoad(p.ks, {m})), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(RefLoad(p.ke, {m})), n_count);
    for (int64_t n = lo; n < hi; ++n) {
      const double scale = RefLoad(p.k_scale, {n});
      double sum = 0, magnitude = 0, acc_bound = 0;
      for (int64_t h = 0; h < heads; ++h) {
        const double* qh = &q[(m * heads + h) * dim];
        const double* kn = &k[n * dim];
        double dot = 0, abs_dot = 0;
        for (int64_t d = 0; d < dim; ++d) {
          products[d] = qh[d] * kn[d];
          dot += products[d];
          abs_dot += std::fabs(products[d]);
        }
        const double w = RefLoad(p.weights, {m, h});
        sum += std::max(dot, 0.0) * scale * w;
        magnitude += abs_dot * std::fabs(scale * w);
        acc_bound += FastDotErrorBound(products.data(), dim) * std::fabs(scale * w);
      }
      const size_t at = static_cast<size_t>(m * n_count + n);
      ref.expect[at] = RefLogits::kValue;
      ref.value[at] = sum;
      ref.magnitude[at] = magnitude;
      ref.fast_bound[at] = FastLogitBound(magnitude, acc_bound, heads);
    }
  }
  return ref;
}

}  // namespace attnd::kernels::indexer_logits
