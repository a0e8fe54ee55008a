#include "kernels/indexer_logits_paged/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/common/fp8.h"
#include "kernels/common/reference.h"

namespace attnd::kernels::indexer_logits_paged {

RefLogits Reference(const Params& p) {
  const int64_t batch = p.q.dim(0), next_n = p.q.dim(1), heads = p.q.dim(2), dim = p.q.dim(3);
  const int64_t n_count = p.logits.dim(1), max_blocks = p.block_table.dim(1);
  const int64_t bs = p.block_size, num_blocks = p.kv_cache.dim(0);
  RefLogits ref;
  ref.rows = batch * next_n;
  ref.cols = n_count;
  const size_t total = static_cast<size_t>(ref.rows * n_count);
  ref.expect.assign(total, RefLogits::kNegInf);
  ref.value.assign(total, 0.0);
  ref.magnitude.assign(total, 0.0);
  ref.fast_bound.assign(total, 0.0);
  const uint8_t* cache = p.kv_cache.ptr<const uint8_t>();
  const bool shuffled = p.kv_cache_layout == CacheLayout::kIndexerAiterShuffle16;
  std::vector<double> key(static_cast<size_t>(dim)), products(static_cast<size_t>(dim));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < next_n; ++j) {
      const int64_t row = b * next_n + j;
      // [B]: the request's length, token j seeing the first ... − next_n + j + 1 of it;
      // [B, next_n]: token j's own length.
      const int64_t visible_raw =
          p.context_lens.rank == 2
              ? static_cast<int64_t>(RefLoad(p.context_lens, {b, j}))
              : static_cast<int64_t>(RefLoad(p.context_lens, {b})) - next_n + j + 1;
      int64_t visible = std::max<int64_t>(visible_raw, 0);
      visible = std::min({visible, n_count, max_blocks * bs});
      for (int64_t n = 0; n < visible; ++n) {
        const int64_t page = static_cast<int64_t>(RefLoad(p.block_table, {b, n / bs}));
        if (page < 0 || page >= num_blocks) continue;  // masked: stays -inf
        const uint8_t* block = cache + RefOffset(p.kv_cache, {page, 0});
        const int64_t slot = n % bs;
        for (int64_t d = 0; d < dim; ++d) {
          // AITER's SHUFFLE: 16-token groups, each D/16 tiles of 16 tokens × 16 bytes, a tile
          // row-major (token, byte); the blocks layout: key after key.
          const int64_t at =
              shuffled ? (slot / 16) * 16 * dim + (d / 16) * 256 + (slot % 16) * 16 + d % 16
                       : slot * dim + d;
          key[d] = Fp8E4M3ToFloat(block[at]);
        }
        float scale_f32;
        std::memcpy(&scale_f32, block + bs * dim + slot * 4, sizeof scale_f32);
        const double scale = scale_f32;
        double sum = 0, magnitude = 0, acc_bound = 0;
        for (int64_t h = 0; h < heads; ++h) {
          double dot = 0, abs_dot = 0;
          for (int64_t d = 0; d < dim; ++d) {
            products[d] = RefLoad(p.q, {b, j, h, d}) * key[d];
            dot += products[d];
            abs_dot += std::fabs(products[d]);
          }
          const double w = RefLoad(p.weights, {row, h});
          sum += std::max(dot, 0.0) * scale * w;
          magnitude += abs_dot * std::fabs(scale * w);
          acc_bound +=
              indexer_logits::FastDotErrorBound(products.data(), dim) * std::fabs(scale * w);
        }
        const size_t at = static_cast<size_t>(row * n_count + n);
        ref.expect[at] = RefLogits::kValue;
        ref.value[at] = sum;
        ref.magnitude[at] = magnitude;
        ref.fast_bound[at] = indexer_logits::FastLogitBound(magnitude, acc_bound, heads);
      }
    }
  }
  return ref;
}

}  // namespace attnd::kernels::indexer_logits_paged
