// Cross-check cases for sparse MLA: small random calls in both selection forms (masked and
// duplicate indices, topk_length, an empty row, d_qk 512 and 576, a strided cache view, the FP8
// cache) with attnd's fp64 reference outputs; tests/numpy/ops/sparse_mla.py recomputes them in
// NumPy, decoding FP8 rows from their bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"
#include "kernels/sparse_mla/params.h"
#include "kernels/sparse_mla/reference.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/numpy/dump.h"

namespace attnd::testing {
namespace {

using kernels::DType;
namespace sparse_mla = kernels::sparse_mla;

struct CaseSpec {
  const char* name;
  int64_t t, h, d_qk, s, k;
  bool csr;
  bool with_topk_length;
  bool fp8 = false;  // the FP8 cache (u8 [S, 656], row stride 688 bytes); d_qk must be 576
};

// FP8 cache rows: e4m3 codes of N(0, 64) (1 in 8 a random subnormal code; never NaN), power-of-
// two scales in [2^-9, 2^-4] per 128 columns, bf16 N(0, 1) rope.
void FillFp8Cache(HostTensor& kv, std::mt19937_64& rng) {
  std::normal_distribution<float> code(0.0f, 64.0f), rope(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-9, -4), sub(0, 15), pick(0, 7);
  const kernels::Tensor& t = kv.tensor();
  for (int64_t r = 0; r < t.dim(0); ++r) {
    uint8_t* row = kv.data<uint8_t>() + r * t.stride(0);
    for (int64_t c = 0; c < sparse_mla::kDimV; ++c) {
      const int s = sub(rng);
      row[c] = pick(rng) == 0 ? static_cast<uint8_t>((s & 8) << 4 | (s & 7))
                              : kernels::FloatToFp8E4M3(code(rng));
    }
    for (int64_t j = 0; j < 4; ++j) {
      const float scale = std::ldexp(1.0f, exponent(rng));
      std::memcpy(row + sparse_mla::kFp8ScaleOffset + 4 * j, &scale, 4);
    }
    for (int64_t d = 0; d < 64; ++d) {
      const kernels::bf16_t b = kernels::FloatToBf16(rope(rng));
      std::memcpy(row + sparse_mla::kFp8RopeOffset + 2 * d, &b, 2);
    }
  }
}

void DumpCase(const std::string& dir, const CaseSpec& c, std::mt19937_64& rng) {
  HostTensor q = HostTensor::Dense(DType::kBF16, {c.t, c.h, c.d_qk});
  FillNormal(q, rng, 1.0);
  HostTensor kv;
  if (c.fp8) {
    kv = HostTensor::RowStrided(DType::kU8, {c.s, sparse_mla::kFp8RowBytes},
                                sparse_mla::kFp8RowBytes + 32);
    FillFp8Cache(kv, rng);
  } else {
    kv = HostTensor::RowStrided(DType::kBF16, {c.s, c.d_qk}, c.d_qk + 80);
    FillNormal(kv, rng, 1.0);
  }
  // Slots: valid rows (few distinct, so duplicates are common), -1 and >= S; row 1 empty.
  std::uniform_int_distribution<int32_t> row(0, static_cast<int32_t>(c.s - 1));
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<std::vector<int32_t>> slots(c.t);
  for (int64_t t = 0; t < c.t; ++t) {
    const int64_t len = c.csr ? (t == 1 ? 0 : 1 + static_cast<int64_t>(rng() % c.k)) : c.k;
    for (int64_t i = 0; i < len; ++i) {
      const int k = kind(rng);
      slots[t].push_back(k == 0 ? -1 : k == 1 ? static_cast<int32_t>(c.s + 3) : row(rng));
    }
    if (t == 1) std::fill(slots[t].begin(), slots[t].end(), -1);
  }
  HostTensor indices, indptr, topk_length;
  if (c.csr) {
    std::vector<int32_t> flat;
    indptr = HostTensor::Dense(DType::kI32, {c.t + 1});
    indptr.data<int32_t>()[0] = 0;
    for (int64_t t = 0; t < c.t; ++t) {
      flat.insert(flat.end(), slots[t].begin(), slots[t].end());
      indptr.data<int32_t>()[t + 1] = static_cast<int32_t>(flat.size());
    }
    indices = HostTensor::Dense(DType::kI32, {static_cast<int64_t>(flat.size())});
    std::copy(flat.begin(), flat.end(), indices.data<int32_t>());
  } else {
    indices = HostTensor::Dense(DType::kI32, {c.t, c.k});
    for (int64_t t = 0; t < c.t; ++t) {
      std::copy(slots[t].begin(), slots[t].end(), indices.data<int32_t>() + t * c.k);
    }
    if (c.with_topk_length) {
      topk_length = HostTensor::Dense(DType::kI32, {c.t});
      std::uniform_int_distribution<int32_t> len(-1, static_cast<int32_t>(c.k) + 1);
      for (int64_t t = 0; t < c.t; ++t) topk_length.data<int32_t>()[t] = len(rng);
    }
  }
  HostTensor out = HostTensor::Dense(DType::kBF16, {c.t, c.h, sparse_mla::kDimV});
  HostTensor lse = HostTensor::Dense(DType::kF32, {c.t, c.h});

  sparse_mla::Params p;
  p.q = q.tensor();
  p.kv = kv.tensor();
  p.indices = indices.tensor();
  if (c.csr) p.indptr = indptr.tensor();
  if (c.with_topk_length) p.topk_length = topk_length.tensor();
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d_qk)));
  p.out = out.tensor();
  p.lse = lse.tensor();
  if (!sparse_mla::Validate(p).ok()) return;  // a bad spec above: no case rather than a wrong one
  const sparse_mla::Reference ref = sparse_mla::ComputeReference(p);

  CaseWriter w(dir, std::string("sparse_mla_") + c.name, "sparse_mla");
  w.AddTensor("q", p.q);
  w.AddTensor("kv", p.kv);
  w.AddTensor("indices", p.indices);
  if (c.csr) w.AddTensor("indptr", p.indptr);
  if (c.with_topk_length) w.AddTensor("topk_length", p.topk_length);
  w.AddScalar("sm_scale", static_cast<double>(p.sm_scale));
  w.AddReference("out", ref.out, {c.t, c.h, sparse_mla::kDimV});
  w.AddReference("lse", ref.lse, {c.t, c.h});
  w.Finish();
}

void DumpSparseMla(const std::string& dir) {
  std::mt19937_64 rng = MakeRng();
  const CaseSpec cases[] = {
      {"table_topk_length_h8_d576", 4, 8, 576, 40, 20, false, true},
      {"table_h16_d512", 3, 16, 512, 300, 70, false, false},
      {"csr_h4_d512", 5, 4, 512, 30, 25, true, false},
      {"csr_h5_d576", 4, 5, 576, 90, 130, true, false},
      {"table_topk_length_h16_fp8kv", 4, 16, 576, 60, 40, false, true, true},
      {"csr_h8_fp8kv", 5, 8, 576, 80, 90, true, false, true},
  };
  for (const CaseSpec& c : cases) DumpCase(dir, c, rng);
}

}  // namespace
}  // namespace attnd::testing

ATTND_REGISTER_NUMPY_DUMPER(sparse_mla, attnd::testing::DumpSparseMla);
