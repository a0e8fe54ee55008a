// The indexer's precision through an in-process CPU daemon (docs/CONTRACTS.md "indexer_logits",
// "indexer_logits_paged", "dsa_attention"): IndexerLogitsPaged's `precision` and DsaAttention's
// `index_precision` (both forms), unset = HIGH and FAST opt-in, reach the kernels (bit for bit
// the local CPU run, which runs a FAST indexer as the exact sums) and CallStats names what ran
// (index_precision for DsaAttention only, its `precision` staying the attention output's); a
// value outside the enum is INVALID_ARGUMENT naming the field; GetInfo lists FAST and HIGH for
// indexer_logits_paged.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/op_codec.h"
#include "kernels/dsa/dsa.h"
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"
#include "tests/kernels/dsa/dsa_case.h"
#include "tests/kernels/dsa/paged_case.h"
#include "tests/server/daemon_fixture.h"

namespace attnd::server::testing {
namespace {

using attnd::testing::DsaCase;
using attnd::testing::DsaSpec;
using attnd::testing::PagedDsaCase;
using attnd::testing::PagedDsaSpec;

std::vector<uint8_t> Bits(const HostTensor& t) { return {t.raw(), t.raw() + t.bytes()}; }

// A paged DSA case at the FAST indexer kernel's shape (H_i 64, D_i 128, block 64), next_n 2;
// with SetContexts(&c), request 1's first token sees nothing.
PagedDsaSpec PagedSpec() { return attnd::testing::FastIndexerSpec(); }
void SetContexts(PagedDsaCase* c) { c->SetContexts({150, 1, 192}); }

class IndexerPrecisionDaemonTest : public DaemonTest {};

// IndexerLogitsPaged: unset runs HIGH, FAST is opt-in and reported; on the CPU both are the exact
// f32 sums, bit for bit the local run; CallStats.index_precision stays UNSPECIFIED; 7 is refused
// naming `precision`; GetInfo lists FAST and HIGH for the op.
TEST_F(IndexerPrecisionDaemonTest, IndexerLogitsPagedPrecisionDefaultsToHighAndFastIsReported) {
  std::mt19937_64 rng = attnd::testing::MakeRng();
  PagedDsaCase c(PagedSpec(), rng);
  SetContexts(&c);
  const kernels::dsa::Params dsa = c.MakeParams();
  const int64_t n = kernels::dsa::LogitsColumns(dsa);
  HostTensor want = HostTensor::Dense(DType::kF32, {c.t(), n});
  HostTensor got = HostTensor::Dense(DType::kF32, {c.t(), n});
  kernels::indexer_logits_paged::Params p =
      kernels::dsa::PagedIndexerStep(dsa, 0, c.t(), want.tensor());
  ASSERT_EQ(p.precision, kernels::Precision::kHigh);
  kernels::ExecContext local;
  local.pool = attnd::testing::TestPool();
  ASSERT_TRUE(kernels::indexer_logits_paged::Run(p, local).ok());
  p.logits = got.tensor();
  // p's request with `precision` (inline inputs, logits into `got`), on the generated stub.
  auto call = [&](v1::Precision precision, v1::CallStats* stats) {
    v1::IndexerLogitsPagedRequest req;
    EXPECT_TRUE(client::BuildRequest(p, nullptr, /*inline_only=*/true, &req).ok());
    req.set_precision(precision);
    grpc::ClientContext ctx;
    v1::IndexerLogitsPagedResponse reply;
    const grpc::Status s = stub_->IndexerLogitsPaged(&ctx, req, &reply);
    client::CallResult result;
    if (s.ok()) {
      EXPECT_TRUE(client::ApplyReply(p, reply, &result).ok());
    }
    *stats = reply.stats();
    return s;
  };
  for (const v1::Precision precision :
       {v1::PRECISION_UNSPECIFIED, v1::PRECISION_HIGH, v1::PRECISION_FAST}) {
    SCOPED_TRACE(v1::Precision_Name(precision));
    attnd::testing::PoisonNaN(got);
    v1::CallStats stats;
    const grpc::Status s = call(precision, &stats);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(stats.precision(),
              precision == v1::PRECISION_FAST ? v1::PRECISION_FAST : v1::PRECISION_HIGH);
    EXPECT_EQ(stats.index_precision(), v1::PRECISION_UNSPECIFIED);
    EXPECT_EQ(stats.impl(), "cpu");
    EXPECT_EQ(Bits(got), Bits(want));
  }
  v1::CallStats stats;
  const grpc::Status s = call(static_cast<v1::Precision>(7), &stats);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("precision:", 0), 0u) << s.error_message();

