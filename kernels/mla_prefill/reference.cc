#include "kernels/mla_prefill/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/common/reference.h"

namespace attnd::kernels::mla_prefill {

void Reference(const Params& p, std::vector<double>* out, std::vector<double>* lse,
               std::vector<double>* out_abs) {
  const int64_t total_q = p.q.dim(0), heads = p.q.dim(1), d_qk = p.q.dim(2);
  const int64_t heads_kv = p.k.dim(1), d_v = p.v.dim(2);
  const int64_t batch = p.cu_seqlens_q.dim(0) - 1;
  out->assign(static_cast<size_t>(total_q * heads * d_v), 0.0);
  if (out_abs != nullptr) out_abs->assign(out->size(), 0.0);
  lse->assign(static_cast<size_t>(total_q * heads), -std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q0 = static_cast<int64_t>(RefLoad(p.cu_seqlens_q, {b}));
    const int64_t lq = static_cast<int64_t>(RefLoad(p.cu_seqlens_q, {b + 1})) - q0;
    const int64_t k0 = static_cast<int64_t>(RefLoad(p.cu_seqlens_k, {b}));
    const int64_t lk = static_cast<int64_t>(RefLoad(p.cu_seqlens_k, {b + 1})) - k0;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / (heads / heads_kv);
      for (int64_t i = 0; i < lq; ++i) {
        // Bottom-right causal alignment: the last query sees the last key.
        const int64_t last_key = p.causal ? std::min(lk - 1, i + lk - lq) : lk - 1;
        std::vector<double> scores;
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= last_key; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d_qk; ++c) {
            dot += RefLoad(p.q, {q0 + i, h, c}) * RefLoad(p.k, {k0 + j, g, c});
          }
          scores.push_back(dot * p.sm_scale);
          max_score = std::max(max_score, scores.back());
        }
        if (scores.empty()) continue;  // out 0, lse -inf
        double sum = 0;
        for (double& s : scores) sum += (s = std::exp(s - max_score));
        const int64_t row = (q0 + i) * heads + h;
        for (int64_t j = 0; j <= last_key; ++j) {
          for (int64_t c = 0; c < d_v; ++c) {
            const double v = RefLoad(p.v, {k0 + j, g, c});
            (*out)[row * d_v + c] += scores[j] / sum * v;
            if (out_abs != nullptr) (*out_abs)[row * d_v + c] += scores[j] / sum * std::fabs(v);
          }
        }
        (*lse)[row] = max_score + std::log(sum);
      }
    }
  }
}

}  // namespace attnd::kernels::mla_prefill
