// Cross-check cases for top-k: small random calls in both window forms (ties, NaN, -inf, empty
// and past-the-end windows, rows shorter than k) and with the KV-slot mapping (invalid page ids,
// two rows per request; the request of a row by req_id_per_row or cu_seqlens_q with out-of-range
// ids and rows outside every interval, page size 1, a block stride above the page), both index
// bases, with attnd's fp64 reference; tests/numpy/ops/topk.py
// recomputes them.
// The reference orders each row by value descending, ties by column ascending, so the NumPy
// side can compare exactly.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/topk/params.h"
#include "kernels/topk/reference.h"
#include "kernels/topk/topk.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/numpy/dump.h"

namespace attnd::testing {
namespace {

using kernels::DType;
namespace topk = kernels::topk;

struct CaseSpec {
  const char* name;
  int64_t m, n, k;
  bool lengths;   // the lengths form instead of ks/ke
  bool integers;  // small integer logits: heavy ties
  int64_t page;   // > 0: a block table with this page size
  int64_t rows_per_request;
  bool row_start = false;  // IndexBase::kRowStart: positions from each window start
  // The request of a row: 0 by rows_per_request, 1 by req_id_per_row (some ids out of range),
  // 2 by cu_seqlens_q (an empty request, the last rows past cu[B]); block_stride 0 = page.
  int request_form = 0;
  int64_t block_stride = 0;
};

void DumpCase(const std::string& dir, const CaseSpec& c, std::mt19937_64& rng) {
  HostTensor logits = HostTensor::RowStrided(DType::kF32, {c.m, c.n}, c.n + 5);
  if (c.integers) {
    FillUniformInt(logits, rng, -3, 3);
  } else {
    FillNormal(logits, rng, 1.0);
  }
  std::uniform_int_distribution<int64_t> col(0, c.n - 1);
  float* data = logits.data<float>();
  for (int i = 0; i < 6; ++i) {  // sprinkle NaN and -inf
    const int64_t r = static_cast<int64_t>(rng() % static_cast<uint64_t>(c.m));
    data[logits.Offset({r, col(rng)})] = std::numeric_limits<float>::quiet_NaN();
    data[logits.Offset({r, col(rng)})] = -std::numeric_limits<float>::infinity();
  }
  HostTensor ks = HostTensor::Dense(DType::kI32, {c.m});
  HostTensor ke = HostTensor::Dense(DType::kI32, {c.m});
  HostTensor lengths = HostTensor::Dense(DType::kI32, {c.m});
  std::uniform_int_distribution<int32_t> pos(-5, static_cast<int32_t>(c.n + 5));
  for (int64_t r = 0; r < c.m; ++r) {
    ks.data<int32_t>()[r] = pos(rng);
    ke.data<int32_t>()[r] = pos(rng);
    lengths.data<int32_t>()[r] = pos(rng);
  }
  HostTensor block_table, req_ids, cu_seqlens;
  topk::Params p;
  p.logits = logits.tensor();
  if (c.lengths) {
    p.lengths = lengths.tensor();
  } else {
    p.ks = ks.tensor();
    p.ke = ke.tensor();
  }
  p.k = c.k;
  if (c.page > 0) {
    const int64_t max_blocks = (c.n + c.page - 1) / c.page - 3;  // the last pages unmapped
    // Three requests with the per-row forms (rows_per_request is 1 there).
    const int64_t requests = c.request_form == 0 ? c.m / c.rows_per_request : 3;
    block_table = HostTensor::Dense(DType::kI32, {requests, max_blocks});
    FillUniformInt(block_table, rng, 0, 4 * max_blocks);
    for (int64_t q = 0; q < block_table.tensor().dim(0); ++q) {  // unmapped and overflowing ids
      for (int64_t b = 0; b < max_blocks; ++b) {
        int32_t& id = block_table.data<int32_t>()[block_table.Offset({q, b})];
        if (b % 5 == 1) id = -1;
        if (b % 7 == 3) id = -2 - static_cast<int32_t>(b);
        if (b % 11 == 4)
          id = std::numeric_limits<int32_t>::max() / static_cast<int32_t>(c.page) + 1;
      }
    }
    // Large logits in the first unmapped page and in pages with -1, negative and overflowing ids,
    // so that chosen columns land there; rows 0 and 1 see the whole row.
    for (int64_t r = 0; r < c.m; ++r) {
      for (int64_t b : {int64_t{1}, int64_t{3}, int64_t{4}, max_blocks}) {
        data[logits.Offset({r, std::min(c.n - 1, b * c.page + r % c.page)})] = 50.0f;
      }
    }
    for (int64_t r = 0; r < 2; ++r) {
      ks.data<int32_t>()[r] = 0;
      ke.data<int32_t>()[r] = lengths.data<int32_t>()[r] = static_cast<int32_t>(c.n);
    }
    p.block_table = block_table.tensor();
    p.page_size = c.page;
    p.rows_per_request = c.rows_per_request;
    p.block_stride = c.block_stride;
    if (c.request_form == 1) {  // ids in [-2, requests]: -2, -1 and `requests` have no request
      req_ids = HostTensor::Dense(DType::kI32, {c.m});
      FillUniformInt(req_ids, rng, -2, static_cast<int32_t>(requests));
      p.req_id_per_row = req_ids.tensor();
    } else if (c.request_form == 2) {  // request 1 empty; rows from cu[3] = m - 2 on have none
      cu_seqlens = HostTensor::Dense(DType::kI32, {requests + 1});
      const int32_t m = static_cast<int32_t>(c.m);
      const int32_t cu[4] = {0, m / 2, m / 2, m - 2};
      std::copy(cu, cu + 4, cu_seqlens.data<int32_t>());
      p.cu_seqlens_q = cu_seqlens.tensor();
    }
  }
  if (c.row_start) p.index_base = topk::IndexBase::kRowStart;
  HostTensor indices = HostTensor::Dense(DType::kI32, {c.m, c.k});
  p.indices = indices.tensor();
  if (!topk::Validate(p).ok()) return;  // a bad spec above: no case rather than a wrong one

  const std::vector<topk::RefRow> ref = topk::Reference(p);
  std::vector<double> ref_cols(static_cast<size_t>(c.m * c.k), -1.0);
  std::vector<double> ref_values(ref_cols.size(), -INFINITY);
  std::vector<double> ref_slots(ref_cols.size(), -1.0);
  for (int64_t r = 0; r < c.m; ++r) {
    const topk::RefRow& row = ref[static_cast<size_t>(r)];
    for (size_t j = 0; j < row.cols.size(); ++j) {
      const size_t at = static_cast<size_t>(r * c.k) + j;
      ref_cols[at] = static_cast<double>(row.cols[j]);
      ref_values[at] = row.values[j];
      ref_slots[at] = static_cast<double>(topk::ReferenceSlot(p, r, row.cols[j]));  // p's base
    }
  }
  CaseWriter w(dir, std::string("topk_") + c.name, "topk");
  w.AddTensor("logits", p.logits);
  if (c.lengths) {
    w.AddTensor("lengths", p.lengths);
  } else {
    w.AddTensor("ks", p.ks);
    w.AddTensor("ke", p.ke);
  }
  w.AddScalar("k", static_cast<double>(c.k));
  if (c.row_start) {
    w.AddScalar("row_start", 1.0);
    w.AddReference("written", ref_slots, {c.m, c.k});  // positions, or the slots they map to
  }
  if (c.page > 0) {
    w.AddTensor("block_table", p.block_table);
    w.AddScalar("page_size", static_cast<double>(c.page));
    w.AddScalar("rows_per_request", static_cast<double>(c.rows_per_request));
    w.AddScalar("block_stride", static_cast<double>(c.block_stride));
    if (p.req_id_per_row.present()) w.AddTensor("req_id_per_row", p.req_id_per_row);
    if (p.cu_seqlens_q.present()) w.AddTensor("cu_seqlens_q", p.cu_seqlens_q);
    w.AddReference("slots", ref_slots, {c.m, c.k});
  }
  w.AddReference("cols", ref_cols, {c.m, c.k});
  w.AddReference("values", ref_values, {c.m, c.k});
  w.Finish();
}

void DumpTopK(const std::string& dir) {
  std::mt19937_64 rng = MakeRng();
  const CaseSpec cases[] = {
      {"ks_ke_ties", 8, 300, 40, false, true, 0, 1},
      {"ks_ke_normal", 6, 700, 64, false, false, 0, 1},
      {"lengths_short_rows", 5, 200, 150, true, false, 0, 1},
      {"lengths_ties_k1", 7, 90, 1, true, true, 0, 1},
      {"slots_page16_two_rows_per_request", 6, 500, 32, true, false, 16, 2},
      {"slots_page7_ties", 4, 260, 50, false, true, 7, 1},
      {"ks_ke_row_start", 6, 700, 64, false, false, 0, 1, true},
      {"slots_page16_row_start", 6, 900, 48, false, false, 16, 3, true},
      {"slots_req_ids_page1", 9, 300, 24, true, false, 1, 1, false, 1},
      {"slots_req_ids_page64_stride128", 8, 900, 48, false, false, 64, 1, true, 1, 128},
      {"slots_cu_seqlens_page16_stride32", 10, 600, 40, false, true, 16, 1, false, 2, 32},
      {"slots_cu_seqlens_page1_stride3", 7, 200, 30, true, false, 1, 1, true, 2, 3},
  };
  for (const CaseSpec& c : cases) DumpCase(dir, c, rng);
}

}  // namespace
}  // namespace attnd::testing

ATTND_REGISTER_NUMPY_DUMPER(topk, attnd::testing::DumpTopK);
