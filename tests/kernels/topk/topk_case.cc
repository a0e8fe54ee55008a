#include "tests/kernels/topk/topk_case.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "gtest/gtest.h"
#include "kernels/topk/reference.h"
#include "kernels/topk/topk.h"
#include "tests/harness/harness.h"
#include "tests/kernels/topk/topk_check.h"

namespace attnd::kernels::topk {

using testing::HostTensor;

TopKCase::TopKCase(int64_t m, int64_t n, int64_t k, WindowForm form, bool with_values,
                   int64_t logits_ld, int64_t out_ld) {
  logits = HostTensor::RowStrided(DType::kF32, {m, n}, logits_ld);
  indices = HostTensor::RowStrided(DType::kI32, {m, k}, out_ld);
  p.logits = logits.tensor();
  p.indices = indices.tensor();
  p.k = k;
  if (form == WindowForm::kKsKe) {
    ks = HostTensor::Dense(DType::kI32, {m});
    ke = HostTensor::Dense(DType::kI32, {m});
    p.ks = ks.tensor();
    p.ke = ke.tensor();
  } else {
    lengths = HostTensor::Dense(DType::kI32, {m});
    p.lengths = lengths.tensor();
  }
  if (with_values) {
    values = HostTensor::RowStrided(DType::kF32, {m, k}, out_ld);
    p.values = values.tensor();
  }
}

void TopKCase::SetWindow(int64_t r, int64_t begin, int64_t end) {
  if (p.lengths.present()) {
    lengths.data<int32_t>()[r] = static_cast<int32_t>(end);
  } else {
    ks.data<int32_t>()[r] = static_cast<int32_t>(begin);
    ke.data<int32_t>()[r] = static_cast<int32_t>(end);
  }
}

void TopKCase::SetFullWindows() {
  for (int64_t r = 0; r < rows(); ++r) SetWindow(r, 0, cols());
}

void TopKCase::FillOutsideWindows(float value) {
  const std::vector<RefRow> ref = Reference(p);
  for (int64_t r = 0; r < rows(); ++r) {
    for (int64_t n = 0; n < cols(); ++n) {
      if (n < ref[r].begin || n >= ref[r].end) Logit(r, n) = value;
    }
  }
}

void TopKCase::AddBlockTable(int64_t max_blocks, int64_t page_size, int64_t rows_per_request) {
  block_table = HostTensor::Dense(DType::kI32, {rows() / rows_per_request, max_blocks});
  p.block_table = block_table.tensor();
  p.page_size = page_size;
  p.rows_per_request = rows_per_request;
}

void TopKCase::AddRequestTable(int64_t requests, int64_t max_blocks, int64_t page_size,
                               int64_t block_stride, const std::vector<int32_t>& ids,
                               const std::vector<int32_t>& cu) {
  block_table = HostTensor::Dense(DType::kI32, {requests, max_blocks});
  p.block_table = block_table.tensor();
  p.page_size = page_size;
  p.block_stride = block_stride;
  p.rows_per_request = 1;
  if (!ids.empty()) {
    req_id_per_row = HostTensor::Dense(DType::kI32, {static_cast<int64_t>(ids.size())});
    std::copy(ids.begin(), ids.end(), req_id_per_row.data<int32_t>());
    p.req_id_per_row = req_id_per_row.tensor();
  }
  if (!cu.empty()) {
    cu_seqlens_q = HostTensor::Dense(DType::kI32, {static_cast<int64_t>(cu.size())});
    std::copy(cu.begin(), cu.end(), cu_seqlens_q.data<int32_t>());
    p.cu_seqlens_q = cu_seqlens_q.tensor();
  }
}

void FillDistinct(TopKCase& c, std::mt19937_64& rng) {
  std::vector<float> v(static_cast<size_t>(c.cols()));
  for (int64_t r = 0; r < c.rows(); ++r) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.25f - 1000.0f;
    std::shuffle(v.begin(), v.end(), rng);
    for (int64_t n = 0; n < c.cols(); ++n) c.Logit(r, n) = v[static_cast<size_t>(n)];
  }
}

void RunAndCheck(TopKCase& c) {
  ASSERT_TRUE(Validate(c.p).ok()) << Validate(c.p);
  const std::vector<RefRow> ref = Reference(c.p);
  std::vector<testing::HostTensor*> outputs = {&c.indices};
  if (c.p.values.present()) outputs.push_back(&c.values);
  const int runs =
      testing::RunEachImpl(Implementations(), c.p, outputs, [&](const std::string& impl) {
        if (c.p.block_table.present()) {
          ExpectMappedTopK(c.p, ref, impl);
        } else {
          ExpectValidTopK(c.p, ref, impl);
        }
      });
  EXPECT_GE(runs, 1);
}

}  // namespace attnd::kernels::topk
