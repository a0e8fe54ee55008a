// The CUDA backend's device-ordered calls in process (docs/SERVICE.md "Stream-ordered calls on a
// CUDA device"; skipped without a GPU): a device-to-device copy "op" on device memory enqueued
// behind a ready word runs only once the word is reached and then stores done; a chain of calls
// runs without the host synchronising; the watchdog's cancel + release skips the op and stores
// the failure bit; signal words in device memory; another queue's calls complete while one waits;
// an inline input is staged at accept; a queue's calls share its workspace (graph hits); a kernel
// launched for the first time while a call waits runs (eager module loading); unpinning host
// memory does not wait for a pending call; the op's memsets run only after ready; a cancelled
// call's op is skipped in either skip form (ATTND_ORDERED_SKIP) and the next call runs it whole,
// with the conditional form's done store where ATTND_ORDERED_DONE puts it (inside the body
// by default; this binary is run both ways on a GPU); an op launched in clusters runs its grid
// once in either form.
#include <cuda.h>  // driver API types only: cuStreamWaitValue64 comes through the runtime
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/gpu/ordered_gate.h"
#include "kernels/common/gpu/runtime.h"
#include "server/engine/gpu/gpu_backend.h"
#include "server/engine/gpu/ipc.h"
#include "server/engine/ordered_device.h"
#include "server/ops/stream_ordered.h"
#include "tests/server/gpu_ordered_fresh_kernel.h"

namespace attnd::server::engine::gpu_rt {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kFail = kernels::ordered::kFailureBit;
// The done kernel and the host paths set the same bit: bit 62, which a stream's cyclic
// done >= value wait counts as reached (docs/SERVICE.md "Failure bit").
static_assert(kFail == ops::kSignalFailureBit && kFail == uint64_t{1} << 62);

bool HaveGpu() {
  int n = 0;
  return gpu::GetDeviceCount(&n) == gpu::kSuccess && n > 0;
}

// The test's own streams (copies, a frontend's wait, the fresh kernel), made before the backend's
// (OrderedBackendEnvironment): a stream created later may share a hardware queue with a lane,
// and then waits behind a call waiting there (docs/SERVICE.md "Stream-ordered calls on a CUDA
// device", "Lanes").
enum TestStream { kCopyStream = 0, kFrontendStream = 1, kFreshStream = 2, kTestStreams = 3 };
cudaStream_t TestStreamOf(TestStream which);

// out = in on the device; `in` is read back for the work count.
class CopyCall : public OpCall {
 public:
  CopyCall(const std::string& uuid, void* in, void* out, uint64_t bytes, void* readback)
      : bytes_(bytes) {
    uses_.resize(2);
    uses_[0].name = "in";
    uses_[1].name = "out";
    uses_[1].role = kernels::Role::kOutput;
    for (int i = 0; i < 2; ++i) {
      uses_[i].residence = Residence::kDeviceRegion;
      uses_[i].device_ordinal = 0;
      uses_[i].device_uuid = uuid;
      uses_[i].span_bytes = bytes;
    }
    uses_[0].device = in;
    uses_[1].device = out;
    uses_[0].readback = readback;
  }
  void SetInlineInput(void* host) {
    uses_[0].residence = Residence::kInline;
    uses_[0].device = nullptr;
    uses_[0].host = host;
  }
  absl::string_view op() const override { return name_; }
  const std::vector<TensorUse>& tensors() const override { return uses_; }
  const std::string& ready_event() const override { return none_; }
  const std::string& device_uuid() const override { return none_; }
  std::string LaunchKey() const override { return name_ + "|" + std::to_string(bytes_); }
  absl::Status Select(const kernels::ExecContext&, const std::vector<void*>&, std::string* impl,
                      int64_t* workspace) override {
    *impl = "cuda_" + name_;
    *workspace = 0;
    return absl::OkStatus();
  }
  absl::Status Run(const kernels::ExecContext& ctx, const std::vector<void*>& data,
                   std::string* impl) override {
    *impl = "cuda_copy";
    if (cudaMemcpyAsync(data[1], data[0], bytes_, cudaMemcpyDeviceToDevice,
                        static_cast<cudaStream_t>(ctx.stream)) != cudaSuccess) {
      return absl::InternalError("memcpy");
    }
    return absl::OkStatus();
  }

 private:
  std::vector<TensorUse> uses_;
  std::string none_;
  const uint64_t bytes_;

 protected:
  std::string name_ = "copy";  // the op's name, its launch key's and its impl's
};

// out = in through the call's workspace (two copies): a workspace of `workspace` bytes >= bytes.
class WorkspaceCopyCall : public CopyCall {
 public:
  WorkspaceCopyCall(const std::string& uuid, void* in, void* out, uint64_t bytes,
                    uint64_t workspace)
      : CopyCall(uuid, in, out, bytes, nullptr), bytes_(bytes), workspace_(workspace) {}
  std::string LaunchKey() const override { return "wscopy|" + std::to_string(bytes_); }
  absl::Status Select(const kernels::ExecContext&, const std::vector<void*>&, std::string* impl,
                      int64_t* workspace) override {
    *impl = "cuda_copy";
    *workspace = static_cast<int64_t>(workspace_);
    return absl::OkStatus();
  }
  absl::Status Run(const kernels::ExecContext& ctx, const std::vector<void*>& data,
                   std::string* impl) override {
    *impl = "cuda_copy";
    const auto s = static_cast<cudaStream_t>(ctx.stream);
    if (!HasWorkspace(ctx) ||
        cudaMemcpyAsync(ctx.workspace, data[0], bytes_, cudaMemcpyDeviceToDevice, s) !=
            cudaSuccess ||
        cudaMemcpyAsync(data[1], ctx.workspace, bytes_, cudaMemcpyDeviceToDevice, s) !=
            cudaSuccess) {
      return absl::InternalError("workspace copy");
    }
    return absl::OkStatus();
  }

