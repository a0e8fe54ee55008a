#include "tests/kernels/dsa/paged_check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dsa/dsa.h"
#include "kernels/indexer_logits_paged/reference.h"
#include "kernels/sparse_mla/reference.h"
#include "tests/harness/fp8_kv.h"

namespace attnd::testing {

using kernels::DType;
using kernels::dsa::Params;
using RefLogits = kernels::indexer_logits::RefLogits;

std::vector<uint8_t> Bits(const HostTensor& t) { return {t.raw(), t.raw() + t.bytes()}; }

void ExpectCpuIndexPrecisionsAgree(Params p, const std::vector<HostTensor*>& outputs,
                                   const std::vector<const HostTensor*>& compared,
                                   const std::function<void(const Params&)>& check) {
  kernels::ExecContext ctx;
  ctx.pool = TestPool();
  std::map<kernels::Precision, std::vector<std::vector<uint8_t>>> bits;
  for (const kernels::Precision index_precision : kPrecisions) {
    p.index_precision = index_precision;
    for (HostTensor* o : outputs) PoisonNaN(*o);
    std::string impl;
    ASSERT_TRUE(kernels::dsa::Run(p, ctx, &impl).ok());
    EXPECT_EQ(impl, "cpu");
    check(p);
    for (const HostTensor* t : compared) bits[index_precision].push_back(Bits(*t));
  }
  EXPECT_EQ(bits[kernels::Precision::kFast], bits[kernels::Precision::kHigh]);
}

int64_t ExpectedLength(const Params& p, int64_t b, int64_t j) {
  const int64_t next_n = p.index_q.dim(1), n = kernels::dsa::LogitsColumns(p);
  const int32_t* lens = p.context_lens.ptr<const int32_t>();
  const int64_t len = p.context_lens.rank == 2
                          ? int64_t{lens[b * p.context_lens.stride(0) + j]}
                          : lens[b * p.context_lens.stride(0)] - next_n + j + 1;
  return std::clamp<int64_t>(len, 0, std::min(n, p.index_block_table.dim(1) * p.index_block_size));
}

void ExpectPagedTopk(const Params& p, const HostTensor& indices) {
  const int64_t t_count = kernels::dsa::TokenRows(p), n = kernels::dsa::LogitsColumns(p);
  const int64_t next_n = p.index_q.dim(1), k = p.topk;
  HostTensor scratch = HostTensor::Dense(DType::kF32, {t_count, std::max<int64_t>(n, 1)});
  scratch.tensor().shape[1] = n;
  const RefLogits ref = kernels::indexer_logits_paged::Reference(
      kernels::dsa::PagedIndexerStep(p, 0, t_count, scratch.tensor()));
  const double bound =
      static_cast<double>(p.index_q.dim(3) + p.index_q.dim(2) + 4) * std::ldexp(1.0, -24);
  const kernels::Tensor& table = kernels::dsa::KvBlockTable(p);
  const int64_t kbs = kernels::dsa::KvBlockSize(p);
  const int64_t stride = p.kv_block_stride != 0 ? p.kv_block_stride : kbs;
  const kernels::Tensor& index_table = p.index_block_table;
  const int64_t ibs = p.index_block_size, index_blocks = p.index_cache.dim(0);
  for (int64_t row = 0; row < t_count; ++row) {
    const int64_t b = row / next_n, j = row % next_n;
    const int64_t visible = ExpectedLength(p, b, j);
    int64_t eligible = 0;
    std::map<int64_t, int64_t> position_of_row;  // kv row -> position, eligible positions only
    for (int64_t pos = 0; pos < n; ++pos) {
      const size_t at = static_cast<size_t>(row * n + pos);
      if (pos < visible) {
        if (ref.expect[at] != RefLogits::kValue) {  // masked: its index block id is bad
          const int64_t id =
              index_table.ptr<const int32_t>()[b * index_table.stride(0) + pos / ibs];
          ASSERT_TRUE(id < 0 || id >= index_blocks) << "row " << row << " pos " << pos;
          continue;
        }
        ++eligible;
        const int64_t block = table.ptr<const int32_t>()[b * table.stride(0) + pos / kbs];
        position_of_row[block * stride + pos % kbs] = pos;
      } else {
        ASSERT_EQ(ref.expect[at], RefLogits::kNegInf) << "row " << row << " pos " << pos;
      }
    }
    std::vector<int64_t> chosen;
    bool padding = false;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t c = indices.data<int32_t>()[indices.Offset({row, i})];
      if (c == -1) {
        padding = true;
        continue;
      }
      ASSERT_FALSE(padding) << "row " << row << ": an index after the -1 padding";
      const auto it = position_of_row.find(c);
      ASSERT_NE(it, position_of_row.end())
          << "row " << row << ": kv row " << c << " is no visible position's row";
      ASSERT_TRUE(chosen.empty() || it->second > chosen.back())
          << "row " << row << ": positions not ascending";
      chosen.push_back(it->second);
    }
    ASSERT_EQ(static_cast<int64_t>(chosen.size()), std::min(k, eligible)) << "row " << row;
    double lowest_chosen = std::numeric_limits<double>::infinity();
    double highest_other = -std::numeric_limits<double>::infinity();
    size_t next = 0;
    for (int64_t pos = 0; pos < visible; ++pos) {
      const size_t at = static_cast<size_t>(row * n + pos);
      if (ref.expect[at] != RefLogits::kValue) continue;
      const double tol = p.index_precision == kernels::Precision::kFast ? ref.fast_bound[at]
                                                                        : bound * ref.magnitude[at];
      if (next < chosen.size() && chosen[next] == pos) {
        lowest_chosen = std::min(lowest_chosen, ref.value[at] + tol);
        ++next;
      } else {
        highest_other = std::max(highest_other, ref.value[at] - tol);
      }
    }
    EXPECT_GE(lowest_chosen, highest_other) << "row " << row << ": not a top-" << k;
  }
}