  grpc::ClientContext ctx;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub_->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok());
  bool listed = false;
  for (const auto& op : info.ops()) {
    if (op.name() != "indexer_logits_paged") continue;
    listed = true;
    ASSERT_EQ(op.precisions_size(), 2);
    EXPECT_EQ(op.precisions(0), v1::PRECISION_FAST);
    EXPECT_EQ(op.precisions(1), v1::PRECISION_HIGH);
  }
  EXPECT_TRUE(listed);
}

// DsaAttention's index_precision in `c`'s form: unset runs HIGH; FAST is opt-in and named in
// CallStats.index_precision while CallStats.precision stays the attention output's (FAST by
// default); the reply is bit for bit the local CPU run (which runs a FAST indexer exactly); 7 is
// refused naming index_precision.
template <class Case>
void ExpectIndexPrecisionReachesTheKernel(Case& c, v1::Attention::Stub* stub) {
  kernels::dsa::Params p = c.MakeParams();
  kernels::ExecContext local;
  local.pool = attnd::testing::TestPool();
  for (HostTensor* o : c.Outputs()) attnd::testing::PoisonNaN(*o);
  ASSERT_TRUE(kernels::dsa::Run(p, local).ok());
  const std::vector<uint8_t> out = Bits(c.out()), lse = Bits(c.lse()), idx = Bits(c.indices());
  for (const v1::Precision precision :
       {v1::PRECISION_UNSPECIFIED, v1::PRECISION_HIGH, v1::PRECISION_FAST}) {
    SCOPED_TRACE(v1::Precision_Name(precision));
    for (HostTensor* o : c.Outputs()) attnd::testing::PoisonNaN(*o);
    v1::DsaAttentionRequest req;
    ASSERT_TRUE(client::BuildRequest(p, nullptr, /*inline_only=*/true, &req).ok());
    req.set_index_precision(precision);
    grpc::ClientContext ctx;
    v1::DsaAttentionResponse reply;
    const grpc::Status s = stub->DsaAttention(&ctx, req, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    client::CallResult result;
    ASSERT_TRUE(client::ApplyReply(p, reply, &result).ok());
    EXPECT_EQ(reply.stats().index_precision(),
              precision == v1::PRECISION_FAST ? v1::PRECISION_FAST : v1::PRECISION_HIGH);
    EXPECT_EQ(reply.stats().precision(), v1::PRECISION_FAST);
    EXPECT_EQ(Bits(c.out()), out);
    EXPECT_EQ(Bits(c.lse()), lse);
    EXPECT_EQ(Bits(c.indices()), idx);
  }
  v1::DsaAttentionRequest req;
  ASSERT_TRUE(client::BuildRequest(p, nullptr, /*inline_only=*/true, &req).ok());
  req.set_index_precision(static_cast<v1::Precision>(7));
  grpc::ClientContext ctx;
  v1::DsaAttentionResponse reply;
  const grpc::Status s = stub->DsaAttention(&ctx, req, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("index_precision:", 0), 0u) << s.error_message();
}

TEST_F(IndexerPrecisionDaemonTest, DsaAttentionIndexPrecisionGatheredForm) {
  std::mt19937_64 rng = attnd::testing::MakeRng();
  DsaSpec spec;
  spec.index_heads = 64;
  DsaCase c(spec, rng);
  ExpectIndexPrecisionReachesTheKernel(c, stub_.get());
}

TEST_F(IndexerPrecisionDaemonTest, DsaAttentionIndexPrecisionPagedForm) {
  std::mt19937_64 rng = attnd::testing::MakeRng();
  PagedDsaCase c(PagedSpec(), rng);
  SetContexts(&c);
  ExpectIndexPrecisionReachesTheKernel(c, stub_.get());
}

// The C++ client names the params' index_precision in every request (FAST here), and the reply's
// CallStats echoes it.
TEST_F(IndexerPrecisionDaemonTest, ClientSendsIndexPrecision) {
  client::ConnectOptions o;
  o.target = daemon_->grpc_addresses()[0];
  absl::StatusOr<std::unique_ptr<client::Client>> cl = client::Client::Connect(o);
  ASSERT_TRUE(cl.ok()) << cl.status();
  std::mt19937_64 rng = attnd::testing::MakeRng();
  PagedDsaCase c(PagedSpec(), rng);
  SetContexts(&c);
  kernels::dsa::Params p = c.MakeParams();
  for (const kernels::Precision precision : attnd::testing::kPrecisions) {
    p.index_precision = precision;
    absl::StatusOr<client::CallResult> r = (*cl)->DsaAttention(p);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->stats.index_precision(),
              precision == kernels::Precision::kFast ? v1::PRECISION_FAST : v1::PRECISION_HIGH);
  }
}

}  // namespace
}  // namespace attnd::server::testing
