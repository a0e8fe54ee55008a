// The paged DsaAttention on an in-process GPU daemon (skipped without a GPU): the paged indexer
// -> top-k with the block-table mapping -> sparse MLA runs as one captured graph on the call's
// stream (the second identical call replays it), and its reply matches the CPU kernel: the same
// kv rows per token (as sets) and out / lse within the GPU kernels' rounding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "kernels/common/bf16.h"
#include "kernels/dsa/dsa.h"
#include "server/engine/gpu_backend_factory.h"
#include "tests/kernels/dsa/paged_case.h"
#include "tests/server/daemon_fixture.h"

namespace attnd::server::testing {
namespace {

using attnd::testing::PagedDsaCase;
using attnd::testing::PagedDsaSpec;

// A dense kernels::Tensor as an inline request tensor.
v1::Tensor Inline(const kernels::Tensor& t, v1::DType dtype) {
  v1::Tensor out;
  out.set_dtype(dtype);
  for (int i = 0; i < t.rank; ++i) out.add_shape(t.shape[i]);
  const int64_t bytes = kernels::SpanElements(t) * kernels::DTypeSize(t.dtype);
  out.set_inline_data(std::string(static_cast<const char*>(t.data), static_cast<size_t>(bytes)));
  return out;
}

v1::DsaAttentionRequest PagedRequest(const kernels::dsa::Params& p) {
  v1::DsaAttentionRequest r;
  *r.mutable_index_q() = Inline(p.index_q, v1::DTYPE_FP8_E4M3);
  *r.mutable_index_weights() = Inline(p.index_weights, v1::DTYPE_F32);
  *r.mutable_index_cache() = Inline(p.index_cache, v1::DTYPE_U8);
  *r.mutable_index_block_table() = Inline(p.index_block_table, v1::DTYPE_I32);
  *r.mutable_context_lens() = Inline(p.context_lens, v1::DTYPE_I32);
  if (p.kv_block_table.present()) {
    *r.mutable_kv_block_table() = Inline(p.kv_block_table, v1::DTYPE_I32);
  }
  *r.mutable_q() = Inline(p.q, v1::DTYPE_BF16);
  *r.mutable_kv() = Inline(p.kv, p.kv.dtype == DType::kU8 ? v1::DTYPE_U8 : v1::DTYPE_BF16);
  r.set_index_block_size(p.index_block_size);
  r.set_kv_block_size(p.kv_block_size);
  r.set_kv_block_stride(p.kv_block_stride);
  r.set_topk(p.topk);
  r.set_sm_scale(p.sm_scale);
  r.mutable_indices();  // returned too
  return r;
}

class GpuDsaPagedTest : public DaemonTest {
 protected:
  void SetUp() override {
    if (engine::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU";
    DaemonTest::SetUp();
  }
  void Configure(DaemonConfig* config) override {
    config->backend = engine::GpuBackendName();
    config->pool_bytes = int64_t{512} << 20;
  }
};

// The daemon's reply to c (sent twice: a capture, then a replay) against the CPU kernel run here.
void ExpectOneGraphMatchesTheCpuKernel(v1::Attention::Stub* stub, PagedDsaCase& c) {
  const PagedDsaSpec& spec = c.spec();
  const kernels::dsa::Params p = c.MakeParams();
  kernels::ExecContext ctx;
  ctx.pool = attnd::testing::TestPool();
  ASSERT_TRUE(kernels::dsa::Run(p, ctx).ok());
  const int64_t t = c.t(), h = spec.heads, k = spec.topk;

  const v1::DsaAttentionRequest request = PagedRequest(p);
  for (int call = 0; call < 2; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    grpc::ClientContext cctx;
    v1::DsaAttentionResponse reply;
    const grpc::Status s = stub->DsaAttention(&cctx, request, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_NE(reply.stats().impl(), "cpu");
    EXPECT_EQ(reply.stats().graph(), call == 0 ? "capture" : "hit");
    const std::string& idx = reply.indices().inline_data();
    ASSERT_EQ(idx.size(), static_cast<size_t>(t * k * 4));
    for (int64_t row = 0; row < t; ++row) {
      std::set<int32_t> got, want;
      for (int64_t i = 0; i < k; ++i) {
        int32_t v;
        std::memcpy(&v, idx.data() + 4 * (row * k + i), 4);
        got.insert(v);
        want.insert(c.indices().data<int32_t>()[row * k + i]);
      }
      EXPECT_EQ(got, want) << "row " << row;
    }
    const std::string& out = reply.out().inline_data();
    ASSERT_EQ(out.size(), static_cast<size_t>(t * h * 512 * 2));
    double err = 0, norm = 0;
    for (int64_t i = 0; i < t * h * 512; ++i) {
      uint16_t bits;
      std::memcpy(&bits, out.data() + 2 * i, 2);
      const double g = kernels::Bf16ToFloat(bits);
      const double w = kernels::Bf16ToFloat(c.out().data<uint16_t>()[i]);
      ASSERT_TRUE(std::isfinite(g)) << "out element " << i;
      err += (g - w) * (g - w);
      norm += w * w;
    }
    EXPECT_LE(std::sqrt(err / std::max(norm, 1e-30)), 1e-2);
    const std::string& lse = reply.lse().inline_data();
    ASSERT_EQ(lse.size(), static_cast<size_t>(t * h * 4));
    for (int64_t i = 0; i < t * h; ++i) {
      float g;
      std::memcpy(&g, lse.data() + 4 * i, 4);
      const float w = c.lse().data<float>()[i];
      if (std::isinf(w)) {
        EXPECT_EQ(g, w) << "lse " << i;
      } else {
        EXPECT_NEAR(g, w, 1e-3) << "lse " << i;
      }
    }
  }
}

TEST_F(GpuDsaPagedTest, OneGraphMatchesTheCpuKernel) {
  std::mt19937_64 rng = attnd::testing::MakeRng();
  PagedDsaSpec spec;  // DeepSeek-V3.2's indexer and FP8 cache at a small size
  spec.batch = 4;
  spec.next_n = 2;
  spec.index_heads = 64;
  spec.heads = 64;
  spec.fp8_kv = true;
  spec.index_block_size = 64;
  spec.max_blocks = 4;
  spec.index_blocks = 20;
  spec.topk = 128;
  spec.per_token_lens = true;
  PagedDsaCase c(spec, rng);
  c.SetContexts({200, 1, 256, 90});
  ExpectOneGraphMatchesTheCpuKernel(stub_.get(), c);
}

// next_n 4 with [B] lengths (one shorter than next_n, one past the table), H128, bf16 KV over a
// separate page-32 table with an interleaved pool, an index table id out of the pool.
TEST_F(GpuDsaPagedTest, NextN4SeparateTableOneGraphMatchesTheCpuKernel) {
  std::mt19937_64 rng = attnd::testing::MakeRng();
  PagedDsaSpec spec;
  spec.batch = 3;
  spec.next_n = 4;
  spec.index_heads = 64;
  spec.heads = 128;
  spec.index_block_size = 64;
  spec.max_blocks = 4;
  spec.index_blocks = 16;
  spec.topk = 128;
  spec.separate_kv_table = true;
  spec.kv_block_size = 32;
  spec.kv_block_stride = 40;
  spec.kv_blocks = 30;
  PagedDsaCase c(spec, rng);
  c.SetContexts({3, 9000, 150});
  c.SetIndexBlock(2, 1, -1);
  ExpectOneGraphMatchesTheCpuKernel(stub_.get(), c);
}

}  // namespace
}  // namespace attnd::server::testing
