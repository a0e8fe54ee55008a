// The fixture of the in-process daemon tests: an attnd (Daemon) on a temporary unix socket and
// TCP port 0, a generated stub on the socket, and a SparseMla case with its expected result from
// the kernel run locally (and an IndexerLogits case).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attnd/v1/attention.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/dsa/dsa.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "server/main/daemon.h"
#include "tests/harness/harness.h"
#include "tests/harness/host_tensor.h"
#include "tests/server/shm_test_util.h"

namespace attnd::server::testing {

using attnd::testing::HostTensor;
using attnd::testing::ScopedShm;
using kernels::DType;

// The tensor's span in bytes (HostTensor storage may be padded past it).
inline size_t SpanBytes(const HostTensor& h) {
  return static_cast<size_t>(kernels::SpanElements(h.tensor()) *
                             kernels::DTypeSize(h.tensor().dtype));
}

inline v1::Tensor InlineTensor(const HostTensor& h, v1::DType dtype) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int i = 0; i < h.tensor().rank; ++i) t.add_shape(h.tensor().shape[i]);
  t.set_inline_data(std::string(reinterpret_cast<const char*>(h.raw()), SpanBytes(h)));
  return t;
}

// Copies h into the shm object at `offset` and returns a region-placed tensor.
inline v1::Tensor RegionTensor(const HostTensor& h, v1::DType dtype, ScopedShm& shm,
                               const std::string& region, uint64_t offset) {
  std::memcpy(shm.data() + offset, h.raw(), SpanBytes(h));
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int i = 0; i < h.tensor().rank; ++i) t.add_shape(h.tensor().shape[i]);
  t.mutable_region()->set_region(region);
  t.mutable_region()->set_offset(offset);
  return t;
}

// An IndexerLogits case at the model's fast shape (H 64, D 128; causal windows): its inline
// request in a precision and its logits run locally on the CPU.
struct IndexerCase {
  static constexpr int64_t kM = 9, kN = 200, kHeads = 64, kDim = 128;
  IndexerCase() {
    std::mt19937_64 rng = attnd::testing::MakeRng();
    attnd::testing::FillNormal(q, rng, 1.0);
    attnd::testing::FillNormal(k, rng, 1.0);
    attnd::testing::FillUniform(k_scale, rng, 0.01, 0.1);
    attnd::testing::FillNormal(weights, rng, 1.0);
    for (int64_t i = 0; i < kM; ++i) {
      ks.data<int32_t>()[i] = 0;
      ke.data<int32_t>()[i] = static_cast<int32_t>(kN - kM + i + 1);
    }
  }
  v1::IndexerLogitsRequest Request(v1::Precision precision) const {
    v1::IndexerLogitsRequest req;
    *req.mutable_q() = InlineTensor(q, v1::DTYPE_FP8_E4M3);
    *req.mutable_k() = InlineTensor(k, v1::DTYPE_FP8_E4M3);
    *req.mutable_k_scale() = InlineTensor(k_scale, v1::DTYPE_F32);
    *req.mutable_weights() = InlineTensor(weights, v1::DTYPE_F32);
    *req.mutable_ks() = InlineTensor(ks, v1::DTYPE_I32);
    *req.mutable_ke() = InlineTensor(ke, v1::DTYPE_I32);
    req.set_precision(precision);
    return req;
  }
  // The CPU implementation's logits in `precision`.
  HostTensor Local(kernels::Precision precision) const {
    HostTensor logits = HostTensor::Dense(DType::kF32, {kM, kN});
    kernels::indexer_logits::Params p;
    p.q = q.tensor();
    p.k = k.tensor();
    p.k_scale = k_scale.tensor();
    p.weights = weights.tensor();
    p.ks = ks.tensor();
    p.ke = ke.tensor();
    p.precision = precision;
    p.logits = logits.tensor();
    kernels::ExecContext ctx;
    ctx.pool = attnd::testing::TestPool();
    EXPECT_TRUE(kernels::indexer_logits::Run(p, ctx).ok());
    return logits;
  }
  HostTensor q = HostTensor::Dense(DType::kFp8E4M3, {kM, kHeads, kDim});
  HostTensor k = HostTensor::Dense(DType::kFp8E4M3, {kN, kDim});
  HostTensor k_scale = HostTensor::Dense(DType::kF32, {kN});
  HostTensor weights = HostTensor::Dense(DType::kF32, {kM, kHeads});
  HostTensor ks = HostTensor::Dense(DType::kI32, {kM});
  HostTensor ke = HostTensor::Dense(DType::kI32, {kM});
};

