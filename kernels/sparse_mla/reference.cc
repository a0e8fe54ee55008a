#include "kernels/sparse_mla/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/common/reference.h"

namespace attnd::kernels::sparse_mla {
namespace {

// The valid KV rows token t attends to, in slot order (duplicates kept).
std::vector<int64_t> ValidRows(const Params& p, int64_t t) {
  std::vector<int64_t> rows;
  int64_t begin = 0, end = 0;
  if (p.is_csr()) {
    begin = static_cast<int64_t>(RefLoad(p.indptr, {t}));
    end = static_cast<int64_t>(RefLoad(p.indptr, {t + 1}));
  } else {
    end = p.indices.dim(1);
    if (p.topk_length.present()) {
      end = std::clamp<int64_t>(static_cast<int64_t>(RefLoad(p.topk_length, {t})), 0, end);
    }
  }
  for (int64_t i = begin; i < end; ++i) {
    const int64_t idx =
        static_cast<int64_t>(p.is_csr() ? RefLoad(p.indices, {i}) : RefLoad(p.indices, {t, i}));
    if (idx >= 0 && idx < p.kv.dim(0)) rows.push_back(idx);
  }
  return rows;
}

// Row `row` of the cache as d_qk exact doubles: bf16 elements, an FP8 row decoded from its
// bytes (params.h): e4m3 × f32 scale for columns < 512, bf16 rope after, or a per-tensor FP8
// row: e4m3 × kv_scale for every column.
std::vector<double> KvRow(const Params& p, int64_t row) {
  const int64_t d_qk = p.q.dim(2);
  std::vector<double> v(d_qk);
  if (p.kv_is_fp8_per_tensor()) {  // e4m3 × the one kv_scale, every column
    const uint8_t* bytes = p.kv.ptr<const uint8_t>() + RefOffset(p.kv, {row, 0});
    for (int64_t d = 0; d < d_qk; ++d)
      v[d] = RefDecodeE4m3(bytes[d]) * static_cast<double>(p.kv_scale);
    return v;
  }
  if (!p.kv_is_fp8()) {
    for (int64_t d = 0; d < d_qk; ++d) v[d] = RefLoad(p.kv, {row, d});
    return v;
  }
  const uint8_t* bytes = p.kv.ptr<const uint8_t>() + RefOffset(p.kv, {row, 0});
  for (int64_t d = 0; d < kDimV; ++d) {
    float scale;
    std::memcpy(&scale, bytes + kFp8ScaleOffset + 4 * (d / kFp8ScaleCols), sizeof scale);
    v[d] = RefDecodeE4m3(bytes[d]) * static_cast<double>(scale);
  }
  for (int64_t d = kDimV; d < d_qk; ++d) {
    uint16_t bits;
    std::memcpy(&bits, bytes + kFp8RopeOffset + 2 * (d - kDimV), sizeof bits);
    const uint32_t wide = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &wide, sizeof f);
    v[d] = f;
  }
  return v;
}

}  // namespace

Reference ComputeReference(const Params& p) {
  const int64_t t_count = p.q.dim(0), heads = p.q.dim(1), d_qk = p.q.dim(2);
  Reference ref;
  ref.out.assign(t_count * heads * kDimV, 0.0);
  ref.out_abs.assign(t_count * heads * kDimV, 0.0);
  ref.lse.assign(t_count * heads, -std::numeric_limits<double>::infinity());
  for (int64_t t = 0; t < t_count; ++t) {
    const std::vector<int64_t> rows = ValidRows(p, t);
    if (rows.empty()) continue;
    std::vector<std::vector<double>> kv(rows.size());
    for (size_t j = 0; j < rows.size(); ++j) kv[j] = KvRow(p, rows[j]);
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> score(rows.size());
      for (size_t j = 0; j < rows.size(); ++j) {
        double dot = 0;
        for (int64_t d = 0; d < d_qk; ++d) dot += RefLoad(p.q, {t, h, d}) * kv[j][d];
        score[j] = static_cast<double>(p.sm_scale) * dot;
      }
      const double max = *std::max_element(score.begin(), score.end());
      double sum = 0;
      for (double& s : score) {
        s = std::exp(s - max);
        sum += s;
      }
      double* out = &ref.out[(t * heads + h) * kDimV];
      double* out_abs = &ref.out_abs[(t * heads + h) * kDimV];
      for (size_t j = 0; j < rows.size(); ++j) {
        for (int64_t d = 0; d < kDimV; ++d) {
          out[d] += score[j] / sum * kv[j][d];
          out_abs[d] += score[j] / sum * std::fabs(kv[j][d]);
        }
      }
      ref.lse[t * heads + h] = max + std::log(sum);
    }
  }
  return ref;
}

}  // namespace attnd::kernels::sparse_mla