 protected:
  bool HasWorkspace(const kernels::ExecContext& ctx) const {
    return ctx.workspace != nullptr && ctx.workspace_bytes >= static_cast<int64_t>(workspace_);
  }

 private:
  const uint64_t bytes_, workspace_;
};

// A memset 1D of `a` bytes at out + 3, then a 2D memset of rows of `width` bytes `pitch` apart
// after them, then a copy of in into the first row's neighbour: memset nodes in the conditional
// body, in order.
class MemsetCall : public CopyCall {
 public:
  static constexpr uint64_t kA = 1001, kPitch = 256, kWidth = 77, kHeight = 5;
  MemsetCall(const std::string& uuid, void* in, void* out, uint64_t bytes)
      : CopyCall(uuid, in, out, bytes, nullptr) {}
  std::string LaunchKey() const override { return "memset"; }
  absl::Status Run(const kernels::ExecContext& ctx, const std::vector<void*>& data,
                   std::string* impl) override {
    *impl = "cuda_memset";
    const auto s = static_cast<cudaStream_t>(ctx.stream);
    auto* out = static_cast<unsigned char*>(data[1]);
    if (cudaMemsetAsync(out + 3, 0x5a, kA, s) != cudaSuccess ||
        cudaMemset2DAsync(out + 2048, kPitch, 0x33, kWidth, kHeight, s) != cudaSuccess ||
        cudaMemcpyAsync(out + 2048 + kWidth, data[0], 16, cudaMemcpyDeviceToDevice, s) !=
            cudaSuccess) {
      return absl::InternalError("memset");
    }
    return absl::OkStatus();
  }
};

// MemsetCall's pattern in the call's workspace (the 1D memset of `value`), then in's 16 bytes
// after the first 2D row and the whole workspace's first `bytes` copied to out: the memsets lead
// the op and write only the workspace, so they leave the conditional body.
class WorkspaceMemsetCall : public WorkspaceCopyCall {
 public:
  WorkspaceMemsetCall(const std::string& uuid, void* in, void* out, uint64_t bytes, int value)
      : WorkspaceCopyCall(uuid, in, out, bytes, bytes), bytes_(bytes), value_(value) {}
  std::string LaunchKey() const override {
    return "wsmemset|" + std::to_string(bytes_) + "|" + std::to_string(value_);
  }
  absl::Status Run(const kernels::ExecContext& ctx, const std::vector<void*>& data,
                   std::string* impl) override {
    *impl = "cuda_memset";
    const auto s = static_cast<cudaStream_t>(ctx.stream);
    auto* ws = static_cast<unsigned char*>(ctx.workspace);
    if (!HasWorkspace(ctx) || cudaMemsetAsync(ws + 3, value_, MemsetCall::kA, s) != cudaSuccess ||
        cudaMemset2DAsync(ws + 2048, MemsetCall::kPitch, 0x33, MemsetCall::kWidth,
                          MemsetCall::kHeight, s) != cudaSuccess ||
        cudaMemcpyAsync(ws + 2048 + MemsetCall::kWidth, data[0], 16, cudaMemcpyDeviceToDevice, s) !=
            cudaSuccess ||
        cudaMemcpyAsync(data[1], ws, bytes_, cudaMemcpyDeviceToDevice, s) != cudaSuccess) {
      return absl::InternalError("workspace memset");
    }
    return absl::OkStatus();
  }

 private:
  const uint64_t bytes_;
  const int value_;
};

// out = in by two copy kernels (each half), nothing else: an op the enable form of the gate can
// take (docs/SERVICE.md "Skipping a cancelled call's op"), where CopyCall's memcpy node cannot.
class KernelCopyCall : public CopyCall {
 public:
  KernelCopyCall(const std::string& uuid, void* in, void* out, uint64_t bytes)
      : CopyCall(uuid, in, out, bytes, nullptr), words_(static_cast<unsigned int>(bytes / 4)) {
    name_ = "kernel_copy";
  }
  absl::Status Run(const kernels::ExecContext& ctx, const std::vector<void*>& data,
                   std::string* impl) override {
    *impl = "cuda_kernel_copy";
    auto* s = static_cast<cudaStream_t>(ctx.stream);
    const auto* in = static_cast<const unsigned int*>(data[0]);
    auto* out = static_cast<unsigned int*>(data[1]);
    const unsigned int half = words_ / 2;
    if (testing::LaunchCopyWords(in, out, half, s) != cudaSuccess ||
        testing::LaunchCopyWords(in + half, out + half, words_ - half, s) != cudaSuccess) {
      return absl::InternalError("copy kernels");
    }
    return absl::OkStatus();
  }

