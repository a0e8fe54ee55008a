// Cross-check cases for the dense MLA decode: small random paged calls (s_q 1 and 2, causal and
// not, d_qk 576 and 512, odd page sizes, shuffled and invalid page ids, lengths 0 and past the
// table's capacity) with attnd's fp64 reference outputs; tests/numpy/ops/mla_decode.py
// recomputes them in NumPy.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/mla_decode/mla_decode.h"
#include "kernels/mla_decode/reference.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/numpy/dump.h"

namespace attnd::testing {
namespace {

using kernels::DType;
namespace mla_decode = kernels::mla_decode;

struct CaseSpec {
  const char* name;
  int64_t s_q, heads, d_qk, page_size, max_pages;
  bool causal;
  std::vector<int32_t> seqlens;
};

void DumpCase(const std::string& dir, const CaseSpec& c, std::mt19937_64& rng) {
  const int64_t batch = static_cast<int64_t>(c.seqlens.size());
  const int64_t num_pages = batch * c.max_pages + 2;
  HostTensor q = HostTensor::Dense(DType::kBF16, {batch, c.s_q, c.heads, c.d_qk});
  FillNormal(q, rng, 1.0);
  HostTensor kv = HostTensor::Dense(DType::kBF16, {num_pages, c.page_size, c.d_qk});
  FillNormal(kv, rng, 1.0);
  // Shuffled page ids with about one entry in six out of range (-1, num_pages, a huge id).
  HostTensor table = HostTensor::Dense(DType::kI32, {batch, c.max_pages});
  std::vector<int32_t> ids(static_cast<size_t>(num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int32_t invalid[] = {-1, static_cast<int32_t>(num_pages), 2147483647};
  for (int64_t i = 0; i < batch * c.max_pages; ++i) {
    table.data<int32_t>()[i] = rng() % 6 == 0 ? invalid[rng() % 3] : ids[i];
  }
  HostTensor seqlens = HostTensor::Dense(DType::kI32, {batch});
  std::copy(c.seqlens.begin(), c.seqlens.end(), seqlens.data<int32_t>());
  HostTensor out = HostTensor::Dense(DType::kBF16, {batch, c.s_q, c.heads, mla_decode::kDv});
  HostTensor lse = HostTensor::Dense(DType::kF32, {batch, c.s_q, c.heads});

  mla_decode::Params p;
  p.q = q.tensor();
  p.kv_cache = kv.tensor();
  p.block_table = table.tensor();
  p.cache_seqlens = seqlens.tensor();
  p.out = out.tensor();
  p.lse = lse.tensor();
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d_qk)));
  p.causal = c.causal;
  if (!mla_decode::Validate(p).ok()) return;  // a bad spec above: no case rather than a wrong one
  std::vector<double> ref_out, ref_lse;
  mla_decode::Reference(p, &ref_out, &ref_lse);

  CaseWriter w(dir, std::string("mla_decode_") + c.name, "mla_decode");
  w.AddTensor("q", p.q);
  w.AddTensor("kv_cache", p.kv_cache);
  w.AddTensor("block_table", p.block_table);
  w.AddTensor("cache_seqlens", p.cache_seqlens);
  w.AddScalar("sm_scale", static_cast<double>(p.sm_scale));
  w.AddScalar("causal", c.causal ? 1.0 : 0.0);
  w.AddReference("out", ref_out, {batch, c.s_q, c.heads, mla_decode::kDv});
  w.AddReference("lse", ref_lse, {batch, c.s_q, c.heads});
  w.Finish();
}

void DumpMlaDecode(const std::string& dir) {
  std::mt19937_64 rng = MakeRng();
  const CaseSpec cases[] = {
      {"sq1_h16_d576_p64", 1, 16, 576, 64, 3, false, {130, 1, 64}},
      {"sq2_causal_h4_d576_p13", 2, 4, 576, 13, 9, true, {100, 1, 0, 65}},
      {"sq2_h3_d512_p7", 2, 3, 512, 7, 6, false, {40, 23}},
      {"sq3_causal_h2_d512_clamped", 3, 2, 512, 16, 4, true, {1000, -7, 2}},
  };
  for (const CaseSpec& c : cases) DumpCase(dir, c, rng);
}

}  // namespace
}  // namespace attnd::testing

ATTND_REGISTER_NUMPY_DUMPER(mla_decode, attnd::testing::DumpMlaDecode);
