// Test cases of the top-k operator: owned tensors bound into Params, window setters, and
// RunAndCheck (every implementation against the fp64 reference through the harness).
//   TopKCase c(/*m=*/4, /*n=*/1000, /*k=*/64, WindowForm::kKsKe, /*with_values=*/true);
//   FillNormal(c.logits, rng, 1.0);  c.SetWindow(0, 10, 900);  ...  RunAndCheck(c);
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/topk/params.h"
#include "tests/harness/host_tensor.h"

namespace attnd::kernels::topk {

enum class WindowForm { kKsKe, kLengths };

struct TopKCase {
  // out_ld / logits_ld of 0 mean dense rows.
  TopKCase(int64_t m, int64_t n, int64_t k, WindowForm form, bool with_values,
           int64_t logits_ld = 0, int64_t out_ld = 0);
  TopKCase(const TopKCase&) = delete;
  TopKCase& operator=(const TopKCase&) = delete;

  int64_t rows() const { return p.logits.dim(0); }
  int64_t cols() const { return p.logits.dim(1); }
  float& Logit(int64_t r, int64_t n) { return logits.data<float>()[logits.Offset({r, n})]; }
  // Window of row r; with lengths only begin = 0 is expressible (begin is then ignored).
  void SetWindow(int64_t r, int64_t begin, int64_t end);
  void SetFullWindows();  // every row sees [0, N)
  // Writes `value` to every column of row r outside its clamped window (a bug would pick it).
  void FillOutsideWindows(float value);
  // Adds an i32 [m / rows_per_request, max_blocks] block table (entries left for the test).
  void AddBlockTable(int64_t max_blocks, int64_t page_size, int64_t rows_per_request);
  // Adds an i32 [requests, max_blocks] block table whose rows are found by req_id_per_row
  // (`ids`, one per row) or by cu_seqlens_q (`cu`, requests + 1 entries): exactly one non-empty.
  // block_stride 0 means page_size.
  void AddRequestTable(int64_t requests, int64_t max_blocks, int64_t page_size,
                       int64_t block_stride, const std::vector<int32_t>& ids,
                       const std::vector<int32_t>& cu);
  int32_t& Block(int64_t req, int64_t b) {
    return block_table.data<int32_t>()[block_table.Offset({req, b})];
  }

  testing::HostTensor logits, ks, ke, lengths, indices, values, block_table;
  testing::HostTensor req_id_per_row, cu_seqlens_q;
  Params p;
};

// Fills every row of the logits with a random permutation of distinct values (a unique top-k).
void FillDistinct(TopKCase& c, std::mt19937_64& rng);

// Validates, runs every implementation (outputs NaN-poisoned first) and checks each result with
// ExpectValidTopK, or ExpectMappedTopK when the case has a block table.
void RunAndCheck(TopKCase& c);

}  // namespace attnd::kernels::topk
