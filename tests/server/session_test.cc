// The Session stream against an in-process attnd: leases (regions die with the stream however it
// ends), pipelined calls with flow control, the open-first rule.
#include "tests/server/daemon_fixture.h"

namespace attnd::server::testing {
namespace {

TEST_F(DaemonTest, SessionLeaseRemovesItsRegions) {
  ScopedShm shm(8 << 20);
  ASSERT_TRUE(shm.ok());
  grpc::ClientContext ctx;
  auto stream = stub_->Session(&ctx);
  v1::SessionRequest open;
  open.set_request_id(1);
  open.mutable_open()->set_client_name("daemon_test");
  ASSERT_TRUE(stream->Write(open));
  v1::SessionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_EQ(resp.code(), 0) << resp.message();
  const std::string lease = resp.opened().lease_id();
  EXPECT_FALSE(lease.empty());

  v1::SessionRequest reg;
  reg.set_request_id(2);
  reg.mutable_register_host_region()->set_name("leased");
  reg.mutable_register_host_region()->set_key(shm.key());
  reg.mutable_register_host_region()->set_byte_size(shm.size());
  ASSERT_TRUE(stream->Write(reg));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_EQ(resp.code(), 0) << resp.message();
  EXPECT_EQ(resp.request_id(), 2u);

  // Two pipelined calls: one inline, one reading kv from the leased region.
  v1::SessionRequest call = open;
  call.Clear();
  call.set_request_id(3);
  *call.mutable_sparse_mla() = InlineRequest();
  ASSERT_TRUE(stream->Write(call));
  call.set_request_id(4);
  *call.mutable_sparse_mla()->mutable_kv() = RegionTensor(kv_, v1::DTYPE_BF16, shm, "leased", 0);
  ASSERT_TRUE(stream->Write(call));
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(stream->Read(&resp));
    ASSERT_EQ(resp.code(), 0) << resp.message();
    ASSERT_TRUE(resp.request_id() == 3 || resp.request_id() == 4);
    EXPECT_EQ(std::memcmp(resp.sparse_mla().out().inline_data().data(), want_out_.raw(),
                          SpanBytes(want_out_)),
              0);
  }
  {
    grpc::ClientContext lctx;
    v1::ListRegionsResponse list;
    ASSERT_TRUE(stub_->ListRegions(&lctx, v1::ListRegionsRequest(), &list).ok());
    ASSERT_EQ(list.regions_size(), 1);
    EXPECT_EQ(list.regions(0).lease_id(), lease);
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(stream->Read(&resp));
  EXPECT_TRUE(stream->Finish().ok());
  // OnDone closes the lease right after the stream ends.
  for (int i = 0; i < 1000; ++i) {  // up to ~10 s on a loaded machine
    grpc::ClientContext lctx;
    v1::ListRegionsResponse list;
    ASSERT_TRUE(stub_->ListRegions(&lctx, v1::ListRegionsRequest(), &list).ok());
    if (list.regions_size() == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "the session's region outlived it";
}

TEST_F(DaemonTest, SessionPipelinesManyCallsWithFlowControl) {
  constexpr int kCalls = 300;  // more than the session's pending limit (128)
  grpc::ClientContext ctx;
  auto stream = stub_->Session(&ctx);
  v1::SessionRequest open;
  open.mutable_open();
  ASSERT_TRUE(stream->Write(open));
  v1::SessionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  std::thread writer([&] {
    v1::SessionRequest call;
    *call.mutable_sparse_mla() = InlineRequest();
    for (int i = 0; i < kCalls; ++i) {
      call.set_request_id(100 + i);
      if (!stream->Write(call)) return;
    }
    stream->WritesDone();
  });
  std::vector<bool> seen(kCalls, false);
  int ok = 0;
  while (stream->Read(&resp)) {
    const int64_t i = static_cast<int64_t>(resp.request_id()) - 100;
    ASSERT_TRUE(i >= 0 && i < kCalls) << resp.request_id();
    EXPECT_FALSE(seen[i]);
    seen[i] = true;
    if (resp.code() == 0) ++ok;
  }
  writer.join();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(ok, kCalls);
}

TEST_F(DaemonTest, SessionMustOpenFirst) {
  grpc::ClientContext ctx;
  auto stream = stub_->Session(&ctx);
  v1::SessionRequest call;
  call.set_request_id(7);
  *call.mutable_sparse_mla() = InlineRequest();
  ASSERT_TRUE(stream->Write(call));
  v1::SessionResponse resp;
  EXPECT_FALSE(stream->Read(&resp));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(DaemonTest, CancelledSessionClosesItsLease) {
  ScopedShm shm(4096);
  ASSERT_TRUE(shm.ok());
  auto ctx = std::make_unique<grpc::ClientContext>();
  auto stream = stub_->Session(ctx.get());
  v1::SessionRequest open;
  open.mutable_open();
  ASSERT_TRUE(stream->Write(open));
  v1::SessionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  v1::SessionRequest reg;
  reg.mutable_register_host_region()->set_name("gone");
  reg.mutable_register_host_region()->set_key(shm.key());
  reg.mutable_register_host_region()->set_byte_size(4096);
  ASSERT_TRUE(stream->Write(reg));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_EQ(resp.code(), 0) << resp.message();
  ctx->TryCancel();  // the client dies mid-session
  stream->Finish().IgnoreError();
  for (int i = 0; i < 1000; ++i) {  // up to ~10 s on a loaded machine
    grpc::ClientContext lctx;
    v1::ListRegionsResponse list;
    ASSERT_TRUE(stub_->ListRegions(&lctx, v1::ListRegionsRequest(), &list).ok());
    if (list.regions_size() == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "the cancelled session's region outlived it";
}

}  // namespace
}  // namespace attnd::server::testing