class DaemonTest : public ::testing::Test {
 protected:
  static constexpr int64_t kT = 5, kH = 16, kDqk = 576, kS = 300, kK = 40;

  void SetUp() override {
    dir_ = "/tmp/attnd-test-" + std::to_string(getpid());
    ::mkdir(dir_.c_str(), 0700);
    DaemonConfig config;
    config.listen = {"unix:" + dir_ + "/attnd.sock", "127.0.0.1:0"};
    // The metrics endpoint (civetweb) takes about a second to stop: only where a test scrapes.
    config.metrics_listen = WithMetrics() ? "127.0.0.1:0" : "";
    config.allow_client_shm = true;
    config.backend = "cpu";  // these tests check the CPU daemon, also on GPU hosts
    config.cpu_threads = 2;
    config.drain_timeout = absl::Seconds(5);
    config.log_level = getenv("ATTND_TEST_LOG") ? getenv("ATTND_TEST_LOG") : "warning";
    Configure(&config);
    daemon_ = std::make_unique<Daemon>(config);
    ASSERT_TRUE(daemon_->Start().ok());
    ASSERT_EQ(daemon_->grpc_addresses().size(), 2u);
    EXPECT_NE(daemon_->grpc_addresses()[1], "127.0.0.1:0");
    channel_ =
        grpc::CreateChannel(daemon_->grpc_addresses()[0], grpc::InsecureChannelCredentials());
    stub_ = v1::Attention::NewStub(channel_);

    std::mt19937_64 rng = attnd::testing::MakeRng();
    q_ = HostTensor::Dense(DType::kBF16, {kT, kH, kDqk});
    kv_ = HostTensor::Dense(DType::kBF16, {kS, kDqk});
    indices_ = HostTensor::Dense(DType::kI32, {kT, kK});
    attnd::testing::FillNormal(q_, rng, 1.0);
    attnd::testing::FillNormal(kv_, rng, 1.0);
    attnd::testing::FillUniformInt(indices_, rng, -2, kS + 2);  // some masked
    // The expected result: the same kernel run locally.
    want_out_ = HostTensor::Dense(DType::kBF16, {kT, kH, 512});
    want_lse_ = HostTensor::Dense(DType::kF32, {kT, kH});
    kernels::sparse_mla::Params p;
    p.q = q_.tensor();
    p.kv = kv_.tensor();
    p.indices = indices_.tensor();
    p.sm_scale = kScale;
    p.out = want_out_.tensor();
    p.lse = want_lse_.tensor();
    kernels::ExecContext ctx;
    ctx.pool = attnd::testing::TestPool();
    ASSERT_TRUE(kernels::sparse_mla::Run(p, ctx).ok());
  }

  void TearDown() override {
    const absl::Time t0 = absl::Now();
    stub_.reset();
    channel_.reset();
    const absl::Time t1 = absl::Now();
    if (daemon_) {
      EXPECT_TRUE(daemon_->Shutdown());
    }
    const absl::Time t2 = absl::Now();
    daemon_.reset();
    const absl::Time t3 = absl::Now();
    ::rmdir(dir_.c_str());
    // Closing the channel and destroying a stopped daemon take milliseconds (about a second
    // with a metrics endpoint); Shutdown may drain for up to the drain timeout, so it is not
    // checked here.
    if (t1 - t0 > absl::Seconds(5) || t3 - t2 > absl::Seconds(5)) {
      ADD_FAILURE() << "slow teardown: channel " << (t1 - t0) << ", Shutdown " << (t2 - t1)
                    << ", destructor " << (t3 - t2);
    }
  }

  virtual bool WithMetrics() const { return false; }
  // Last changes to the daemon's configuration before it starts (e.g. a GPU backend).
  virtual void Configure(DaemonConfig* /*config*/) {}

  v1::SparseMlaRequest InlineRequest() const {
    v1::SparseMlaRequest req;
    *req.mutable_q() = InlineTensor(q_, v1::DTYPE_BF16);
    *req.mutable_kv() = InlineTensor(kv_, v1::DTYPE_BF16);
    *req.mutable_indices() = InlineTensor(indices_, v1::DTYPE_I32);
    req.set_sm_scale(kScale);
    return req;
  }

  static constexpr float kScale = 0.0416667f;
  std::string dir_;
  std::unique_ptr<Daemon> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Attention::Stub> stub_;
  HostTensor q_, kv_, indices_, want_out_, want_lse_;
};

}  // namespace attnd::server::testing