 private:
  const unsigned int words_;
};

// out = in by one copy kernel launched in clusters of two CTAs, each CTA counting itself into
// `ctas` (device memory): the enable form leaves such an op to the conditional form
// (docs/SERVICE.md "Skipping a cancelled call's op").
class ClusterCopyCall : public CopyCall {
 public:
  ClusterCopyCall(const std::string& uuid, void* in, void* out, uint64_t bytes, unsigned int* ctas)
      : CopyCall(uuid, in, out, bytes, nullptr),
        words_(static_cast<unsigned int>(bytes / 4)),
        ctas_(ctas) {
    name_ = "cluster_copy";
  }
  absl::Status Run(const kernels::ExecContext& ctx, const std::vector<void*>& data,
                   std::string* impl) override {
    *impl = "cuda_cluster_copy";
    if (testing::LaunchClusterCopyWords(static_cast<const unsigned int*>(data[0]),
                                        static_cast<unsigned int*>(data[1]), words_, ctas_,
                                        static_cast<cudaStream_t>(ctx.stream)) != cudaSuccess) {
      return absl::InternalError("cluster copy kernel");
    }
    return absl::OkStatus();
  }

 private:
  const unsigned int words_;
  unsigned int* const ctas_;
};

struct Buffer {
  explicit Buffer(uint64_t n) : bytes(n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
  ~Buffer() { (void)cudaFree(p); }
  // On the test's copy stream (non-blocking: never waits for the daemon's streams).
  void Fill(int v) {
    cudaStream_t s = TestStreamOf(kCopyStream);
    EXPECT_EQ(cudaMemsetAsync(p, v, bytes, s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }
  std::vector<unsigned char> Read() const {
    std::vector<unsigned char> h(bytes);
    cudaStream_t s = TestStreamOf(kCopyStream);
    EXPECT_EQ(cudaMemcpyAsync(h.data(), p, bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    return h;
  }
  void* p = nullptr;
  uint64_t bytes;
};

bool All(const std::vector<unsigned char>& v, unsigned char x) {
  for (unsigned char c : v) {
    if (c != x) return false;
  }
  return true;
}

// Words the test's host reads and writes, mapped for the device.
struct HostWords {
  HostWords() {
    EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&w), 4096,
                            cudaHostAllocMapped | cudaHostAllocPortable),
              cudaSuccess);
    std::memset(w, 0, 4096);
  }
  ~HostWords() { (void)cudaFreeHost(w); }
  DeviceSignal Signal(int i, uint64_t value) const {
    DeviceSignal s;
    s.present = true;
    s.host_address = &w[i];
    s.value = value;
    return s;
  }
  uint64_t Get(int i) const { return __atomic_load_n(&w[i], __ATOMIC_ACQUIRE); }
  void Set(int i, uint64_t v) { __atomic_store_n(&w[i], v, __ATOMIC_RELEASE); }
  uint64_t* w = nullptr;
};

// The test's frontend stream waiting for *word >= value (cuStreamWaitValue64, GEQ: the driver's
// cyclic compare), as a caller of the daemon waits for done. The word is host memory mapped for the
// device. Null when the driver does not offer it (the test then fails).
cudaStream_t FrontendWait(uint64_t* word, uint64_t value) {
  using WaitValue64Fn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  void* device_word = nullptr;
  cudaStream_t s = TestStreamOf(kFrontendStream);
  if (s == nullptr ||
      cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &fn, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr ||
      cudaHostGetDevicePointer(&device_word, word, 0) != cudaSuccess) {
    return nullptr;
  }
  if (reinterpret_cast<WaitValue64Fn>(fn)(s, reinterpret_cast<CUdeviceptr>(device_word), value,
                                          CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) {
    return nullptr;
  }
  return s;
}

// Whether `s` ran to its end within `ms` milliseconds.
bool StreamEnds(cudaStream_t s, int ms) {
  for (int i = 0; i < ms * 10; ++i) {
    if (cudaStreamQuery(s) == cudaSuccess) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return cudaStreamQuery(s) == cudaSuccess;
}

DeviceCallState Await(DeviceOrderedCall& c, int ms = 5000) {
  for (int i = 0; i < ms * 10; ++i) {
    const DeviceCallState s = c.Poll();
    if (s != DeviceCallState::kPending) return s;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return c.Poll();
}

// One backend for these tests, made before any test of the binary creates a CUDA context or a
// stream: the lanes then sit on hardware queues of their own, apart from the watchdog's stream,
// as in the daemon (docs/SERVICE.md "Stream-ordered calls on a CUDA device": streams take the
// queues in creation order, so streams made earlier by other tests would shift them).
class OrderedBackendEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    GpuBackend::PrepareProcessEnvironment();
    if (!HaveGpu()) return;
    if (cudaSetDevice(0) != cudaSuccess) {
      error_ = "cudaSetDevice(0) failed";
      return;
    }
    for (cudaStream_t& s : streams_) {
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        error_ = "creating the test's streams failed";
        return;
      }
    }
    GpuBackendOptions o;
    o.pool_bytes = 32 * kMiB;
    o.staging_bytes = 8 * kMiB;
    o.devices = {"0"};
    auto b = GpuBackend::Create(o);
    if (!b.ok()) {
      error_ = b.status().ToString();
      return;
    }
    backend_ = *std::move(b);
  }
  void TearDown() override {
    backend_.reset();
    for (cudaStream_t& s : streams_) {
      if (s != nullptr) (void)cudaStreamDestroy(s);
      s = nullptr;
    }
  }
  GpuBackend* backend() const { return backend_.get(); }
  cudaStream_t stream(TestStream which) const { return streams_[which]; }
  const std::string& error() const { return error_; }

 private:
  std::unique_ptr<GpuBackend> backend_;
  cudaStream_t streams_[kTestStreams] = {};
  std::string error_;
};
// Also before any static initialiser of the binary could start the driver.
const bool kProcessPrepared = (GpuBackend::PrepareProcessEnvironment(), true);
OrderedBackendEnvironment* const kOrderedBackend = static_cast<OrderedBackendEnvironment*>(
    ::testing::AddGlobalTestEnvironment(new OrderedBackendEnvironment));
cudaStream_t TestStreamOf(TestStream which) { return kOrderedBackend->stream(which); }

class GpuOrderedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no GPU";
    ASSERT_NE(kOrderedBackend->backend(), nullptr) << kOrderedBackend->error();
    backend_ = kOrderedBackend->backend();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    uuid_ = backend_->served()[0].uuid;
  }
  GpuBackend* backend_ = nullptr;
  std::string uuid_;
};

TEST_F(GpuOrderedTest, RunsOnlyAfterReadyThenStoresDoneAndChainsWithoutTheHost) {
  auto q = backend_->NewOrderedQueue();
  ASSERT_NE(q, nullptr) << "the CUDA backend offers the device path";
  const uint64_t n = kMiB;
  Buffer in(n), out(n);
  in.Fill(9);
  out.Fill(0xff);  // poison
  std::vector<unsigned char> readback(n, 0);
  CopyCall call(uuid_, in.p, out.p, n, readback.data());
  HostWords words;
  auto c = q->Enqueue(call, words.Signal(0, 3), words.Signal(1, 5));
  ASSERT_TRUE(c.ok()) << c.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ((*c)->Poll(), DeviceCallState::kPending);
  EXPECT_FALSE((*c)->Gated());
  EXPECT_TRUE(All(out.Read(), 0xff)) << "the op ran before its ready word";
  EXPECT_EQ(words.Get(1), 0u);
  words.Set(0, 3);
  ASSERT_EQ(Await(**c), DeviceCallState::kRan);
  EXPECT_EQ(words.Get(1), 5u);
  EXPECT_TRUE(All(out.Read(), 9));
  StepResult r;
  (*c)->Result(&r);
  EXPECT_EQ(r.graph, "capture");
  EXPECT_EQ(r.count_readback, n);
  EXPECT_GT(r.compute, absl::ZeroDuration()) << "the gate's and done kernel's stamps";
  EXPECT_LT(r.compute, absl::Seconds(1));
  EXPECT_TRUE(All(readback, 9));

  // A chain: three calls behind ready values 4..6, each storing its own done value; the host
  // only writes the last ready value, the device runs them in order.
  Buffer in2(n);
  in2.Fill(7);
  out.Fill(0xff);
  CopyCall call2(uuid_, in2.p, out.p, n, nullptr);
  std::vector<std::unique_ptr<DeviceOrderedCall>> chain;
  for (uint64_t v = 4; v <= 6; ++v) {
    auto ci = q->Enqueue(call2, words.Signal(0, v), words.Signal(2, v));
    ASSERT_TRUE(ci.ok()) << ci.status();
    chain.push_back(*std::move(ci));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(All(out.Read(), 0xff));
  words.Set(0, 6);
  for (auto& ci : chain) EXPECT_EQ(Await(*ci), DeviceCallState::kRan);
  EXPECT_EQ(words.Get(2), 6u);
  EXPECT_TRUE(All(out.Read(), 7));
  StepResult hit;
  chain[2]->Result(&hit);
  EXPECT_EQ(hit.graph, "hit");
}

// A queue's calls share one workspace (docs/SERVICE.md "One workspace per queue"): calls that
// repeat keep their launch key, so only the first captures a graph, even when pool blocks come
// and go between them; a call needing more replaces the block while earlier calls still hold the
// old one, and every call's output is right.
TEST_F(GpuOrderedTest, CallsOfAQueueShareItsWorkspaceSoTheirGraphRepeats) {
  auto q = backend_->NewOrderedQueue();
  ASSERT_NE(q, nullptr);
  const uint64_t n = kMiB;
  Buffer in(n), out(n), in_big(2 * n), out_big(2 * n);
  in.Fill(3);
  in_big.Fill(4);
  out.Fill(0xff);
  out_big.Fill(0xff);
  WorkspaceCopyCall call(uuid_, in.p, out.p, n, n);
  WorkspaceCopyCall big(uuid_, in_big.p, out_big.p, 2 * n, 2 * n);
  HostWords words;
  std::vector<std::unique_ptr<DeviceOrderedCall>> calls;
  for (uint64_t v = 1; v <= 3; ++v) {  // all three enqueued before any runs
    auto c = q->Enqueue(call, words.Signal(0, v), words.Signal(1, v));
    ASSERT_TRUE(c.ok()) << c.status();
    calls.push_back(*std::move(c));
  }
  auto c_big = q->Enqueue(big, words.Signal(0, 4), words.Signal(1, 4));  // a larger workspace
  ASSERT_TRUE(c_big.ok()) << c_big.status();
  calls.push_back(*std::move(c_big));
  words.Set(0, 4);
  for (auto& c : calls) ASSERT_EQ(Await(*c), DeviceCallState::kRan);
  EXPECT_TRUE(All(out.Read(), 3));
  EXPECT_TRUE(All(out_big.Read(), 4));
  std::vector<std::string> graphs;
  for (auto& c : calls) {
    StepResult r;
    c->Result(&r);
    graphs.push_back(r.graph);
  }
  EXPECT_EQ(graphs, (std::vector<std::string>{"capture", "hit", "hit", "capture"}));
  calls.clear();  // completed: the calls' references go

  // After the calls completed and their blocks were released, with another pool block taken in
  // between: the queue's (larger) workspace is the same for the next two calls.
  absl::StatusOr<PoolBlock> other = backend_->device(0).pool().Allocate(n);
  ASSERT_TRUE(other.ok()) << other.status();
  out.Fill(0xff);
  for (uint64_t v = 5; v <= 6; ++v) {
    auto c = q->Enqueue(call, words.Signal(0, v), words.Signal(1, v));
    ASSERT_TRUE(c.ok()) << c.status();
    calls.push_back(*std::move(c));
  }
  words.Set(0, 6);
  for (auto& c : calls) ASSERT_EQ(Await(*c), DeviceCallState::kRan);
  EXPECT_TRUE(All(out.Read(), 3));
  StepResult second;
  calls[1]->Result(&second);
  EXPECT_EQ(second.graph, "hit");
}

TEST_F(GpuOrderedTest, WatchdogCancelAndReleaseSkipTheOpAndSetTheFailureBit) {
  auto q = backend_->NewOrderedQueue();
  ASSERT_NE(q, nullptr);
  const uint64_t n = kMiB;
  Buffer in(n), out(n);
  in.Fill(9);
  out.Fill(0xff);
  CopyCall call(uuid_, in.p, out.p, n, nullptr);
  HostWords words;
  auto c = q->Enqueue(call, words.Signal(0, 8), words.Signal(1, 8));
  ASSERT_TRUE(c.ok()) << c.status();
  // The caller's stream waits for done >= 8, as a frontend does.
  cudaStream_t frontend = FrontendWait(&words.w[1], 8);
  ASSERT_NE(frontend, nullptr) << "cuStreamWaitValue64 on a mapped host word";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ((*c)->Poll(), DeviceCallState::kPending);
  EXPECT_EQ(cudaStreamQuery(frontend), cudaErrorNotReady) << "the frontend's wait ended early";
  (*c)->SetCancel();
  ASSERT_TRUE((*c)->Release().ok());
  EXPECT_EQ(words.Get(0), 8u);  // the caller's ready word raised to the value
  ASSERT_EQ(Await(**c), DeviceCallState::kSkipped);
  EXPECT_EQ(words.Get(1), 8u | kFail);
  // 8 | the failure bit ends the frontend's wait: (8 | 2^62) - 8 >= 0 as an int64.
  const bool ended = StreamEnds(frontend, 5000);
  EXPECT_TRUE(ended) << "a stream waiting for done >= 8 hangs on the failed call's done word";
  if (!ended) words.Set(1, 8);  // release it
  EXPECT_EQ(cudaStreamSynchronize(frontend), cudaSuccess);
  EXPECT_TRUE(All(out.Read(), 0xff)) << "the op ran although cancelled";
  // The queue goes on.
  auto next = q->Enqueue(call, words.Signal(0, 9), words.Signal(1, 9));
  ASSERT_TRUE(next.ok());
  words.Set(0, 9);
  ASSERT_EQ(Await(**next), DeviceCallState::kRan);
  EXPECT_EQ(words.Get(1), 9u);
  EXPECT_TRUE(All(out.Read(), 9));
}

// The skip forms (docs/SERVICE.md "Skipping a cancelled call's op"): an op of kernels only runs in
// the form ATTND_ORDERED_SKIP names (the conditional by default; this binary is run both ways on
// a GPU), a cancelled call runs none of its kernels, and the next call of the same graph runs all
// of them again (the enable form leaves nothing disabled behind it); an op with a memcpy node runs
// in the conditional form either way. The conditional form's done store is where
// ATTND_ORDERED_DONE says (docs/SERVICE.md "The done store inside the body"): a cancelled call's
// done word then comes from the gate, a run's from the body.
TEST_F(GpuOrderedTest, SkipFormsSkipACancelledOpAndRunTheNextWhole) {
  const char* env = std::getenv("ATTND_ORDERED_SKIP");
  const std::string want = env != nullptr && std::string(env) == "enable" ? "enable" : "cond";
  const char* done_env = std::getenv("ATTND_ORDERED_DONE");
  const std::string want_done =
      done_env != nullptr && std::string(done_env) == "after" ? "after" : "body";
  auto q = backend_->NewOrderedQueue();
  ASSERT_NE(q, nullptr);
  const uint64_t n = kMiB;
  Buffer in(n), out(n);
  in.Fill(9);
  out.Fill(0xff);
  KernelCopyCall call(uuid_, in.p, out.p, n);
  HostWords words;
  auto first = q->Enqueue(call, words.Signal(0, 1), words.Signal(1, 1));
  ASSERT_TRUE(first.ok()) << first.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(All(out.Read(), 0xff)) << "the kernels ran before the ready word";
  words.Set(0, 1);
  ASSERT_EQ(Await(**first), DeviceCallState::kRan);
  EXPECT_EQ(words.Get(1), 1u);
  EXPECT_TRUE(All(out.Read(), 9));
  StepResult r;
  (*first)->Result(&r);
  EXPECT_EQ(r.skip, want);
  EXPECT_EQ(r.done_at, want == "cond" ? want_done : "");

  in.Fill(5);
  out.Fill(0xff);
  auto cancelled = q->Enqueue(call, words.Signal(0, 2), words.Signal(1, 2));
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  (*cancelled)->SetCancel();
  ASSERT_TRUE((*cancelled)->Release().ok());
  ASSERT_EQ(Await(**cancelled), DeviceCallState::kSkipped);
  EXPECT_EQ(words.Get(1), 2u | kFail);
  EXPECT_TRUE(All(out.Read(), 0xff)) << "a cancelled call's kernels ran";

  for (uint64_t v = 3; v <= 4; ++v) {  // the same graph again, twice
    auto next = q->Enqueue(call, words.Signal(0, v), words.Signal(1, v));
    ASSERT_TRUE(next.ok()) << next.status();
    words.Set(0, v);
    ASSERT_EQ(Await(**next), DeviceCallState::kRan);
    EXPECT_EQ(words.Get(1), v);
    EXPECT_TRUE(All(out.Read(), 5)) << "the op's kernels stayed off after the cancelled call";
    StepResult rn;
    (*next)->Result(&rn);
    EXPECT_EQ(rn.graph, "hit") << "the call built a graph of its own";
    out.Fill(0xff);
  }

  CopyCall copy(uuid_, in.p, out.p, n, nullptr);
  auto c = q->Enqueue(copy, words.Signal(0, 5), words.Signal(1, 5));
  ASSERT_TRUE(c.ok()) << c.status();
  words.Set(0, 5);
  ASSERT_EQ(Await(**c), DeviceCallState::kRan);
  EXPECT_TRUE(All(out.Read(), 5));
  StepResult rc;
  (*c)->Result(&rc);
  EXPECT_EQ(rc.skip, "cond") << "a memcpy node cannot be skipped by the enable form";
  EXPECT_EQ(rc.done_at, want_done);
}

// A kernel launched in clusters, made device-updatable, ran cluster-size times its grid (the
// enable form's fault in the decode step: docs/SERVICE.md "Skipping a cancelled call's op"); in
// either form such an op runs its grid once, by the conditional form.
TEST_F(GpuOrderedTest, AClusterLaunchedOpRunsItsGridOnceInEitherForm) {
  auto q = backend_->NewOrderedQueue();
  ASSERT_NE(q, nullptr);
  const uint64_t n = kMiB;
  Buffer in(n), out(n), ctas(64);
  in.Fill(0x37);
  HostWords words;
  ClusterCopyCall call(uuid_, in.p, out.p, n, static_cast<unsigned int*>(ctas.p));
  const unsigned int grid = testing::ClusterCopyGrid(static_cast<unsigned int>(n / 4));
  for (uint64_t v = 1; v <= 2; ++v) {  // a capture, then a graph hit
    out.Fill(0xff);
    ctas.Fill(0);
    auto c = q->Enqueue(call, words.Signal(0, v), words.Signal(1, v));
    ASSERT_TRUE(c.ok()) << c.status();
    words.Set(0, v);
    ASSERT_EQ(Await(**c), DeviceCallState::kRan);
    EXPECT_EQ(words.Get(1), v);
    EXPECT_TRUE(All(out.Read(), 0x37));
    const std::vector<unsigned char> counted = ctas.Read();
    unsigned int ran = 0;
    std::memcpy(&ran, counted.data(), sizeof(ran));
    EXPECT_EQ(ran, grid) << "CTAs of the cluster-launched kernel that ran (launch " << v << ")";
    StepResult r;
    (*c)->Result(&r);
    EXPECT_EQ(r.skip, "cond");
  }
}

TEST_F(GpuOrderedTest, DeviceWordsAndIndependentQueues) {
  auto blocked = backend_->NewOrderedQueue();
  auto other = backend_->NewOrderedQueue();
  ASSERT_NE(blocked, nullptr);
  const uint64_t n = kMiB;
  Buffer in(n), out_a(n), out_b(n), dwords(64);
  in.Fill(5);
  out_a.Fill(0xff);
  out_b.Fill(0xff);
  dwords.Fill(0);
  auto* ready = static_cast<uint64_t*>(dwords.p);
  DeviceSignal r;
  r.present = true;
  r.device_address = ready;
  r.value = 2;
  DeviceSignal d = r;
  d.device_address = ready + 1;
  CopyCall a(uuid_, in.p, out_a.p, n, nullptr);
  auto ca = blocked->Enqueue(a, r, d);
  ASSERT_TRUE(ca.ok()) << ca.status();
  // Another queue (its own stream, other pointers) completes meanwhile.
  HostWords words;
  CopyCall b(uuid_, in.p, out_b.p, n, nullptr);
  auto cb = other->Enqueue(b, DeviceSignal(), words.Signal(0, 1));
  ASSERT_TRUE(cb.ok());
  ASSERT_EQ(Await(**cb), DeviceCallState::kRan);
  EXPECT_EQ(words.Get(0), 1u);
  EXPECT_TRUE(All(out_b.Read(), 5));
  EXPECT_EQ((*ca)->Poll(), DeviceCallState::kPending);
  EXPECT_TRUE(All(out_a.Read(), 0xff));
  // The device-region ready word written from another stream.
  cudaStream_t s = TestStreamOf(kCopyStream);
  static const uint64_t two = 2;
  ASSERT_EQ(cudaMemcpyAsync(ready, &two, 8, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(Await(**ca), DeviceCallState::kRan);
  uint64_t got[2] = {0, 0};
  ASSERT_EQ(cudaMemcpyAsync(got, ready, 16, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(got[1], 2u);
  EXPECT_TRUE(All(out_a.Read(), 5));
  // A device word released by the watchdog (atomicMax on the watchdog stream).
  DeviceSignal r3 = r;
  r3.value = 7;
  DeviceSignal d3 = d;
  d3.value = 7;
  out_a.Fill(0xff);
  auto c3 = blocked->Enqueue(a, r3, d3);
  ASSERT_TRUE(c3.ok());
  (*c3)->SetCancel();
  ASSERT_TRUE((*c3)->Release().ok());
  ASSERT_EQ(Await(**c3), DeviceCallState::kSkipped);
  ASSERT_EQ(cudaMemcpyAsync(got, ready, 16, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(got[0], 7u);
  EXPECT_EQ(got[1], 7u | kFail);
  EXPECT_TRUE(All(out_a.Read(), 0xff));
}

// Enqueues `call` behind a device-region ready word nobody raises (no done word) and gives the
// wait 20 ms to reach the lane.
absl::StatusOr<std::unique_ptr<DeviceOrderedCall>> EnqueueBehindDeviceWord(DeviceOrderedQueue& q,
                                                                           OpCall& call, void* word,
                                                                           uint64_t value) {
  DeviceSignal r;
  r.present = true;
  r.device_address = word;
  r.value = value;
  auto c = q.Enqueue(call, r, DeviceSignal());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return c;
}

// Loading a module waits for the whole context; a call waiting on its ready word keeps the context
// busy. With the backend's eager loading a kernel never launched before in the process still
// runs while a call waits (and so does the watchdog's release, above).
TEST_F(GpuOrderedTest, AKernelFirstLaunchedWhileACallWaitsRuns) {
  auto blocked = backend_->NewOrderedQueue();
  ASSERT_NE(blocked, nullptr);
  const uint64_t n = kMiB;
  Buffer in(n), out(n), dwords(64), fresh(n);
  in.Fill(5);
  out.Fill(0xff);
  dwords.Fill(0);
  fresh.Fill(0);
  CopyCall a(uuid_, in.p, out.p, n, nullptr);
  auto ca = EnqueueBehindDeviceWord(*blocked, a, dwords.p, 3);
  ASSERT_TRUE(ca.ok()) << ca.status();
  cudaStream_t s = TestStreamOf(kFreshStream);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(testing::LaunchFreshFill(static_cast<unsigned int*>(fresh.p), 0x07070707u,
                                     static_cast<unsigned int>(n / 4), s),
            cudaSuccess);
  const bool ran = StreamEnds(s, 2000);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(ran) << "a kernel's first launch waited for another caller's ready word";
  EXPECT_EQ((*ca)->Poll(), DeviceCallState::kPending);
  (*ca)->SetCancel();
  ASSERT_TRUE((*ca)->Release().ok());
  ASSERT_EQ(Await(**ca), DeviceCallState::kSkipped);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(All(fresh.Read(), 7));
  EXPECT_TRUE(All(out.Read(), 0xff));
  std::printf("fresh kernel while a call waits: %.3f ms to finish\n", ms);
}

// Unpinning host memory waits for a device whose stream waits on a ready word (docs/BENCHMARKS.md
// "H200 runs at a0adaf0"): the backend's pinner hands it to its teardown thread, so the thread
// that drops a region (a completion, the watchdog, a request) never waits for another caller.
TEST_F(GpuOrderedTest, UnpinningHostMemoryDoesNotWaitForAPendingCall) {
  auto blocked = backend_->NewOrderedQueue();
  ASSERT_NE(blocked, nullptr);
  const uint64_t n = kMiB;
  Buffer in(n), out(n), dwords(64);
  in.Fill(5);
  out.Fill(0xff);
  dwords.Fill(0);
  auto teardown = std::make_shared<GpuTeardownThread>();
  HostRegionPinner pinner(teardown);
  std::vector<char> host(1 << 20, 1);
  ASSERT_TRUE(pinner.Pin(host.data(), host.size()).ok());
  CopyCall a(uuid_, in.p, out.p, n, nullptr);
  auto ca = EnqueueBehindDeviceWord(*blocked, a, dwords.p, 4);
  ASSERT_TRUE(ca.ok()) << ca.status();
  std::atomic<bool> then_ran{false};
  const auto t0 = std::chrono::steady_clock::now();
  pinner.Release(host.data(), [&then_ran] { then_ran = true; });
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 100.0) << "Release waited for the pending call";
  EXPECT_EQ((*ca)->Poll(), DeviceCallState::kPending);
  (*ca)->SetCancel();
  ASSERT_TRUE((*ca)->Release().ok());
  ASSERT_EQ(Await(**ca), DeviceCallState::kSkipped);
  teardown->Flush();
  EXPECT_TRUE(then_ran.load());
  EXPECT_EQ(teardown->done(), 1u);
  std::printf("unpin handed over in %.3f ms while a call waited\n", ms);
}

TEST_F(GpuOrderedTest, InlineInputsAreStagedAtAccept) {
  auto q = backend_->NewOrderedQueue();
  ASSERT_NE(q, nullptr);
  const uint64_t n = 4096;
  Buffer out(n);
  out.Fill(0xff);
  std::vector<unsigned char> host(n, 3);
  CopyCall call(uuid_, nullptr, out.p, n, nullptr);
  call.SetInlineInput(host.data());
  HostWords words;
  auto c = q->Enqueue(call, words.Signal(0, 1), words.Signal(1, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  std::fill(host.begin(), host.end(), 4);  // the bytes were taken at accept
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(All(out.Read(), 0xff));
  words.Set(0, 1);
  ASSERT_EQ(Await(**c), DeviceCallState::kRan);
  EXPECT_TRUE(All(out.Read(), 3));
  StepResult r;
  (*c)->Result(&r);
  EXPECT_EQ(r.copied_h2d, n);
}

// The op's memsets run in the conditional body: only after ready, every byte as the memsets
// would leave it, the bytes around untouched, and a cancelled call stores nothing.
TEST_F(GpuOrderedTest, MemsetsOfTheOpRunOnlyAfterReady) {
  auto q = backend_->NewOrderedQueue();
  ASSERT_NE(q, nullptr);
  const uint64_t n = 4096;
  Buffer in(16), out(n);
  in.Fill(7);
  out.Fill(0xee);  // poison
  MemsetCall call(uuid_, in.p, out.p, n);
  HostWords words;
  auto c = q->Enqueue(call, words.Signal(0, 2), words.Signal(1, 2));
  ASSERT_TRUE(c.ok()) << c.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(All(out.Read(), 0xee)) << "the fills ran before the ready word";
  words.Set(0, 2);
  ASSERT_EQ(Await(**c), DeviceCallState::kRan);
  EXPECT_EQ(words.Get(1), 2u);
  StepResult sr;
  (*c)->Result(&sr);
  EXPECT_EQ(sr.pre_memsets, 0) << "memsets of an output left the body";
  std::vector<unsigned char> want(n, 0xee);
  std::fill_n(want.begin() + 3, MemsetCall::kA, 0x5a);
  for (uint64_t r = 0; r < MemsetCall::kHeight; ++r) {
    std::fill_n(want.begin() + 2048 + r * MemsetCall::kPitch, MemsetCall::kWidth, 0x33);
  }
  std::fill_n(want.begin() + 2048 + MemsetCall::kWidth, 16, 7);
  const std::vector<unsigned char> got = out.Read();
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += got[i] != want[i];
  EXPECT_EQ(bad, 0u) << "bytes unlike the memsets' and the copy's";

  out.Fill(0xee);
  auto skipped = q->Enqueue(call, words.Signal(0, 3), words.Signal(1, 3));
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  (*skipped)->SetCancel();
  ASSERT_TRUE((*skipped)->Release().ok());
  ASSERT_EQ(Await(**skipped), DeviceCallState::kSkipped);
  EXPECT_EQ(words.Get(1), 3u | kFail);
  EXPECT_TRUE(All(out.Read(), 0xee)) << "a cancelled call's fills ran";
}

// The op's leading workspace memsets run before the ready wait, in lane order: a later call's
// memsets wait for the earlier call that reads the workspace, whatever the later ready word says;
// a cancelled call still stores nothing outside the workspace.
TEST_F(GpuOrderedTest, WorkspaceMemsetsRunBeforeTheWaitInLaneOrder) {
  auto q = backend_->NewOrderedQueue();
  ASSERT_NE(q, nullptr);
  const uint64_t n = 4096;
  Buffer in(16), out1(n), out2(n), out3(n);
  in.Fill(7);
  for (Buffer* b : {&out1, &out2, &out3}) b->Fill(0xee);  // poison
  WorkspaceMemsetCall first(uuid_, in.p, out1.p, n, 0x5a), second(uuid_, in.p, out2.p, n, 0x77);
  HostWords words;
  auto c1 = q->Enqueue(first, words.Signal(0, 1), words.Signal(1, 1));
  ASSERT_TRUE(c1.ok()) << c1.status();
  auto c2 = q->Enqueue(second, words.Signal(2, 1), words.Signal(3, 1));
  ASSERT_TRUE(c2.ok()) << c2.status();
  words.Set(2, 1);  // the second call's ready word first: it still runs after the first
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(All(out1.Read(), 0xee)) << "the first call ran before its ready word";
  EXPECT_TRUE(All(out2.Read(), 0xee)) << "the second call ran before the first";
  words.Set(0, 1);
  ASSERT_EQ(Await(**c1), DeviceCallState::kRan);
  ASSERT_EQ(Await(**c2), DeviceCallState::kRan);
  EXPECT_EQ(words.Get(1), 1u);
  EXPECT_EQ(words.Get(3), 1u);
  for (auto* c : {&c1, &c2}) {
    StepResult r;
    (**c)->Result(&r);
    EXPECT_EQ(r.pre_memsets, 2) << "both leading workspace memsets leave the body";
  }
  // Only the bytes the op defines: the memsets' and the copy's (the rest of the workspace is
  // whatever the pool held).
  auto check = [&](const std::vector<unsigned char>& got, int value) {
    size_t bad = 0;
    for (uint64_t i = 3; i < 3 + MemsetCall::kA; ++i) bad += got[i] != value;
    for (uint64_t r = 0; r < MemsetCall::kHeight; ++r) {
      for (uint64_t i = 0; i < MemsetCall::kWidth; ++i) {
        bad += got[2048 + r * MemsetCall::kPitch + i] != 0x33;
      }
    }
    for (uint64_t i = 0; i < 16; ++i) bad += got[2048 + MemsetCall::kWidth + i] != 7;
    return bad;
  };
  EXPECT_EQ(check(out1.Read(), 0x5a), 0u) << "the first call saw the second call's memsets";
  EXPECT_EQ(check(out2.Read(), 0x77), 0u);

  WorkspaceMemsetCall third(uuid_, in.p, out3.p, n, 0x21);
  auto skipped = q->Enqueue(third, words.Signal(4, 1), words.Signal(5, 1));
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  (*skipped)->SetCancel();
  ASSERT_TRUE((*skipped)->Release().ok());
  ASSERT_EQ(Await(**skipped), DeviceCallState::kSkipped);
  EXPECT_EQ(words.Get(5), 1u | kFail);
  EXPECT_TRUE(All(out3.Read(), 0xee)) << "a cancelled call wrote its output";
}

}  // namespace
}  // namespace attnd::server::engine::gpu_rt
