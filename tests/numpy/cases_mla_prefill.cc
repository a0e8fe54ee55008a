// Cross-check cases for the dense MLA prefill: small packed varlen calls (Lq > Lk, Lk > Lq,
// empty sequences, rows past the last sequence, GQA, generic head dims, causal and not) with
// attnd's fp64 reference outputs; tests/numpy/ops/mla_prefill.py recomputes them in NumPy.
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/mla_prefill/mla_prefill.h"
#include "kernels/mla_prefill/reference.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/numpy/dump.h"

namespace attnd::testing {
namespace {

using kernels::DType;
namespace mla_prefill = kernels::mla_prefill;

struct CaseSpec {
  const char* name;
  int64_t heads, heads_kv, d_qk, d_v;
  bool causal;
  std::vector<std::pair<int32_t, int32_t>> lens;  // (Lq, Lk) per sequence
  int64_t extra_q_rows;                           // rows past cu_seqlens_q[B]
};

void DumpCase(const std::string& dir, const CaseSpec& c, std::mt19937_64& rng) {
  const int64_t batch = static_cast<int64_t>(c.lens.size());
  HostTensor cu_q = HostTensor::Dense(DType::kI32, {batch + 1});
  HostTensor cu_k = HostTensor::Dense(DType::kI32, {batch + 1});
  int32_t tq = 0, tk = 0;
  for (int64_t b = 0; b <= batch; ++b) {
    cu_q.data<int32_t>()[b] = tq;
    cu_k.data<int32_t>()[b] = tk;
    if (b < batch) {
      tq += c.lens[b].first;
      tk += c.lens[b].second;
    }
  }
  const int64_t total_q = tq + c.extra_q_rows, total_k = tk;
  HostTensor q = HostTensor::Dense(DType::kBF16, {total_q, c.heads, c.d_qk});
  HostTensor k = HostTensor::Dense(DType::kBF16, {total_k, c.heads_kv, c.d_qk});
  HostTensor v = HostTensor::Dense(DType::kBF16, {total_k, c.heads_kv, c.d_v});
  FillNormal(q, rng, 1.0);
  FillNormal(k, rng, 1.0);
  FillNormal(v, rng, 1.0);
  HostTensor out = HostTensor::Dense(DType::kBF16, {total_q, c.heads, c.d_v});
  HostTensor lse = HostTensor::Dense(DType::kF32, {total_q, c.heads});

  mla_prefill::Params p;
  p.q = q.tensor();
  p.k = k.tensor();
  p.v = v.tensor();
  p.cu_seqlens_q = cu_q.tensor();
  p.cu_seqlens_k = cu_k.tensor();
  p.out = out.tensor();
  p.lse = lse.tensor();
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d_qk)));
  p.causal = c.causal;
  if (!mla_prefill::Validate(p).ok() || !mla_prefill::CheckCuSeqlens(p).ok()) return;
  std::vector<double> ref_out, ref_lse;
  mla_prefill::Reference(p, &ref_out, &ref_lse);

  CaseWriter w(dir, std::string("mla_prefill_") + c.name, "mla_prefill");
  w.AddTensor("q", p.q);
  w.AddTensor("k", p.k);
  w.AddTensor("v", p.v);
  w.AddTensor("cu_seqlens_q", p.cu_seqlens_q);
  w.AddTensor("cu_seqlens_k", p.cu_seqlens_k);
  w.AddScalar("sm_scale", static_cast<double>(p.sm_scale));
  w.AddScalar("causal", c.causal ? 1.0 : 0.0);
  w.AddReference("out", ref_out, {total_q, c.heads, c.d_v});
  w.AddReference("lse", ref_lse, {total_q, c.heads});
  w.Finish();
}

void DumpMlaPrefill(const std::string& dir) {
  std::mt19937_64 rng = MakeRng();
  const CaseSpec cases[] = {
      {"causal_h4_d192_128", 4, 4, 192, 128, true, {{70, 70}, {9, 40}, {30, 5}}, 0},
      {"causal_gqa1_d64_64_empty", 4, 1, 64, 64, true, {{0, 8}, {12, 0}, {0, 0}, {20, 33}}, 3},
      {"noncausal_gqa2_d72_40", 4, 2, 72, 40, false, {{15, 50}, {33, 7}}, 0},
      {"causal_h2_d256_256", 2, 2, 256, 256, true, {{66, 130}}, 2},
  };
  for (const CaseSpec& c : cases) DumpCase(dir, c, rng);
}

}  // namespace
}  // namespace attnd::testing

ATTND_REGISTER_NUMPY_DUMPER(mla_prefill, attnd::testing::DumpMlaPrefill);
