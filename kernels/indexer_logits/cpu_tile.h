// CPU building blocks shared by the prefill and paged indexer-logits kernels: fp8 rows decoded to
// f32 eight at a time, a block of queries decoded once into the GEMM's packed-B layout, and the
// score of one key tile (cpu::GemmF32PackedB, then relu · weight summed over heads, · k_scale).
//   QueryBlock qb;  qb.Load(q, q_stride, head_stride, w, w_stride, nq, heads, dim);
//   KeyTile tile(dim, nq * heads);  DecodeFp8(k_row, dim, tile.KeyRow(0));  ...
//   tile.Score(qb, 0, nq, num_keys, lo, hi, out);
#pragma once

#include <cstdint>
#include <vector>

namespace attnd::kernels::indexer_logits {

// Keys per GEMM call (a multiple of the micro-kernel's 6 rows) and the target number of
// (query, head) columns sharing each decoded key tile.
inline constexpr int64_t kKeyTile = 96;
inline constexpr int64_t kTargetColumns = 256;

// The number of queries that share one key tile for `heads` heads (>= 1).
int64_t QueriesPerBlock(int64_t heads);

// dst[i] = the exact f32 value of the fp8 e4m3fn byte src[i], i in [0, n).
void DecodeFp8(const uint8_t* src, int64_t n, float* dst);

// A block of queries decoded to f32 once and laid out as the packed B operand of
// cpu::GemmF32PackedB: column j = query·heads + head, row = d. Not thread-safe; one per worker.
class QueryBlock {
 public:
  // Decodes nq queries: head h of query i is the `dim` fp8 bytes at q + i·q_stride +
  // h·head_stride (bytes); its weights are the `heads` floats at w + i·w_stride.
  void Load(const uint8_t* q, int64_t q_stride, int64_t head_stride, const float* w,
            int64_t w_stride, int64_t nq, int64_t heads, int64_t dim);

  int64_t heads() const { return heads_; }
  int64_t dim() const { return dim_; }
  const float* packed() const { return packed_.data(); }  // GemmPackB layout, nq·heads columns
  const float* weights(int64_t query) const { return weights_.data() + query * heads_; }

 private:
  int64_t heads_ = 0, dim_ = 0;
  std::vector<float> packed_;   // GemmPackedBSize(nq·heads, dim)
  std::vector<float> weights_;  // [nq][heads]
};

// One key tile decoded to f32 and the scratch its scores need. Not thread-safe; one per worker.
class KeyTile {
 public:
  // Room for kKeyTile keys of `dim` values against `columns` (query, head) pairs.
  KeyTile(int64_t dim, int64_t columns);

  float* KeyRow(int64_t i) { return keys_.data() + i * dim_; }  // [dim] floats of key i
  float* scales() { return scales_.data(); }                    // [kKeyTile] k_scale per key

  // For queries i in [q_begin, q_end) of `qb` and the first `num_keys` (<= kKeyTile) keys
  // (rows and scales filled by the caller):
  //   out[i][n] = scales[n] · Σ_h weights(i)[h] · relu(q[i,h] · key[n])   for n in [lo[i], hi[i])
  // with 0 <= lo[i] <= hi[i] <= num_keys (lo == hi: nothing written for that query). lo, hi and
  // out are indexed by the query's index in the block.
  void Score(const QueryBlock& qb, int64_t q_begin, int64_t q_end, int64_t num_keys,
             const int64_t* lo, const int64_t* hi, float* const* out);

 private:
  int64_t dim_;
  std::vector<float> keys_;    // [kKeyTile][dim]
  std::vector<float> scales_;  // [kKeyTile]
  std::vector<float> scores_;  // [kKeyTile][columns + 16]: Sᵀ, keys × (query, head)
};

}  // namespace attnd::kernels::indexer_logits
