// The daemon's GPU runtime on a real device (skipped without one): the device pool, the graph
// runner's capture / hit / update decisions on real executable graphs, the backend's placement of
// inline, pinned-host and device tensors (bytes moved, readback, pool exhaustion), and IPC memory
// and event handles exported by a child process (the daemon's situation: another process owns
// the memory).
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/common/gpu/runtime.h"
#include "server/engine/gpu/device.h"
#include "server/engine/gpu/gpu_backend.h"
#include "server/engine/gpu/ipc.h"

extern char** environ;

namespace attnd::server::engine::gpu_rt {
namespace {

constexpr uint64_t kMiB = 1 << 20;

bool HaveGpu() {
  int n = 0;
  return gpu::GetDeviceCount(&n) == gpu::kSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no GPU"

// out = in (a device-to-device copy), plus a memset of the workspace: a capturable launch
// sequence whose host side counts how often it ran (a replayed graph does not run it).
class CopyCall : public OpCall {
 public:
  CopyCall(uint64_t bytes, int64_t workspace) : bytes_(bytes), workspace_(workspace) {
    uses.resize(2);
    uses[0].name = "in";
    uses[0].span_bytes = bytes;
    uses[1].name = "out";
    uses[1].role = kernels::Role::kOutput;
    uses[1].span_bytes = bytes;
    uses[1].zero_fill = true;
  }
  absl::string_view op() const override { return "copy"; }
  const std::vector<TensorUse>& tensors() const override { return uses; }
  const std::string& ready_event() const override { return ready; }
  const std::string& device_uuid() const override { return uuid; }
  std::string LaunchKey() const override { return "copy|" + std::to_string(bytes_); }
  absl::Status Select(const kernels::ExecContext&, const std::vector<void*>&, std::string* impl,
                      int64_t* workspace) override {
    *impl = "cuda_copy";
    *workspace = workspace_;
    return absl::OkStatus();
  }
  absl::Status Run(const kernels::ExecContext& ctx, const std::vector<void*>& data,
                   std::string* impl) override {
    ++runs;
    *impl = "cuda_copy";
    const auto s = static_cast<gpu::Stream>(ctx.stream);
    GPU_RETURN_IF_ERROR(gpu::MemcpyD2DAsync(data[1], data[0], bytes_, s));
    if (ctx.workspace != nullptr) {
      GPU_RETURN_IF_ERROR(gpu::MemsetAsync(ctx.workspace, 0, ctx.workspace_bytes, s));
    }
    return absl::OkStatus();
  }

  std::vector<TensorUse> uses;
  std::string ready;
  std::string uuid;
  int runs = 0;

 private:
  const uint64_t bytes_;
  const int64_t workspace_;
};

struct DeviceBuffer {
  explicit DeviceBuffer(uint64_t n) : bytes(n) { EXPECT_EQ(gpu::Malloc(&p, n), gpu::kSuccess); }
  ~DeviceBuffer() { (void)gpu::Free(p); }
  void Fill(int value) {
    EXPECT_EQ(gpu::MemsetAsync(p, value, bytes, nullptr), gpu::kSuccess);
    EXPECT_EQ(gpu::StreamSynchronize(nullptr), gpu::kSuccess);
  }
  std::vector<unsigned char> Read() const {
    std::vector<unsigned char> h(bytes);
    EXPECT_EQ(gpu::MemcpyD2HAsync(h.data(), p, bytes, nullptr), gpu::kSuccess);
    EXPECT_EQ(gpu::StreamSynchronize(nullptr), gpu::kSuccess);
    return h;
  }
  void* p = nullptr;
  uint64_t bytes;
};

bool AllEqual(const std::vector<unsigned char>& v, unsigned char x) {
  for (unsigned char c : v) {
    if (c != x) return false;
  }
  return true;
}

TEST(GpuDeviceTest, PoolIsReservedAndBounded) {
  SKIP_WITHOUT_GPU();
  GpuDevice::Options o;
  o.pool_bytes = 64 * kMiB;
  auto device = GpuDevice::Create(0, o);
  ASSERT_TRUE(device.ok()) << device.status();
  GpuDevice& d = **device;
  EXPECT_EQ(d.uuid().rfind("GPU-", 0), 0u) << d.uuid();
  EXPECT_EQ(d.uuid().size(), 40u);
  EXPECT_GT(d.description().memory_bytes, 0u);
  EXPECT_GT(d.description().cores, 0);
  EXPECT_EQ(d.pool().stats().reserved, 64 * kMiB);
  auto big = d.pool().Allocate(60 * kMiB);
  ASSERT_TRUE(big.ok());
  auto more = d.pool().Allocate(8 * kMiB);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  // The block is real device memory.
  ASSERT_EQ(gpu::MemsetAsync(big->data(), 1, 60 * kMiB, nullptr), gpu::kSuccess);
  ASSERT_EQ(gpu::StreamSynchronize(nullptr), gpu::kSuccess);
  big->Reset();
  EXPECT_TRUE(d.pool().Allocate(8 * kMiB).ok());
  // A pool larger than the device: RESOURCE_EXHAUSTED naming the flag, no crash.
  o.pool_bytes = d.description().memory_bytes * 2;
  auto too_big = GpuDevice::Create(0, o);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("--pool-bytes"), std::string::npos);
}

TEST(GraphRunnerTest, CaptureHitUpdate) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(gpu::SetDevice(0), gpu::kSuccess);
  GpuDevice::Options o;
  o.pool_bytes = 16 * kMiB;
  auto device = GpuDevice::Create(0, o);
  ASSERT_TRUE(device.ok()) << device.status();
  GpuDevice::StreamLease lease = (*device)->AcquireStream();
  kernels::ExecContext ctx;
  ctx.backend = kernels::Backend::kCuda;
  ctx.stream = lease.stream();
  const uint64_t n = 1 << 16;
  DeviceBuffer a_in(n), a_out(n), b_in(n), b_out(n);
  CopyCall call(n, 0);
  GraphRunner& runner = (*device)->graphs();
  auto launch = [&](DeviceBuffer& in, DeviceBuffer& out, const std::string& key) {
    std::vector<void*> data = {in.p, out.p};
    std::vector<const void*> pointers = {in.p, out.p, nullptr};
    std::string impl, result;
    absl::Status s = runner.Launch(call, ctx, data, key, pointers, &impl, &result);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(gpu::StreamSynchronize(lease.stream()), gpu::kSuccess);
    EXPECT_EQ(impl.empty() ? std::string("cuda_copy") : impl, "cuda_copy");
    return result;
  };
  a_in.Fill(1);
  EXPECT_EQ(launch(a_in, a_out, "k"), "capture");
  EXPECT_EQ(call.runs, 1);
  EXPECT_TRUE(AllEqual(a_out.Read(), 1));
  a_in.Fill(2);  // a replay copies what is there now
  EXPECT_EQ(launch(a_in, a_out, "k"), "hit");
  EXPECT_EQ(call.runs, 1) << "a hit runs no host launcher";
  EXPECT_TRUE(AllEqual(a_out.Read(), 2));
  b_in.Fill(3);
  EXPECT_EQ(launch(b_in, b_out, "k"), "update");
  EXPECT_EQ(call.runs, 2);
  EXPECT_TRUE(AllEqual(b_out.Read(), 3));
  EXPECT_TRUE(AllEqual(a_out.Read(), 2)) << "the updated graph no longer writes a_out";
  a_in.Fill(4);
  EXPECT_EQ(launch(a_in, a_out, "k"), "update");
  EXPECT_TRUE(AllEqual(a_out.Read(), 4));
  EXPECT_EQ(launch(a_in, a_out, "other"), "capture");
  EXPECT_EQ(runner.size(), 2u);

