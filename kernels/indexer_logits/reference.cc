#include "kernels/indexer_logits/reference.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/reference.h"

namespace attnd::kernels::indexer_logits {

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
  for (int64_t m = 0; m < m_count; ++m) {
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(RefLoad(p.ks, {m})), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(RefLoad(p.ke, {m})), n_count);
    for (int64_t n = lo; n < hi; ++n) {
      const double scale = RefLoad(p.k_scale, {n});
      double sum = 0, magnitude = 0;
      for (int64_t h = 0; h < heads; ++h) {
        const double* qh = &q[(m * heads + h) * dim];
        const double* kn = &k[n * dim];
        double dot = 0, abs_dot = 0;
        for (int64_t d = 0; d < dim; ++d) {
          dot += qh[d] * kn[d];
          abs_dot += std::fabs(qh[d] * kn[d]);
        }
        const double w = RefLoad(p.weights, {m, h});
        sum += std::max(dot, 0.0) * scale * w;
        magnitude += abs_dot * std::fabs(scale * w);
      }
      const size_t at = static_cast<size_t>(m * n_count + n);
      ref.expect[at] = RefLogits::kValue;
      ref.value[at] = sum;
      ref.magnitude[at] = magnitude;
    }
  }
  return ref;
}

}  // namespace attnd::kernels::indexer_logits
