// One paged indexer-logits call for the tests: owned tensors with fresh random data, a vLLM-layout
// key cache (keys then scales per block, row padding set to NaN bytes), block tables handing each
// request distinct pages in shuffled order, and the run-and-check against the fp64 reference.
//   PagedProblem prob(shape, rng);  prob.SetContexts({65, 1});  EXPECT_GE(prob.RunAndCheck(), 1);
//   (or prob.SetTokenLengths({{64, 65}, {0, 1}}) for per-token context_lens [batch, next_n])
#pragma once

#include <algorithm>
#include <cstdint>
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
#include "tests/kernels/indexer_logits/logits_check.h"

namespace attnd::kernels::indexer_logits_paged {

struct PagedShape {
  int64_t batch, next_n, heads, dim;
  int64_t block_size, max_blocks, num_blocks, cols;
  int64_t pad = 0;  // extra on every leading stride (q, kv_cache, block_table, weights, logits)
};

// Writes random keys (fp8 of N(0,1)) and scales (U[0.01, 0.1]) into every block of a
// [num_blocks, bs·(D+4)] u8 view; the row padding past bs·(D+4) becomes 0xff bytes (an fp8 NaN
// and a NaN scale), so reading it shows. `block` points at row 0; rows are `stride` bytes apart.
inline void FillCacheBlock(uint8_t* block, int64_t bs, int64_t dim, std::mt19937_64& rng) {
  std::normal_distribution<float> key(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.01f, 0.1f);
  for (int64_t i = 0; i < bs * dim; ++i) block[i] = FloatToFp8E4M3(key(rng));
  for (int64_t t = 0; t < bs; ++t) {
    const float s = scale(rng);
    std::memcpy(block + bs * dim + 4 * t, &s, 4);
  }
}

struct PagedProblem {
  PagedProblem(const PagedShape& s, std::mt19937_64& rng_in)
      : shape(s),
        rng(rng_in()),
        q(testing::HostTensor::RowStrided(DType::kFp8E4M3, {s.batch, s.next_n, s.heads, s.dim},
                                          s.next_n * s.heads * s.dim + s.pad)),
        kv_cache(testing::HostTensor::RowStrided(DType::kU8, {s.num_blocks, BlockBytes(s)},
                                                 BlockBytes(s) + s.pad)),
        block_table(testing::HostTensor::RowStrided(DType::kI32, {s.batch, s.max_blocks},
                                                    s.max_blocks + s.pad)),
        context_lens(testing::HostTensor::Dense(DType::kI32, {s.batch})),
        weights(testing::HostTensor::RowStrided(DType::kF32, {s.batch * s.next_n, s.heads},
                                                s.heads + s.pad)),
        logits(testing::HostTensor::RowStrided(DType::kF32, {s.batch * s.next_n, s.cols},
                                               s.cols + s.pad)) {
    testing::FillNormal(q, rng, 1.0);
    testing::FillNormal(weights, rng, 1.0);
    std::memset(kv_cache.raw(), 0xff, static_cast<size_t>(kv_cache.bytes()));
    for (int64_t b = 0; b < s.num_blocks; ++b) {
      FillCacheBlock(kv_cache.data<uint8_t>() + b * kv_cache.tensor().stride(0), s.block_size,
                     s.dim, rng);
    }
  }

  static int64_t BlockBytes(const PagedShape& s) { return s.block_size * (s.dim + 4); }