  GraphRunner off(4, /*enabled=*/false, nullptr);
  std::string impl, result = "x";
  ASSERT_TRUE(off.Launch(call, ctx, {a_in.p, b_out.p}, "k", {}, &impl, &result).ok());
  EXPECT_EQ(result, "");
  ASSERT_EQ(gpu::StreamSynchronize(lease.stream()), gpu::kSuccess);
  EXPECT_TRUE(AllEqual(b_out.Read(), 4));
}

GpuBackendOptions SmallOptions() {
  GpuBackendOptions o;
  o.pool_bytes = 32 * kMiB;
  o.staging_bytes = 8 * kMiB;
  o.streams_per_device = 2;
  o.devices = {"0"};
  return o;
}

// A host function on the stream that returns once *released is true: the stream, and a
// synchronise of it, wait until then.
void HoldStream(void* released) {
  auto* flag = static_cast<std::atomic<bool>*>(released);
  while (!flag->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// A closure step on the first device whose stream is held (HoldStream) until *released.
absl::Status RunHeldStep(GpuBackend& backend, std::atomic<bool>* released) {
  StepResult r;
  return backend.Run(
      "held",
      [released](const kernels::ExecContext& ctx, std::string*) -> absl::Status {
        GPU_RETURN_IF_ERROR(
            gpu::LaunchHostFunc(static_cast<gpu::Stream>(ctx.stream), &HoldStream, released));
        return absl::OkStatus();
      },
      &r);
}

GpuBackendOptions StallOptions(absl::Duration stall_timeout) {
  GpuBackendOptions o = SmallOptions();
  o.stall_timeout = stall_timeout;
  return o;
}

// --device-stall-timeout (docs/SERVICE.md "A stalled device"): a synchronise that waits past the
// limit marks the device lost (health's callback runs, later calls fail UNAVAILABLE naming the
// stall); the waiting call itself completes once its stream moves again.
TEST(GpuBackendTest, AStalledSynchroniseMarksTheDeviceLost) {
  SKIP_WITHOUT_GPU();
  auto backend = GpuBackend::Create(StallOptions(absl::Milliseconds(300)));
  ASSERT_TRUE(backend.ok()) << backend.status();
  absl::Mutex mu;
  std::vector<std::string> reports;
  (*backend)->SetDeviceLostCallback([&](const std::string& device, const std::string& why) {
    absl::MutexLock lock(&mu);
    reports.push_back(device + ": " + why);
  });
  std::atomic<bool> released{false};
  std::thread releaser([&] {
    // Lets the stream go once the stall is reported (or after 30 s, and the test fails).
    for (int i = 0; i < 3000 && (*backend)->LostDevices().empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    released = true;
  });
  const absl::Status held = RunHeldStep(**backend, &released);
  releaser.join();
  EXPECT_TRUE(held.ok()) << held;
  ASSERT_EQ((*backend)->LostDevices().size(), 1u);
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_NE(reports[0].find("stalled"), std::string::npos) << reports[0];
    EXPECT_NE(reports[0].find("--device-stall-timeout"), std::string::npos) << reports[0];
  }
  std::vector<unsigned char> in(4096, 1), out(4096, 0);
  CopyCall call(in.size(), 0);
  call.uses[0].host = in.data();
  call.uses[1].host = out.data();
  StepResult again;
  const absl::Status later = (*backend)->RunCall(call, &again);
  EXPECT_EQ(later.code(), absl::StatusCode::kUnavailable) << later;
  EXPECT_NE(later.message().find("stalled"), std::string::npos) << later;
}

// Without a limit nothing is watched: the same hold, released after 500 ms, loses nothing.
TEST(GpuBackendTest, AnUnwatchedLongSynchroniseLosesNothing) {
  SKIP_WITHOUT_GPU();
  auto backend = GpuBackend::Create(StallOptions(absl::ZeroDuration()));
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::atomic<bool> released{false};
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    released = true;
  });
  const absl::Status held = RunHeldStep(**backend, &released);
  releaser.join();
  EXPECT_TRUE(held.ok()) << held;
  EXPECT_TRUE((*backend)->LostDevices().empty());
}

TEST(GpuBackendTest, InlineTensorsAreStagedAndComeBack) {
  SKIP_WITHOUT_GPU();
  auto backend = GpuBackend::Create(SmallOptions());
  ASSERT_TRUE(backend.ok()) << backend.status();
  const uint64_t n = 3 * kMiB + 5;
  std::vector<unsigned char> in(n), out(n, 0xee);
  for (uint64_t i = 0; i < n; ++i) in[i] = static_cast<unsigned char>(i * 7);
  CopyCall call(n, 4096);
  call.uses[0].host = in.data();
  call.uses[1].host = out.data();
  StepResult r;
  ASSERT_TRUE((*backend)->RunCall(call, &r).ok());
  EXPECT_EQ(out, in);
  EXPECT_EQ(r.impl, "cuda_copy");
  EXPECT_EQ(r.device, (*backend)->served()[0].uuid);
  EXPECT_EQ(r.copied_h2d, n);
  EXPECT_EQ(r.copied_d2h, n);
  EXPECT_EQ(r.count_readback, 0u);
  EXPECT_EQ(r.graph, "capture");
  EXPECT_GT(r.compute, absl::ZeroDuration());
  // Same call again: the pools hand back the same blocks, so the graph replays.
  std::fill(out.begin(), out.end(), 0);
  StepResult again;
  ASSERT_TRUE((*backend)->RunCall(call, &again).ok());
  EXPECT_EQ(out, in);
  EXPECT_EQ(again.graph, "hit");
  EXPECT_EQ((*backend)->device(0).pool().stats().used, Arena::kAlignment)
      << "only the empty block stays allocated between calls";
}

TEST(GpuBackendTest, DeviceTensorsMoveNothing) {
  SKIP_WITHOUT_GPU();
  auto backend = GpuBackend::Create(SmallOptions());
  ASSERT_TRUE(backend.ok()) << backend.status();
  ASSERT_EQ(gpu::SetDevice(0), gpu::kSuccess);
  const uint64_t n = kMiB;
  DeviceBuffer in(n), out(n), out2(n);
  in.Fill(9);
  CopyCall call(n, 0);
  for (int i = 0; i < 2; ++i) {
    call.uses[i].residence = Residence::kDeviceRegion;
    call.uses[i].device_ordinal = 0;
    call.uses[i].device_uuid = (*backend)->served()[0].uuid;
  }
  call.uses[0].device = in.p;
  call.uses[1].device = out.p;
  std::vector<unsigned char> readback(n, 0);
  call.uses[0].readback = readback.data();
  StepResult r;
  ASSERT_TRUE((*backend)->RunCall(call, &r).ok());
  EXPECT_TRUE(AllEqual(out.Read(), 9));
  EXPECT_EQ(r.copied_h2d, 0u);
  EXPECT_EQ(r.copied_d2h, 0u);
  EXPECT_EQ(r.count_readback, n);
  EXPECT_TRUE(AllEqual(readback, 9));
  EXPECT_EQ(r.graph, "capture");
  call.uses[1].device = out2.p;  // new pointer: the executable graph is updated, not rebuilt
  StepResult updated;
  ASSERT_TRUE((*backend)->RunCall(call, &updated).ok());
  EXPECT_EQ(updated.graph, "update");
  EXPECT_TRUE(AllEqual(out2.Read(), 9));
  // A call naming another device than its regions' is refused.
  call.uuid = "GPU-00000000-0000-0000-0000-000000000000";
  StepResult refused;
  EXPECT_EQ((*backend)->RunCall(call, &refused).code(), absl::StatusCode::kInvalidArgument);
}

TEST(GpuBackendTest, PoolExhaustionIsResourceExhaustedAndServingGoesOn) {
  SKIP_WITHOUT_GPU();
  auto backend = GpuBackend::Create(SmallOptions());
  ASSERT_TRUE(backend.ok()) << backend.status();
  const uint64_t big = 20 * kMiB;  // in + out = 40 MiB > the 32 MiB pool
  std::vector<unsigned char> in(big, 1), out(big, 0);
  CopyCall call(big, 0);
  call.uses[0].host = in.data();
  call.uses[1].host = out.data();
  StepResult r;
  const absl::Status s = (*backend)->RunCall(call, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("out: "), std::string::npos) << s;
  EXPECT_EQ((*backend)->device(0).pool().stats().used, Arena::kAlignment) << "nothing leaked";
  const uint64_t small = kMiB;
  std::vector<unsigned char> sin(small, 5), sout(small, 0);
  CopyCall ok(small, 0);
  ok.uses[0].host = sin.data();
  ok.uses[1].host = sout.data();
  StepResult fine;
  ASSERT_TRUE((*backend)->RunCall(ok, &fine).ok());
  EXPECT_EQ(sout, sin);
}

TEST(GpuBackendTest, PinnedHostTensorsAreCopiedDirectly) {
  SKIP_WITHOUT_GPU();
  auto backend = GpuBackend::Create(SmallOptions());
  ASSERT_TRUE(backend.ok()) << backend.status();
  const uint64_t n = 2 * kMiB;
  void* raw = std::aligned_alloc(4096, 2 * n);
  ASSERT_NE(raw, nullptr);
  auto* host = static_cast<unsigned char*>(raw);
  std::memset(host, 6, n);
  std::memset(host + n, 0xaa, n);  // an output in a host region keeps untouched bytes
  HostRegionPinner pinner(std::make_shared<GpuTeardownThread>());  // Pin and Unpin only
  ASSERT_TRUE(pinner.Pin(raw, 2 * n).ok());
  CopyCall call(n, 0);
  for (int i = 0; i < 2; ++i) {
    call.uses[i].residence = Residence::kHostRegion;
    call.uses[i].pinned = true;
  }
  call.uses[1].zero_fill = false;
  call.uses[0].host = host;
  call.uses[1].host = host + n;
  StepResult r;
  ASSERT_TRUE((*backend)->RunCall(call, &r).ok());
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(host[n + i], 6) << i;
  EXPECT_EQ(r.copied_h2d, 2 * n) << "input, and the output's prior bytes";
  EXPECT_EQ(r.copied_d2h, n);
  pinner.Unpin(raw);
  std::free(raw);
}

// ---- IPC handles from another process ----

// The exporter, run as a child of IpcTest (ATTND_IPC_CHILD=1): allocates 1 MiB filled with 0x5a
// and an interprocess event, prints both handles, and keeps them alive until stdin closes.
TEST(GpuIpcChild, Export) {
  if (std::getenv("ATTND_IPC_CHILD") == nullptr) GTEST_SKIP() << "helper of GpuIpcTest";
  void* p = nullptr;
  ASSERT_EQ(gpu::Malloc(&p, kMiB), gpu::kSuccess);
  ASSERT_EQ(gpu::MemsetAsync(p, 0x5a, kMiB, nullptr), gpu::kSuccess);
  gpu::Event event = nullptr;
  ASSERT_EQ(gpu::EventCreateInterprocess(&event), gpu::kSuccess);
  ASSERT_EQ(gpu::EventRecord(event, nullptr), gpu::kSuccess);
  ASSERT_EQ(gpu::StreamSynchronize(nullptr), gpu::kSuccess);
  gpu::IpcMemHandle mem;
  ASSERT_EQ(gpu::IpcGetMemHandle(&mem, p), gpu::kSuccess);
  gpu::IpcEventHandle ev;
  ASSERT_EQ(gpu::IpcGetEventHandle(&ev, event), gpu::kSuccess);
  const std::string line =
      "HANDLES " +
      absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(&mem), sizeof(mem))) + " " +
      absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(&ev), sizeof(ev))) + "\n";
  ASSERT_EQ(write(1, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  char c;
  while (read(0, &c, 1) > 0) {
  }
  (void)gpu::EventDestroy(event);
  (void)gpu::Free(p);
}

class Exporter {
 public:
  bool Start() {
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) return false;
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    env.emplace_back("ATTND_IPC_CHILD=1");
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      execle("/proc/self/exe", "gpu_runtime_test", "--gtest_filter=GpuIpcChild.Export",
             static_cast<char*>(nullptr), envp.data());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    stdin_ = to_child[1];
    stdout_ = from_child[0];
    std::string out;
    for (;;) {
      pollfd pfd = {stdout_, POLLIN, 0};
      if (poll(&pfd, 1, 60000) <= 0) return false;
      char buf[4096];
      const ssize_t n = read(stdout_, buf, sizeof(buf));
      if (n <= 0) return false;
      out.append(buf, static_cast<size_t>(n));
      const size_t at = out.find("HANDLES ");
      if (at != std::string::npos && out.find('\n', at) != std::string::npos) {
        std::vector<std::string> parts =
            absl::StrSplit(out.substr(at + 8, out.find('\n', at) - at - 8), ' ');
        if (parts.size() != 2) return false;
        mem = absl::HexStringToBytes(parts[0]);
        event = absl::HexStringToBytes(parts[1]);
        return mem.size() == 64 && event.size() == 64;
      }
    }
  }
  ~Exporter() {
    if (stdin_ >= 0) close(stdin_);
    if (stdout_ >= 0) close(stdout_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  std::string mem, event;

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
};

TEST(GpuIpcTest, MemoryHandlesOpenOncePerAllocation) {
  SKIP_WITHOUT_GPU();
  Exporter exporter;
  ASSERT_TRUE(exporter.Start());
  auto backend = GpuBackend::Create(SmallOptions());
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto opener = std::static_pointer_cast<IpcMemOpener>((*backend)->device_opener());
  regions::DeviceRegionSpec spec;
  spec.raw_handle = exporter.mem;
  spec.device_uuid = (*backend)->served()[0].uuid.substr(4);  // bare, as torch spells it
  spec.offset = 4096;
  spec.byte_size = 8192;
  auto first = opener->Open(spec);
  ASSERT_TRUE(first.ok()) << first.status();
  spec.offset = 0;
  spec.byte_size = kMiB;
  auto second = opener->Open(spec);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*first)->base(), (*second)->base()) << "one mapping per allocation";
  EXPECT_EQ(opener->open_allocations(), 1u);
  EXPECT_EQ((*first)->device_uuid(), (*backend)->served()[0].uuid);
  if ((*first)->size() > 0) {
    EXPECT_GE((*first)->size(), kMiB);
    spec.offset = (*first)->size() - 16;
    spec.byte_size = 32;
    EXPECT_EQ(opener->Open(spec).status().code(), absl::StatusCode::kInvalidArgument);
  }
  std::vector<unsigned char> h(kMiB);
  ASSERT_EQ(gpu::SetDevice((*first)->device()), gpu::kSuccess);
  ASSERT_EQ(gpu::MemcpyD2HAsync(h.data(), (*first)->base(), kMiB, nullptr), gpu::kSuccess);
  ASSERT_EQ(gpu::StreamSynchronize(nullptr), gpu::kSuccess);
  EXPECT_TRUE(AllEqual(h, 0x5a)) << "the exporter's bytes";
  first->reset();
  EXPECT_EQ(opener->open_allocations(), 1u);
  second->reset();
  EXPECT_EQ(opener->open_allocations(), 0u) << "closed with its last region";
  // Garbage handles and unknown devices are the caller's error.
  spec.raw_handle = std::string(64, '\x01');
  spec.offset = 0;
  EXPECT_EQ(opener->Open(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.raw_handle = exporter.mem;
  spec.device_uuid = "GPU-00000000-0000-0000-0000-000000000000";
  EXPECT_EQ(opener->Open(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GpuIpcTest, ReadyEventsAreWaitedOnInStream) {
  SKIP_WITHOUT_GPU();
  Exporter exporter;
  ASSERT_TRUE(exporter.Start());
  auto backend = GpuBackend::Create(SmallOptions());
  ASSERT_TRUE(backend.ok()) << backend.status();
  GpuDevice& device = (*backend)->device(0);
  ASSERT_EQ(gpu::SetDevice(device.ordinal()), gpu::kSuccess);
  GpuDevice::StreamLease lease = device.AcquireStream();
  ASSERT_TRUE(device.events().Wait(exporter.event, lease.stream()).ok());
  ASSERT_TRUE(device.events().Wait(exporter.event, lease.stream()).ok());
  EXPECT_EQ(device.events().size(), 1u) << "opened once";
  EXPECT_EQ(gpu::StreamSynchronize(lease.stream()), gpu::kSuccess);
  EXPECT_EQ(device.events().Wait(std::string(64, '\x02'), lease.stream()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device.events().Wait("short", lease.stream()).code(),
            absl::StatusCode::kInvalidArgument);
  // Through a call: the backend waits before the op.
  const uint64_t n = 4096;
  std::vector<unsigned char> in(n, 3), out(n, 0);
  CopyCall call(n, 0);
  call.uses[0].host = in.data();
  call.uses[1].host = out.data();
  call.ready = exporter.event;
  StepResult r;
  ASSERT_TRUE((*backend)->RunCall(call, &r).ok());
  EXPECT_EQ(out, in);
}

}  // namespace
}  // namespace attnd::server::engine::gpu_rt
