// The paged DsaAttention through an in-process daemon and the C++ client (docs/CONTRACTS.md
// "dsa_attention", "Paged form"): the request's paged fields (index_cache, the two block tables,
// context_lens, the block sizes and stride) reach the kernel, whose bits the reply must carry
// (checked against the kernel run locally on the same inputs), kv_scale with the per-tensor FP8
// MLA cache too; mixed or incomplete forms are INVALID_ARGUMENT naming the field; GetInfo-level
// FLOPs follow the visible lengths.
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/client.h"
#include "kernels/dsa/dsa.h"
#include "tests/kernels/dsa/paged_case.h"
#include "tests/server/daemon_fixture.h"

namespace attnd::server::testing {
namespace {

using attnd::testing::PagedDsaCase;
using attnd::testing::PagedDsaSpec;

std::vector<uint8_t> Bits(const HostTensor& t) { return {t.raw(), t.raw() + t.bytes()}; }

class DsaPagedDaemonTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    client::ConnectOptions o;
    o.target = daemon_->grpc_addresses()[0];
    absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }
  void TearDown() override {
    client_.reset();
    DaemonTest::TearDown();
  }

  // The kernel run here and the daemon's reply on the same inputs, bit for bit.
  void ExpectDaemonMatchesKernel(PagedDsaCase& c) {
    const kernels::dsa::Params p = c.MakeParams();
    kernels::ExecContext ctx;
    ctx.pool = attnd::testing::TestPool();
    for (HostTensor* o : c.Outputs()) attnd::testing::PoisonNaN(*o);
    ASSERT_TRUE(kernels::dsa::Run(p, ctx).ok()) << kernels::dsa::Run(p, ctx);
    const std::vector<uint8_t> out = Bits(c.out()), lse = Bits(c.lse()), idx = Bits(c.indices());
    for (HostTensor* o : c.Outputs()) attnd::testing::PoisonNaN(*o);
    absl::StatusOr<client::CallResult> r = client_->DsaAttention(p);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(Bits(c.out()), out);
    EXPECT_EQ(Bits(c.lse()), lse);
    EXPECT_EQ(Bits(c.indices()), idx);
    EXPECT_DOUBLE_EQ(r->stats.flops(), kernels::dsa::Count(p).flops);
  }

  std::unique_ptr<client::Client> client_;
};

// vLLM's decode: one table for both caches, [B] lengths, the FP8 MLA cache, next_n 1.
TEST_F(DsaPagedDaemonTest, SharedTableFp8Kv) {
  std::mt19937_64 rng = attnd::testing::MakeRng();
  PagedDsaSpec spec;
  spec.fp8_kv = true;
  PagedDsaCase c(spec, rng);
  c.SetContexts({70, 3, 128});
  ExpectDaemonMatchesKernel(c);
}

// MTP decode with per-token lengths, a separate page-8 MLA table whose pool interleaves other
// layers' rows, padded strides, bf16 KV.
TEST_F(DsaPagedDaemonTest, SeparateTablePerTokenLengthsNextN2) {
  std::mt19937_64 rng = attnd::testing::MakeRng();
  PagedDsaSpec spec;
  spec.next_n = 2;
  spec.per_token_lens = true;
  spec.separate_kv_table = true;
  spec.kv_block_size = 8;
  spec.kv_block_stride = 12;
  spec.kv_blocks = 60;
  spec.pad = 3;
  PagedDsaCase c(spec, rng);
  c.SetContexts({40, 128, 2});
  c.SetTokenLength(2, 0, 0);
  ExpectDaemonMatchesKernel(c);
}

// vLLM's kv_cache_dtype "fp8" MLA cache (per-tensor codes, d_qk 576 and 512) with the layer's
// k_scale: kv_scale reaches the kernel (a wrong or missing scale would change the bits or be
// refused); without it, INVALID_ARGUMENT naming kv_scale.
TEST_F(DsaPagedDaemonTest, PerTensorFp8KvWithKvScale) {
  for (const int64_t d_qk : {576, 512}) {
    SCOPED_TRACE("d_qk " + std::to_string(d_qk));
    std::mt19937_64 rng = attnd::testing::MakeRng();
    PagedDsaSpec spec;
    spec.d_qk = d_qk;
    spec.per_tensor_kv = true;
    spec.kv_scale = 0.0371f;
    spec.next_n = 2;
    PagedDsaCase c(spec, rng);
    c.SetContexts({70, 1, 128});
    ExpectDaemonMatchesKernel(c);
    kernels::dsa::Params p = c.MakeParams();
    p.kv_scale = 0;
    absl::StatusOr<client::CallResult> r = client_->DsaAttention(p);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(r.status().message(), "kv_scale: missing")) << r.status();
  }
}

// Speculative decoding with 3 draft tokens (next_n 4) over hostile data the kernel masks or
// clamps rather than refuses: index table ids out of the pool, a negative kv table id, a
// context past the table, one shorter than next_n and one at INT32_MIN.
TEST_F(DsaPagedDaemonTest, NextN4HostileTablesAndLengths) {
  std::mt19937_64 rng = attnd::testing::MakeRng();
  PagedDsaSpec spec;
  spec.batch = 4;
  spec.next_n = 4;
  spec.fp8_kv = true;
  spec.separate_kv_table = true;
  spec.kv_block_size = 8;
  spec.kv_blocks = 70;
  PagedDsaCase c(spec, rng);
  c.SetContexts({9000, 2, 100, INT32_MIN});
  c.SetIndexBlock(0, 2, -3);
  c.SetIndexBlock(2, 1, INT32_MAX);
  c.SetKvBlock(0, 7, -1);
  c.SetKvBlock(2, 0, 1 << 20);
  ExpectDaemonMatchesKernel(c);
}

TEST_F(DsaPagedDaemonTest, MixedOrIncompleteFormsAreInvalidArgument) {
  std::mt19937_64 rng = attnd::testing::MakeRng();
  PagedDsaCase c(PagedDsaSpec{}, rng);
  HostTensor extra = HostTensor::Dense(DType::kI32, {c.t()});
  struct Case {
    const char* field;
    void (*apply)(kernels::dsa::Params&, const kernels::Tensor&);
  };
  const Case cases[] = {
      {"ks", [](kernels::dsa::Params& p, const kernels::Tensor& t) { p.ks = t; }},
      {"context_lens",
       [](kernels::dsa::Params& p, const kernels::Tensor&) { p.context_lens = {}; }},
      {"index_block_table",
       [](kernels::dsa::Params& p, const kernels::Tensor&) { p.index_block_table = {}; }},
      {"kv_block_stride",
       [](kernels::dsa::Params& p, const kernels::Tensor&) { p.kv_block_stride = 5; }},
      {"index_q", [](kernels::dsa::Params& p, const kernels::Tensor&) { p.index_q.rank = 3; }},
      {"topk", [](kernels::dsa::Params& p, const kernels::Tensor&) { p.topk = 4097; }},
      {"index_block_size",
       [](kernels::dsa::Params& p, const kernels::Tensor&) { p.index_block_size = -64; }},
  };
  for (const Case& k : cases) {
    kernels::dsa::Params p = c.MakeParams();
    k.apply(p, extra.tensor());
    absl::StatusOr<client::CallResult> r = client_->DsaAttention(p);
    ASSERT_FALSE(r.ok()) << k.field;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << k.field;
    EXPECT_TRUE(absl::StrContains(r.status().message(), std::string(k.field) + ":"))
        << k.field << ": " << r.status();
  }
}

}  // namespace
}  // namespace attnd::server::testing
