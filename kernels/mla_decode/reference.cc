#include "kernels/mla_decode/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/common/reference.h"

namespace attnd::kernels::mla_decode {

void Reference(const Params& p, std::vector<double>* out, std::vector<double>* lse,
               std::vector<double>* out_abs) {
  const int64_t batch = p.q.dim(0), s_q = p.q.dim(1), heads = p.q.dim(2), d_qk = p.q.dim(3);
  const int64_t num_pages = p.kv_cache.dim(0), page_size = p.kv_cache.dim(1);
  const int64_t max_pages = p.block_table.dim(1);
  out->assign(static_cast<size_t>(batch * s_q * heads * kDv), 0.0);
  if (out_abs != nullptr) out_abs->assign(out->size(), 0.0);
  lse->assign(static_cast<size_t>(batch * s_q * heads), -std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < batch; ++b) {
    // The request's readable tokens: positions below the clamped length on an in-range page.
    const int64_t raw_len = static_cast<int64_t>(RefLoad(p.cache_seqlens, {b}));
    const int64_t seqlen = std::clamp<int64_t>(raw_len, 0, max_pages * page_size);
    std::vector<int64_t> positions;
    std::vector<std::vector<double>> keys;
    for (int64_t pos = 0; pos < seqlen; ++pos) {
      const int64_t page = static_cast<int64_t>(RefLoad(p.block_table, {b, pos / page_size}));
      if (page < 0 || page >= num_pages) continue;
      std::vector<double> k(static_cast<size_t>(d_qk));
      if (p.kv_is_fp8()) {  // per-tensor FP8: e4m3 code × kv_scale, decoded exactly
        const uint8_t* codes = static_cast<const uint8_t*>(p.kv_cache.data) +
                               RefOffset(p.kv_cache, {page, pos % page_size, 0});
        for (int64_t c = 0; c < d_qk; ++c) k[c] = RefDecodeE4m3(codes[c]) * p.kv_scale;
      } else {
        for (int64_t c = 0; c < d_qk; ++c) k[c] = RefLoad(p.kv_cache, {page, pos % page_size, c});
      }
      positions.push_back(pos);
      keys.push_back(std::move(k));
    }
    for (int64_t i = 0; i < s_q; ++i) {
      const int64_t visible = p.causal ? seqlen - s_q + i + 1 : seqlen;
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<double> q(static_cast<size_t>(d_qk));
        for (int64_t c = 0; c < d_qk; ++c) q[c] = RefLoad(p.q, {b, i, h, c});
        std::vector<double> scores;
        double max_score = -std::numeric_limits<double>::infinity();
        for (size_t t = 0; t < positions.size() && positions[t] < visible; ++t) {
          double dot = 0;
          for (int64_t c = 0; c < d_qk; ++c) dot += q[c] * keys[t][c];
          scores.push_back(dot * p.sm_scale);
          max_score = std::max(max_score, scores.back());
        }
        if (scores.empty()) continue;  // out 0, lse -inf
        double sum = 0;
        for (double& s : scores) sum += (s = std::exp(s - max_score));
        const int64_t row = (b * s_q + i) * heads + h;
        for (size_t t = 0; t < scores.size(); ++t) {
          for (int64_t c = 0; c < kDv; ++c) (*out)[row * kDv + c] += scores[t] / sum * keys[t][c];
          if (out_abs == nullptr) continue;
          for (int64_t c = 0; c < kDv; ++c) {
            (*out_abs)[row * kDv + c] += scores[t] / sum * std::fabs(keys[t][c]);
          }
        }
        (*lse)[row] = max_score + std::log(sum);
      }
    }
  }
}

}  // namespace attnd::kernels::mla_decode
