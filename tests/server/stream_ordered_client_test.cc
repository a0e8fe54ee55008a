// The C++ client's stream-ordered and prepared calls (client/stream_ordered.h) against an
// in-process CPU attnd: an enqueued call runs only after the caller stores `ready`, the prepared
// call runs blocking and stream-ordered over new data, and release / unknown ids answer
// NOT_FOUND.
#include <cstring>
#include <memory>

#include "absl/strings/match.h"
#include "client/client.h"
#include "client/host_region.h"
#include "client/session.h"
#include "client/stream_ordered.h"
#include "server/ops/stream_ordered.h"
#include "tests/server/daemon_fixture.h"

namespace attnd::server::testing {
namespace {

using client::Signal;

// The client's failure bit is the daemon's: bit 62 (docs/SERVICE.md "Failure bit").
static_assert(client::kSignalFailureBit == ops::kSignalFailureBit &&
              client::kSignalFailureBit == uint64_t{1} << 62);

client::CallOptions Timeout(absl::Duration d) {
  client::CallOptions o;
  o.timeout = d;
  return o;
}

class StreamOrderedClientTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    client::ConnectOptions o;
    o.target = daemon_->grpc_addresses()[0];
    absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    client::HostRegionOptions ro;
    ro.bytes = 2 << 20;
    ro.name = "cpp-so";
    absl::StatusOr<std::unique_ptr<client::HostRegion>> r =
        client::HostRegion::Create(client_.get(), ro);
    ASSERT_TRUE(r.ok()) << r.status();
    region_ = *std::move(r);
    // The signal words first (offsets 0 and 8), then the call's tensors.
    absl::StatusOr<kernels::Tensor> words = region_->Allocate(DType::kU8, {64});
    ASSERT_TRUE(words.ok());
    words_ = static_cast<uint64_t*>(words->data);
    std::memset(words_, 0, 64);
    p_.q = Copy(q_);
    p_.kv = Copy(kv_);
    p_.indices = Copy(indices_);
    p_.sm_scale = kScale;
    p_.out = *region_->Allocate(DType::kBF16, {kT, kH, 512});
    p_.lse = *region_->Allocate(DType::kF32, {kT, kH});
  }
  void TearDown() override {
    region_.reset();
    client_.reset();
    DaemonTest::TearDown();
  }

  kernels::Tensor Copy(const HostTensor& h) {
    std::vector<int64_t> shape(h.tensor().shape.begin(),
                               h.tensor().shape.begin() + h.tensor().rank);
    kernels::Tensor t = *region_->Allocate(h.tensor().dtype, shape);
    std::memcpy(t.data, h.raw(), SpanBytes(h));
    return t;
  }
  void Poison() {
    std::memset(p_.out.data, 0xff, SpanBytes(want_out_));
    std::memset(p_.lse.data, 0xff, SpanBytes(want_lse_));
  }
  bool Poisoned() const {
    const auto* b = static_cast<const uint8_t*>(p_.out.data);
    for (size_t i = 0; i < SpanBytes(want_out_); ++i) {
      if (b[i] != 0xff) return false;
    }
    return true;
  }
  bool Matches() const {
    return std::memcmp(p_.out.data, want_out_.raw(), SpanBytes(want_out_)) == 0 &&
           std::memcmp(p_.lse.data, want_lse_.raw(), SpanBytes(want_lse_)) == 0;
  }
  uint64_t WordOffset(int i) const {
    return static_cast<uint64_t>(reinterpret_cast<char*>(words_ + i) - region_->data());
  }

  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::HostRegion> region_;
  uint64_t* words_ = nullptr;
  kernels::sparse_mla::Params p_;
};