  // Sets the context lengths, then gives each request's first ceil(L / bs) table entries
  // distinct pages from a shuffled pool (reused only when the pool runs out) and every other
  // entry, padding included, an out-of-range id that would mask if it were (wrongly) read.
  void SetContexts(const std::vector<int64_t>& contexts) {
    std::vector<int32_t> pool(static_cast<size_t>(shape.num_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    size_t next = 0;
    int32_t* table = block_table.data<int32_t>();
    std::fill(table, table + block_table.span_elements(), -12345);
    for (int64_t b = 0; b < shape.batch; ++b) {
      context_lens.data<int32_t>()[b] = static_cast<int32_t>(contexts[b]);
      const int64_t visible =
          std::clamp<int64_t>(contexts[b], 0, shape.max_blocks * shape.block_size);
      const int64_t used = (visible + shape.block_size - 1) / shape.block_size;
      for (int64_t i = 0; i < used && !pool.empty(); ++i) {
        table[b * block_table.tensor().stride(0) + i] = pool[next++ % pool.size()];
      }
    }
  }

  // Per-token lengths instead: context_lens becomes i32 [batch, next_n] (row stride next_n +
  // row_pad, the padding poisoned with huge lengths that would show if read); each request gets
  // pages for its longest token's length, as SetContexts does for a request's context.
  // With assign_pages false the block table stays as it is.
  void SetTokenLengths(const std::vector<std::vector<int64_t>>& lengths, int64_t row_pad = 0,
                       bool assign_pages = true) {
    std::vector<int64_t> longest;
    for (const auto& row : lengths) longest.push_back(*std::max_element(row.begin(), row.end()));
    if (assign_pages) SetContexts(longest);
    token_lens = testing::HostTensor::RowStrided(DType::kI32, {shape.batch, shape.next_n},
                                                 shape.next_n + row_pad);
    int32_t* data = token_lens.data<int32_t>();
    std::fill(data, data + token_lens.span_elements(), INT32_MAX);
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t j = 0; j < shape.next_n; ++j) {
        data[b * token_lens.tensor().stride(0) + j] = static_cast<int32_t>(lengths[b][j]);
      }
    }
  }

  Params params() {
    Params p;
    p.q = q.tensor();
    p.kv_cache = kv_cache.tensor();
    p.block_size = shape.block_size;
    p.block_table = block_table.tensor();
    p.context_lens = token_lens.tensor().present() ? token_lens.tensor() : context_lens.tensor();
    p.weights = weights.tensor();
    p.logits = logits.tensor();
    return p;
  }

  // Runs every implementation (or those of `impls`) in each precision it supports (p's own
  // precision is replaced) and checks each against the reference with that precision's bound;
  // returns the fewest runs of a precision (HIGH always has one: the CPU; FAST too, as every
  // HIGH-capable implementation meets FAST's looser bound).
  int RunAndCheck() { return RunAndCheck(params()); }
  int RunAndCheck(const Params& p) { return RunAndCheck(p, Implementations()); }
  int RunAndCheck(Params p, const std::vector<Impl<Params>>& impls) {
    EXPECT_TRUE(Validate(p).ok()) << Validate(p);
    const RefLogits ref = Reference(p);
    int fewest = -1;
    for (const Precision precision : testing::kPrecisions) {
      p.precision = precision;
      const testing::LogitsTolerance tol = testing::ToleranceFor(shape.heads, shape.dim, precision);
      const int runs = testing::RunEachImpl(impls, p, {&logits}, [&](const std::string& impl) {
        testing::ExpectLogits(logits.tensor(), ref, tol,
                              impl + " (" + PrecisionName(precision) + ")");
      });
      fewest = fewest < 0 || runs < fewest ? runs : fewest;
    }
    return fewest;
  }

  // Runs the implementation named `name` alone in `precision`; false when it refuses p (the
  // reason in *why). Checks as RunAndCheck.
  bool RunOne(Params p, const std::string& name, Precision precision, std::string* why) {
    p.precision = precision;
    for (const auto& impl : Implementations()) {
      if (impl.name != name) continue;
      if (impl.supports && !impl.supports(p, why)) return false;
      const RefLogits ref = Reference(p);
      const int runs = testing::RunEachImpl(
          std::vector<Impl<Params>>{impl}, p, {&logits}, [&](const std::string& what) {
            testing::ExpectLogits(logits.tensor(), ref,
                                  testing::ToleranceFor(shape.heads, shape.dim, precision),
                                  what + " (" + PrecisionName(precision) + ")");
          });
      return runs == 1;
    }
    *why = "no implementation named " + name;
    return false;
  }

  PagedShape shape;
  std::mt19937_64 rng;
  testing::HostTensor q, kv_cache, block_table, context_lens, weights, logits;
  testing::HostTensor token_lens;  // [batch, next_n] once SetTokenLengths ran
};

}  // namespace attnd::kernels::indexer_logits_paged
