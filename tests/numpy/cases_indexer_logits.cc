// Cross-check cases for the prefill indexer logits: small random calls in the window modes
// (causal, empty, past-end, packed requests), clean_logits on and off, odd and model head
// shapes, with attnd's fp64 reference; tests/numpy/ops/indexer_logits.py recomputes them.
// Refs as indexer_ref_logits.h writes them.
#include <algorithm>
#include <climits>
#include <random>
#include <string>
#include <vector>

#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/indexer_logits/reference.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/numpy/dump.h"
#include "tests/numpy/indexer_ref_logits.h"

namespace attnd::testing {
namespace {

using kernels::DType;
namespace il = kernels::indexer_logits;

struct CaseSpec {
  const char* name;
  int64_t m, n, heads, dim;
  bool clean;
  int mode;  // 0 causal, 1 empty / past-end mix, 2 packed requests
};

void DumpCase(const std::string& dir, const CaseSpec& c, std::mt19937_64& rng) {
  HostTensor q =
      HostTensor::RowStrided(DType::kFp8E4M3, {c.m, c.heads, c.dim}, c.heads * c.dim + 16);
  HostTensor k = HostTensor::RowStrided(DType::kFp8E4M3, {c.n, c.dim}, c.dim + 32);
  HostTensor k_scale = HostTensor::Dense(DType::kF32, {c.n});
  HostTensor weights = HostTensor::Dense(DType::kF32, {c.m, c.heads});
  HostTensor ks = HostTensor::Dense(DType::kI32, {c.m});
  HostTensor ke = HostTensor::Dense(DType::kI32, {c.m});
  HostTensor logits = HostTensor::RowStrided(DType::kF32, {c.m, c.n}, c.n + 3);
  FillNormal(q, rng, 1.0);
  FillNormal(k, rng, 1.0);
  FillUniform(k_scale, rng, 0.01, 0.1);
  FillNormal(weights, rng, 1.0);
  std::uniform_int_distribution<int64_t> col(0, c.n);
  for (int64_t i = 0; i < c.m; ++i) {
    int64_t lo = 0, hi = c.n - c.m + i + 1;  // causal
    if (c.mode == 1) {
      switch (i % 5) {
        case 0:
          lo = col(rng);
          hi = lo - 3;
          break;  // ke < ks
        case 1:
          lo = INT32_MIN;
          hi = -1;
          break;  // ke < 0
        case 2:
          lo = c.n + 2;
          hi = c.n + 40;
          break;  // ks past the end
        case 3:
          lo = col(rng) / 2;
          hi = INT32_MAX;
          break;  // ke past the end
        case 4:
          lo = col(rng) / 2;
          hi = lo + col(rng) / 2 + 1;
          break;
      }
    } else if (c.mode == 2) {  // three requests packed: bases 0, n/4, n/2
      const int64_t r = i * 3 / c.m, base = r * c.n / 4, first = r * c.m / 3;
      lo = base;
      hi = base + c.n / 4 - (c.m / 3 - (i - first)) + 1;
    }
    ks.data<int32_t>()[i] = static_cast<int32_t>(lo);
    ke.data<int32_t>()[i] = static_cast<int32_t>(hi);
  }
  il::Params p;
  p.q = q.tensor();
  p.k = k.tensor();
  p.k_scale = k_scale.tensor();
  p.weights = weights.tensor();
  p.ks = ks.tensor();
  p.ke = ke.tensor();
  p.clean_logits = c.clean;
  p.logits = logits.tensor();
  if (!il::Validate(p).ok()) return;  // a bad spec above: no case rather than a wrong one

  CaseWriter w(dir, std::string("indexer_logits_") + c.name, "indexer_logits");
  w.AddTensor("q", p.q);
  w.AddTensor("k", p.k);
  w.AddTensor("k_scale", p.k_scale);
  w.AddTensor("weights", p.weights);
  w.AddTensor("ks", p.ks);
  w.AddTensor("ke", p.ke);
  w.AddScalar("clean_logits", c.clean ? 1 : 0);
  AddRefLogits(w, il::Reference(p));
  w.Finish();
}

void DumpIndexerLogits(const std::string& dir) {
  std::mt19937_64 rng = MakeRng();
  const CaseSpec cases[] = {
      {"causal_h8_d32_clean", 12, 90, 8, 32, true, 0},
      {"causal_h5_d16_noclean", 7, 40, 5, 16, false, 0},
      {"empty_past_end_clean", 15, 70, 4, 48, true, 1},
      {"empty_past_end_noclean", 15, 70, 4, 48, false, 1},
      {"packed_requests_h16", 12, 160, 16, 64, true, 2},
      {"model_h64_d128", 4, 50, 64, 128, true, 0},
  };
  for (const CaseSpec& c : cases) DumpCase(dir, c, rng);
}

}  // namespace
}  // namespace attnd::testing

ATTND_REGISTER_NUMPY_DUMPER(indexer_logits, attnd::testing::DumpIndexerLogits);
