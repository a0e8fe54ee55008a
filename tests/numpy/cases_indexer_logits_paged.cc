// Cross-check cases for the paged indexer logits: small random calls with vLLM's cache layout
// (keys then scales per block, padded rows), shuffled and invalid page ids, next_n 1, 2 and 4,
// short / negative contexts and contexts past the table, per-token context_lens [B, next_n] in
// any order, and AITER's shuffled cache (16-token × 16-byte key tiles, ROCm) named by its layout,
// with attnd's fp64 reference;
// tests/numpy/ops/indexer_logits_paged.py recomputes them from the raw cache bytes.
// Refs as indexer_ref_logits.h writes them.
#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/fp8.h"
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"
#include "kernels/indexer_logits_paged/reference.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/numpy/dump.h"
#include "tests/numpy/indexer_ref_logits.h"

namespace attnd::testing {
namespace {

using kernels::DType;
namespace ilp = kernels::indexer_logits_paged;

struct CaseSpec {
  const char* name;
  int64_t batch, next_n, heads, dim, block_size, max_blocks, num_blocks, cols;
  std::vector<int64_t> contexts;
  std::vector<int64_t> token_lens = {};  // non-empty: context_lens [B, next_n], row-major
  kernels::CacheLayout layout = kernels::CacheLayout::kUnspecified;
};

void DumpCase(const std::string& dir, const CaseSpec& c, std::mt19937_64& rng) {
  const int64_t block_bytes = c.block_size * (c.dim + 4), rows = c.batch * c.next_n;
  HostTensor q = HostTensor::Dense(DType::kFp8E4M3, {c.batch, c.next_n, c.heads, c.dim});
  HostTensor kv = HostTensor::RowStrided(DType::kU8, {c.num_blocks, block_bytes}, block_bytes + 8);
  HostTensor table = HostTensor::Dense(DType::kI32, {c.batch, c.max_blocks});
  HostTensor lens = c.token_lens.empty() ? HostTensor::Dense(DType::kI32, {c.batch})
                                         : HostTensor::Dense(DType::kI32, {c.batch, c.next_n});
  HostTensor weights = HostTensor::Dense(DType::kF32, {rows, c.heads});
  HostTensor logits = HostTensor::Dense(DType::kF32, {rows, c.cols});
  FillNormal(q, rng, 1.0);
  FillNormal(weights, rng, 1.0);
  std::normal_distribution<float> key(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.01f, 0.1f);
  for (int64_t b = 0; b < c.num_blocks; ++b) {
    uint8_t* block = kv.data<uint8_t>() + b * kv.tensor().stride(0);
    for (int64_t i = 0; i < c.block_size * c.dim; ++i) block[i] = kernels::FloatToFp8E4M3(key(rng));
    for (int64_t t = 0; t < c.block_size; ++t) {
      const float s = scale(rng);
      std::memcpy(block + c.block_size * c.dim + 4 * t, &s, 4);
    }
  }
  std::vector<int32_t> pages(static_cast<size_t>(c.num_blocks));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  int32_t* t = table.data<int32_t>();
  for (int64_t i = 0; i < c.batch * c.max_blocks; ++i) {
    t[i] = pages[static_cast<size_t>(i) % pages.size()];
    if (i % 7 == 3) t[i] = -1;                                   // masked
    if (i % 11 == 5) t[i] = static_cast<int32_t>(c.num_blocks);  // masked: one past the pool
  }
  for (size_t b = 0; b < c.contexts.size(); ++b)
    lens.data<int32_t>()[b] = static_cast<int32_t>(c.contexts[b]);
  for (size_t i = 0; i < c.token_lens.size(); ++i)
    lens.data<int32_t>()[i] = static_cast<int32_t>(c.token_lens[i]);

  ilp::Params p;
  p.q = q.tensor();
  p.kv_cache = kv.tensor();
  p.block_size = c.block_size;
  p.kv_cache_layout = c.layout;
  p.block_table = table.tensor();
  p.context_lens = lens.tensor();
  p.weights = weights.tensor();
  p.logits = logits.tensor();
  if (!ilp::Validate(p).ok()) return;  // a bad spec above: no case rather than a wrong one

  CaseWriter w(dir, std::string("indexer_logits_paged_") + c.name, "indexer_logits_paged");
  w.AddTensor("q", p.q);
  w.AddTensor("kv_cache", p.kv_cache);
  w.AddTensor("block_table", p.block_table);
  w.AddTensor("context_lens", p.context_lens);
  w.AddTensor("weights", p.weights);
  w.AddScalar("block_size", static_cast<double>(c.block_size));
  w.AddScalar("cols", static_cast<double>(c.cols));
  // 1: the cache bytes are in AITER's shuffled order (docs/CONTRACTS.md "indexer_logits_paged").
  w.AddScalar("shuffle16", c.layout == kernels::CacheLayout::kIndexerAiterShuffle16 ? 1.0 : 0.0);
  AddRefLogits(w, ilp::Reference(p));
  w.Finish();
}

void DumpIndexerLogitsPaged(const std::string& dir) {
  std::mt19937_64 rng = MakeRng();
  // [3, 4] per-token lengths (capacity 80): any order, 0, negative, at and past the capacity.
  const std::vector<int64_t> kTokenLens = {80, 3, 0, 79, 1, -2, 81, 64, 40, 41, 7, 80};
  const CaseSpec cases[] = {
      {"next_n1_block16", 3, 1, 8, 32, 16, 6, 20, 96, {96, 17, 50}},
      {"next_n2_short_contexts", 4, 2, 4, 16, 8, 5, 12, 40, {1, 0, -3, 40}},
      {"past_table_block5", 2, 2, 16, 48, 5, 7, 9, 60, {60, 33}},
      {"model_h64_d128_block64", 2, 1, 64, 128, 64, 3, 6, 192, {192, 65}},
      // Per-token lengths [B, next_n].
      {"per_token_next_n4_block16", 3, 4, 8, 32, 16, 5, 16, 96, {}, kTokenLens},
      {"per_token_model_next_n2", 2, 2, 64, 128, 64, 3, 6, 192, {}, {192, 100, 0, 65}},
      // AITER's shuffled cache (the random bytes read in its order).
      {"aiter_shuffle_block16",
       3,
       2,
       8,
       48,
       16,
       6,
       20,
       96,
       {96, 17, 50},
       {},
       kernels::CacheLayout::kIndexerAiterShuffle16},
      {"aiter_shuffle_model_block64",
       2,
       1,
       64,
       128,
       64,
       3,
       6,
       192,
       {},
       {192, 65},
       kernels::CacheLayout::kIndexerAiterShuffle16},
  };
  for (const CaseSpec& c : cases) DumpCase(dir, c, rng);
}

}  // namespace
}  // namespace attnd::testing

ATTND_REGISTER_NUMPY_DUMPER(indexer_logits_paged, attnd::testing::DumpIndexerLogitsPaged);