TEST_F(StreamOrderedClientTest, EnqueuedCallWaitsForReady) {
  Poison();
  absl::StatusOr<uint64_t> id =
      client::Enqueue(client_.get(), p_, Signal{"cpp-so", WordOffset(0), 4},
                      Signal{"cpp-so", WordOffset(1), 4}, Timeout(absl::Seconds(20)));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_NE(*id, 0u);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(Poisoned());
  EXPECT_EQ(client::LoadSignal(words_ + 1), 0u);
  client::StoreSignal(words_, 4);
  absl::StatusOr<uint64_t> done = client::WaitSignal(words_ + 1, 4, absl::Seconds(10));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(Matches());
  // Neither signal: refused before anything is sent.
  EXPECT_EQ(client::Enqueue(client_.get(), p_, std::nullopt, std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StreamOrderedClientTest, CallOptionsSignalsOnClientAndSession) {
  // Through the typed calls: CallOptions::ready / done, unary and on a Session.
  absl::StatusOr<std::unique_ptr<client::Session>> session =
      client::Session::Open(client_.get(), {});
  ASSERT_TRUE(session.ok()) << session.status();
  for (uint64_t round = 1; round <= 2; ++round) {
    Poison();
    client::StoreSignal(words_ + 1, 0);
    client::CallOptions o;
    o.ready = Signal{"cpp-so", WordOffset(0), round};
    o.done = Signal{"cpp-so", WordOffset(1), round};
    absl::StatusOr<client::CallResult> r =
        round == 1 ? client_->SparseMla(p_, o) : (*session)->Call(p_, o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->stats.enqueued());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(Poisoned());
    client::StoreSignal(words_, round);
    ASSERT_TRUE(client::WaitSignal(words_ + 1, round, absl::Seconds(10)).ok());
    EXPECT_TRUE(Matches()) << "round " << round;
  }
  EXPECT_TRUE((*session)->Close().ok());
}

TEST_F(StreamOrderedClientTest, PreparedCallRunsAndReleases) {
  absl::StatusOr<uint64_t> call = client::PrepareCall(client_.get(), p_);
  ASSERT_TRUE(call.ok()) << call.status();
  for (uint64_t run = 1; run <= 4; ++run) {
    Poison();
    if (run % 2 == 1) {
      absl::StatusOr<v1::CallStats> stats = client::RunPrepared(client_.get(), *call);
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_FALSE(stats->enqueued());
      EXPECT_EQ(stats->impl(), "cpu");
    } else {
      client::StoreSignal(words_ + 1, 0);
      absl::StatusOr<v1::CallStats> stats =
          client::RunPrepared(client_.get(), *call, Signal{"cpp-so", WordOffset(0), run},
                              Signal{"cpp-so", WordOffset(1), run}, absl::Seconds(20));
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_TRUE(stats->enqueued());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_TRUE(Poisoned());
      client::StoreSignal(words_, run);
      ASSERT_TRUE(client::WaitSignal(words_ + 1, run, absl::Seconds(10)).ok());
    }
    EXPECT_TRUE(Matches()) << "run " << run;
  }
  ASSERT_TRUE(client::ReleaseCall(client_.get(), *call).ok());
  EXPECT_EQ(client::RunPrepared(client_.get(), *call).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client::ReleaseCall(client_.get(), *call).code(), absl::StatusCode::kNotFound);
}

TEST_F(StreamOrderedClientTest, WaitSignalReportsTheFailureBit) {
  // A ready word that never comes: the daemon's watchdog stores done with the failure bit.
  Poison();
  absl::StatusOr<uint64_t> id =
      client::Enqueue(client_.get(), p_, Signal{"cpp-so", WordOffset(0), 1},
                      Signal{"cpp-so", WordOffset(1), 1}, Timeout(absl::Seconds(2)));
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<uint64_t> done = client::WaitSignal(words_ + 1, 1, absl::Seconds(10));
  EXPECT_EQ(done.status().code(), absl::StatusCode::kAborted) << done.status();
  EXPECT_EQ(client::LoadSignal(words_ + 1), 1u | client::kSignalFailureBit);
  EXPECT_TRUE(Poisoned());
  // An earlier call's failure does not end a wait for a later value; the later value does.
  absl::StatusOr<uint64_t> later = client::WaitSignal(words_ + 1, 2, absl::Milliseconds(20));
  EXPECT_EQ(later.status().code(), absl::StatusCode::kDeadlineExceeded) << later.status();
  client::StoreSignal(words_ + 1, 2);
  later = client::WaitSignal(words_ + 1, 2, absl::Seconds(1));
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(*later, 2u);
}

TEST_F(StreamOrderedClientTest, ValuesFromTheFailureBitUpAreRefused) {
  Poison();
  for (const bool on_ready : {true, false}) {
    const uint64_t value = client::kSignalFailureBit | (on_ready ? 3 : 0);
    absl::StatusOr<uint64_t> id = client::Enqueue(
        client_.get(), p_, Signal{"cpp-so", WordOffset(0), on_ready ? value : 1},
        Signal{"cpp-so", WordOffset(1), on_ready ? 1 : value}, Timeout(absl::Seconds(10)));
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << id.status();
    EXPECT_TRUE(absl::StrContains(id.status().message(), on_ready ? "ready" : "done"))
        << id.status();
  }
  client::StoreSignal(words_, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(client::LoadSignal(words_ + 1), 0u);
  EXPECT_TRUE(Poisoned());
}

}  // namespace
}  // namespace attnd::server::testing