void ExpectMatchesReference(PagedDsaCase& c, bool gpu_on_rounded_kv,
                            kernels::Precision index_precision) {
  Params p = c.MakeParams();
  p.index_precision = index_precision;
  ASSERT_TRUE(kernels::dsa::Validate(p).ok()) << kernels::dsa::Validate(p);
  for (const kernels::Precision precision : kPrecisions) {
    p.precision = precision;
    const int runs =
        RunEachImpl(kernels::dsa::Implementations(), p, c.Outputs(), [&](const std::string& impl) {
          SCOPED_TRACE(impl + " " + kernels::PrecisionName(precision));
          ExpectPagedTopk(p, c.indices());
          kernels::sparse_mla::Params sp =
              kernels::dsa::SparseMlaStep(p, 0, c.t(), c.indices().tensor());
          HostTensor rounded;
          if (gpu_on_rounded_kv && impl != "cpu") {
            rounded = Fp8PerTensorKvAsBf16(sp.kv, sp.kv_scale);
            sp.kv = rounded.tensor();
            sp.kv_scale = 0;
            sp.kv_layout = kernels::CacheLayout::kUnspecified;
          }
          const kernels::sparse_mla::Reference ref = kernels::sparse_mla::ComputeReference(sp);
          ExpectAttentionOut(ToDoubles(c.out()), ref.out, ref.out_abs, precision, kPagedOutTol,
                             impl + " out");
          if (p.lse.present())
            ExpectClose(ToDoubles(c.lse()), ref.lse, kPagedLseTol, impl + " lse");
          for (int64_t row = 0; row < c.t(); ++row) {
            if (ExpectedLength(p, row / p.index_q.dim(1), row % p.index_q.dim(1)) != 0) continue;
            for (int64_t h = 0; h < p.q.dim(1); ++h) {
              EXPECT_EQ(c.out().At({row, h, 0}), 0.0) << "row " << row;
              if (p.lse.present()) {
                EXPECT_EQ(c.lse().At({row, h}), -std::numeric_limits<double>::infinity());
              }
            }
          }
        });
    EXPECT_GE(runs, 1);
  }
}

}  // namespace attnd::testing
