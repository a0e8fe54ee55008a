#include "server/engine/gpu/ordered_queue.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/common/status.h"
#include "server/engine/backend.h"
#include "server/engine/device_select.h"
#include "server/engine/gpu/gpu_backend.h"
#include "server/engine/gpu/gpu_status.h"

#if defined(ATTND_GPU_CUDA)
#include <cuda.h>  // driver API types only: cuStreamWaitValue64 comes through the runtime
#include <cuda_runtime.h>

#include <cstring>

#include "kernels/common/gpu/ordered_gate.h"
#include "kernels/common/gpu/vendor.h"
#endif

namespace attnd::server::engine::gpu_rt {

#if !defined(ATTND_GPU_CUDA)

class OrderedRuntime {};

std::shared_ptr<OrderedRuntime> MakeOrderedRuntime(
    GpuBackend* /*backend*/, const std::function<void(const std::string&)>& /*log*/) {
  return nullptr;  // HIP: stream-ordered calls take the host-polled path
}
std::unique_ptr<DeviceOrderedQueue> NewGpuOrderedQueue(GpuBackend* /*backend*/,
                                                       std::shared_ptr<OrderedRuntime> /*rt*/) {
  return nullptr;
}

#else

namespace ko = attnd::kernels::ordered;

namespace {

using WaitValue64Fn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

absl::Status Cuda(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return GpuStatus(e, what);
}

// One cached executable parent graph: [gate] → [IF body = the op → done] (docs/SERVICE.md "The
// done store inside the body"), or [gate] → [IF body = the op] → [done], or in the enable form
// [gate] → the op → [done] (docs/SERVICE.md "Skipping a cancelled call's op"), and the op's
// workspace memsets taken out of the body: enqueued before the ready wait (docs/SERVICE.md
// "Workspace memsets before the wait").
struct OrderedGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaGraphNode_t gate = nullptr;
  cudaGraphNode_t done = nullptr;  // in the IF body when done_in_body
  cudaGraphConditionalHandle handle = 0;
  bool done_in_body = false;  // the gate is GateDoneKernel (it stores done on a cancel)
  std::vector<cudaMemsetParams> pre;
  uint64_t last_use = 0;
  // The enable form (docs/SERVICE.md "Skipping a cancelled call's op"): no conditional node; the
  // gate enables or disables `nodes`, the op's device-updatable kernel nodes, at every launch.
  bool enable = false;
  bool uploaded = false;  // a graph updated from the device is uploaded before its first launch
  ko::BodyNodes nodes{};
};

// Whether `node` is a byte memset whose every byte lies in [workspace, +bytes); *m its
// parameters then.
absl::StatusOr<bool> WorkspaceMemset(cudaGraphNode_t node, const void* workspace, int64_t bytes,
                                     cudaMemsetParams* m) {
  cudaGraphNodeType type;
  ATTND_RETURN_IF_ERROR(Cuda(cudaGraphNodeGetType(node, &type), "reading an op node"));
  if (type != cudaGraphNodeTypeMemset) return false;
  *m = cudaMemsetParams{};
  ATTND_RETURN_IF_ERROR(Cuda(cudaGraphMemsetNodeGetParams(node, m), "reading a memset"));
  if (m->elementSize != 1 || m->width == 0 || m->height == 0) return false;
  if (m->height > 1 && m->pitch < m->width) return false;
  const auto lo = reinterpret_cast<uintptr_t>(workspace);
  const uintptr_t hi = lo + static_cast<uintptr_t>(bytes);
  const auto dst = reinterpret_cast<uintptr_t>(m->dst);
  const uintptr_t span = (m->height - 1) * m->pitch + m->width;
  return dst >= lo && dst <= hi && span <= hi - dst;
}

// The nodes of `graph` (top level) into *all, and those no node depends on into *leaves.
absl::Status ListNodes(cudaGraph_t graph, std::vector<cudaGraphNode_t>* all,
                       std::vector<cudaGraphNode_t>* leaves) {
  size_t count = 0;
  ATTND_RETURN_IF_ERROR(Cuda(cudaGraphGetNodes(graph, nullptr, &count), "listing a graph"));
  all->assign(count, nullptr);
  if (count > 0) {
    ATTND_RETURN_IF_ERROR(Cuda(cudaGraphGetNodes(graph, all->data(), &count), "listing a graph"));
  }
  all->resize(count);
  leaves->clear();
  for (cudaGraphNode_t x : *all) {
    size_t n = 0;
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaGraphNodeGetDependentNodes(x, nullptr, nullptr, &n), "listing a graph"));
    if (n == 0) leaves->push_back(x);
  }
  return absl::OkStatus();
}

// Moves the body's leading byte memsets that write only inside [workspace, +bytes) into *pre, in
// order: each a root of the body (nothing of the op before it) whose every byte lies in the
// queue's workspace. The rest of the body keeps its order; a memset after any other node stays.
absl::Status HoistWorkspaceMemsets(cudaGraph_t body, const void* workspace, int64_t bytes,
                                   std::vector<cudaMemsetParams>* pre) {
  if (workspace == nullptr || bytes <= 0) return absl::OkStatus();
  for (;;) {
    size_t n = 0;
    ATTND_RETURN_IF_ERROR(Cuda(cudaGraphGetRootNodes(body, nullptr, &n), "listing the body"));
    if (n != 1) return absl::OkStatus();  // an empty body, or branches: left as captured
    cudaGraphNode_t root = nullptr;
    ATTND_RETURN_IF_ERROR(Cuda(cudaGraphGetRootNodes(body, &root, &n), "listing the body"));
    cudaMemsetParams m{};
    absl::StatusOr<bool> hoist = WorkspaceMemset(root, workspace, bytes, &m);
    if (!hoist.ok()) return hoist.status();
    if (!*hoist) return absl::OkStatus();
    pre->push_back(m);
    ATTND_RETURN_IF_ERROR(Cuda(cudaGraphDestroyNode(root), "taking a memset out of the body"));
  }
}

// The enable form's HoistWorkspaceMemsets: the op follows `gate` in the same graph, so the
// candidates are the gate's only dependent, one after another; each memset taken out hands its
// dependents to the gate (ordinary edges: a memset has no other kind).
absl::Status HoistWorkspaceMemsetsAfter(cudaGraph_t graph, cudaGraphNode_t gate,
                                        const void* workspace, int64_t bytes,
                                        std::vector<cudaMemsetParams>* pre) {
  if (workspace == nullptr || bytes <= 0) return absl::OkStatus();
  for (;;) {
    size_t n = 0;
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaGraphNodeGetDependentNodes(gate, nullptr, nullptr, &n), "listing the op"));
    if (n != 1) return absl::OkStatus();
    cudaGraphNode_t first = nullptr;
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaGraphNodeGetDependentNodes(gate, &first, nullptr, &n), "listing the op"));
    size_t ins = 0;
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaGraphNodeGetDependencies(first, nullptr, nullptr, &ins), "listing the op"));
    if (ins != 1) return absl::OkStatus();  // something else of the op comes before it
    cudaMemsetParams m{};
    absl::StatusOr<bool> hoist = WorkspaceMemset(first, workspace, bytes, &m);
    if (!hoist.ok()) return hoist.status();
    if (!*hoist) return absl::OkStatus();
    size_t outs = 0;
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaGraphNodeGetDependentNodes(first, nullptr, nullptr, &outs), "listing the op"));
    std::vector<cudaGraphNode_t> next(outs);
    if (outs > 0) {
      ATTND_RETURN_IF_ERROR(Cuda(cudaGraphNodeGetDependentNodes(first, next.data(), nullptr, &outs),
                                 "listing the op"));
    }
    pre->push_back(m);
    ATTND_RETURN_IF_ERROR(Cuda(cudaGraphDestroyNode(first), "taking a memset out of the op"));
    std::vector<cudaGraphNode_t> from(next.size(), gate);
    if (!next.empty()) {
      ATTND_RETURN_IF_ERROR(
          Cuda(cudaGraphAddDependencies(graph, from.data(), next.data(), nullptr, next.size()),
               "reconnecting the op to the gate"));
    }
  }
}

// The number of CTAs in a cluster of kernel node `node`: its launch attribute's, or the kernel's
// own (__cluster_dims__) when the launch set none; 1 without clusters; 0 when the driver does not
// say (the caller then treats the node as clustered).
unsigned ClusterSize(cudaGraphNode_t node) {
  cudaLaunchAttributeValue v{};
  if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeClusterDimension, &v) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const unsigned launched =
      std::max(v.clusterDim.x, 1u) * std::max(v.clusterDim.y, 1u) * std::max(v.clusterDim.z, 1u);
  if (launched > 1) return launched;
  cudaKernelNodeParams p{};
  cudaFuncAttributes fa{};
  if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess ||
      cudaFuncGetAttributes(&fa, p.func) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const int compiled = std::max(fa.requiredClusterWidth, 1) *
                       std::max(fa.requiredClusterHeight, 1) * std::max(fa.requiredClusterDepth, 1);
  return static_cast<unsigned>(compiled);
}

// Enqueues the memsets of HoistWorkspaceMemsets on `stream`.
absl::Status EnqueueMemsets(const std::vector<cudaMemsetParams>& pre, cudaStream_t stream) {
  for (const cudaMemsetParams& m : pre) {
    const int value = static_cast<int>(m.value & 0xff);
    const cudaError_t e = m.height == 1
                              ? cudaMemsetAsync(m.dst, value, m.width, stream)
                              : cudaMemset2DAsync(m.dst, m.pitch, value, m.width, m.height, stream);
    ATTND_RETURN_IF_ERROR(Cuda(e, "enqueueing a workspace memset"));
  }
  return absl::OkStatus();
}

}  // namespace

class OrderedRuntime {
 public:
  static constexpr size_t kSlots = 16384;  // 4,096 per queue, several queues
  static constexpr size_t kGraphs = 512;   // per backend, evicted least recently used

  OrderedRuntime(GpuBackend* backend, WaitValue64Fn wait, ko::CallWords* host_words,
                 ko::CallWords* device_words)
      : backend_(backend),
        wait_(wait),
        host_words_(host_words),
        device_words_(device_words),
        slots_(kSlots) {}
  ~OrderedRuntime() {
    absl::MutexLock lock(&mu_);
    for (auto& [key, g] : graphs_) Destroy(g);
    for (auto& [ordinal, s] : capture_streams_) (void)cudaStreamDestroy(s);
    for (auto& [ordinal, s] : watchdog_streams_) (void)cudaStreamDestroy(s);
    for (auto& [ordinal, s] : readback_streams_) (void)cudaStreamDestroy(s);
    for (auto& [ordinal, lanes] : lanes_) {
      for (Lane& l : lanes) (void)cudaStreamDestroy(l.stream);
    }
    for (auto& [ordinal, m] : mirrors_) {
      (void)cudaSetDevice(ordinal);
      (void)cudaFree(m);
    }
    (void)cudaFreeHost(host_words_);
    if (trace_ != nullptr) std::fclose(trace_);
  }

  // The trace of device-ordered calls (ATTND_ORDERED_TRACE; docs/OPERATIONS.md "Tracing
  // stream-ordered calls"): one JSON line per call that left the device, appended to `file`.
  void SetTrace(std::FILE* file) { trace_ = file; }
  // ATTND_ORDERED_KEEP_MEMSETS=1: workspace memsets stay in the conditional body (the form before
  // docs/SERVICE.md "Workspace memsets before the wait"; for A/B measurements). Set once, before
  // any queue exists.
  void KeepMemsets() { keep_memsets_ = true; }
  // ATTND_ORDERED_GATE=spin|wait: the gate's form for every call (default: spin under MPS, the
  // stream's wait otherwise; docs/SERVICE.md "The gate's two forms"). Set once, before any queue.
  enum class GateForm { kAuto, kWait, kSpin };
  void SetGateForm(GateForm f) { gate_form_ = f; }
  // ATTND_ORDERED_SPIN_NS: the spin form's sleep between two loads of the ready word.
  void SetSpinSleep(unsigned int ns) { spin_sleep_ns_ = ns; }
  // ATTND_ORDERED_SKIP=cond|enable: how a cancelled call's op is skipped (docs/SERVICE.md
  // "Skipping a cancelled call's op"): a conditional node around it (the default) or the gate
  // disabling its device-updatable kernel nodes; an op that the enable form cannot take runs
  // in the conditional form, saying so through `log`. Set once, before any queue exists.
  enum class SkipForm { kConditional, kEnable };
  void SetSkipForm(SkipForm f, std::function<void(const std::string&)> log) {
    skip_form_ = f;
    log_ = std::move(log);
  }
  // ATTND_ORDERED_DONE=body|after: where the conditional form's done store sits (docs/SERVICE.md
  // "The done store inside the body"): inside the IF body after the op (the default: 7-10 µs a
  // call less on the H200), or in a node after the conditional. Set once, before any queue exists.
  void SetDoneAfter(bool after) { done_after_ = after; }
  bool SpinGate(bool mps) const {
    return gate_form_ == GateForm::kSpin || (gate_form_ == GateForm::kAuto && mps);
  }
  bool tracing() const { return trace_ != nullptr; }
  void Trace(const std::string& line) ABSL_LOCKS_EXCLUDED(trace_mu_) {
    absl::MutexLock lock(&trace_mu_);
    std::fputs(line.c_str(), trace_);
    std::fputc('\n', trace_);
    std::fflush(trace_);
  }

  // Creates, on device `ordinal` (current) and right after its worker streams, the daemon's
  // watchdog, capture and readback streams and then `count` lanes: the streams ordered queues wait
  // and run on. Streams take the device's hardware queues in creation order, so made here,
  // together, no lane shares a queue with a worker stream or the watchdog's while the device has
  // queues enough (docs/SERVICE.md "Stream-ordered calls on a CUDA device").
  absl::Status CreateLanes(int ordinal, int count) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ATTND_RETURN_IF_ERROR(Stream(&watchdog_streams_, ordinal).status());
    ATTND_RETURN_IF_ERROR(Stream(&capture_streams_, ordinal).status());
    ATTND_RETURN_IF_ERROR(Stream(&readback_streams_, ordinal).status());
    std::vector<Lane>& lanes = lanes_[ordinal];
    for (int i = 0; i < count; ++i) {
      Lane l;
      ATTND_RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking),
                                 "creating a stream for device-ordered calls"));
      lanes.push_back(l);
    }
    return absl::OkStatus();
  }

  // The device's stream for the work count's readback copies (off the lanes: a lane's next call
  // does not wait for them).
  absl::StatusOr<cudaStream_t> ReadbackStream(int ordinal) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return Stream(&readback_streams_, ordinal);
  }

  // The lane with the fewest queues on device `ordinal` (a queue keeps it until it goes); a
  // stream of its own when the device has no lanes.
  absl::StatusOr<std::pair<cudaStream_t, int> > TakeLane(int ordinal) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = lanes_.find(ordinal);
    if (it == lanes_.end() || it->second.empty()) {
      cudaStream_t s = nullptr;
      ATTND_RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                                 "creating the queue's device stream"));
      return std::make_pair(s, -1);
    }
    std::vector<Lane>& lanes = it->second;
    size_t best = 0;
    for (size_t i = 1; i < lanes.size(); ++i) {
      if (lanes[i].queues < lanes[best].queues) best = i;
    }
    ++lanes[best].queues;
    return std::make_pair(lanes[best].stream, static_cast<int>(best));
  }
  void GiveLane(int ordinal, int lane) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = lanes_.find(ordinal);
    if (it != lanes_.end() && lane >= 0 && static_cast<size_t>(lane) < it->second.size()) {
      --it->second[static_cast<size_t>(lane)].queues;
    }
  }

  GpuBackend* backend() const { return backend_; }
  WaitValue64Fn wait() const { return wait_; }
  SlotTable& slots() { return slots_; }
  ko::CallWords* host_words(size_t i) const { return host_words_ + i; }
  ko::CallWords* device_words(size_t i) const { return device_words_ + i; }

  // A daemon stream of device `ordinal` (the current device), created on first use.
  absl::StatusOr<cudaStream_t> Stream(std::map<int, cudaStream_t>* streams, int ordinal)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = streams->find(ordinal);
    if (it != streams->end()) return it->second;
    cudaStream_t s = nullptr;
    ATTND_RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                               "creating a daemon stream for device-ordered calls"));
    (*streams)[ordinal] = s;
    return s;
  }

  // Raises the device-region word to `value` (atomicMax) on the device's watchdog stream.
  absl::Status Raise(int ordinal, void* word, uint64_t value) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ATTND_RETURN_IF_ERROR(Cuda(cudaSetDevice(ordinal), "selecting the device"));
    absl::StatusOr<cudaStream_t> s = Stream(&watchdog_streams_, ordinal);
    if (!s.ok()) return s.status();
    return Cuda(ko::LaunchRaise(static_cast<unsigned long long*>(word), value, *s),
                "raising a ready word (watchdog)");
  }

  // Sets the per-call parameters of the cached graph of `key` (building it first: gate, the op
  // captured into a conditional body, done) and launches it on `stream`. *outcome: "hit" or
  // "capture". FAILED_PRECONDITION when the op's launches cannot be captured.
  // Builds the cached graph of `key` when it is missing (before anything of the call is
  // enqueued: a capture that fails leaves the stream untouched). *outcome: "hit" or "capture".
  // *pre: the graph's workspace memsets, for the caller to enqueue before the ready wait.
  absl::Status Ensure(OpCall& call, const kernels::ExecContext& ctx, const std::vector<void*>& data,
                      const std::string& key, std::string* impl, std::string* outcome,
                      std::vector<cudaMemsetParams>* pre) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    *outcome = "hit";
    auto it = graphs_.find(key);
    if (it != graphs_.end()) {
      *pre = it->second.pre;
      return absl::OkStatus();
    }
    if (graphs_.size() >= kGraphs) Evict();
    OrderedGraph g;
    bool refused = false;  // the op's own refusal (bad arguments): the call's answer
    absl::Status built = Build(call, ctx, data, &g, impl, &refused);
    if (!built.ok()) {
      Destroy(g);
      if (refused || built.code() == absl::StatusCode::kUnavailable) return built;
      // Not capturable into a conditional body (a launch attribute, a node type the body does
      // not accept): the host-polled path serves the call.
      return absl::FailedPreconditionError(
          absl::StrCat(call.op(), ": no device-ordered graph: ", built.message()));
    }
    g.last_use = ++clock_;
    *pre = g.pre;
    graphs_.emplace(key, g);
    *outcome = "capture";
    return absl::OkStatus();
  }

  // `spin`: the ready word the gate spins on (the spin form; nullptr: the stream waited).
  absl::Status Launch(OpCall& call, kernels::ExecContext ctx, const std::vector<void*>& data,
                      const std::string& key, size_t slot, void* done, uint64_t done_value,
                      const void* spin, uint64_t spin_value, cudaStream_t stream, std::string* impl,
                      std::string* outcome, bool* enable_form, bool* done_in_body)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<uint32_t*> mirrors = Mirrors(ctx.device);
    if (!mirrors.ok()) return mirrors.status();
    auto it = graphs_.find(key);
    *outcome = "hit";
    if (it == graphs_.end()) {  // evicted since Ensure by another queue's calls
      if (graphs_.size() >= kGraphs) Evict();
      OrderedGraph g;
      bool refused = false;
      absl::Status built = Build(call, ctx, data, &g, impl, &refused);
      if (!built.ok()) {
        Destroy(g);
        return built;
      }
      it = graphs_.emplace(key, g).first;
      *outcome = "capture";
    }
    OrderedGraph& g = it->second;
    g.last_use = ++clock_;
    *enable_form = g.enable;
    *done_in_body = g.done_in_body;
    ko::CallWords* words = device_words(slot);
    uint32_t* mirror = *mirrors + slot;
    cudaGraphConditionalHandle handle = g.handle;
    const void* ready = spin;
    unsigned long long ready_value = spin_value;
    unsigned int sleep_ns = spin_sleep_ns_;
    ko::BodyNodes nodes = g.nodes;
    unsigned long long done_ull = done_value;
    void* done_ptr = done;
    void* cond_args[] = {&handle, &words, &mirror, &ready, &ready_value, &sleep_ns};
    void* in_args[] = {&handle,      &words,    &mirror,   &ready,
                       &ready_value, &sleep_ns, &done_ptr, &done_ull};
    void* enable_args[] = {&nodes, &words, &mirror, &ready, &ready_value, &sleep_ns};
    cudaKernelNodeParams gp = g.enable         ? KernelParams(ko::GateEnableKernel(), enable_args)
                              : g.done_in_body ? KernelParams(ko::GateDoneKernel(), in_args)
                                               : KernelParams(ko::GateKernel(), cond_args);
    void* done_args[] = {&done_ptr, &done_ull, &words, &mirror};
    cudaKernelNodeParams dp = KernelParams(ko::DoneKernel(), done_args);
    // Only future launches see the new parameters: launches already enqueued keep theirs
    // (docs/SERVICE.md "Stream-ordered calls on a CUDA device").
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaGraphExecKernelNodeSetParams(g.exec, g.gate, &gp), "setting the gate"));
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaGraphExecKernelNodeSetParams(g.exec, g.done, &dp), "setting the done store"));
    if (g.enable && !g.uploaded) {  // in stream order, before the first launch
      ATTND_RETURN_IF_ERROR(
          Cuda(cudaGraphUpload(g.exec, stream), "uploading the device-ordered graph"));
      g.uploaded = true;
    }
    return Cuda(cudaGraphLaunch(g.exec, stream), "launching the device-ordered graph");
  }

 private:
  static cudaKernelNodeParams KernelParams(const void* fn, void** args) {
    cudaKernelNodeParams p{};
    p.func = const_cast<void*>(fn);
    p.gridDim = dim3(1, 1, 1);
    p.blockDim = dim3(1, 1, 1);
    p.sharedMemBytes = 0;
    p.kernelParams = args;
    p.extra = nullptr;
    return p;
  }

  static void Destroy(OrderedGraph& g) {
    // An executable graph still in flight is freed when its launches complete
    // (cudaGraphExecDestroy).
    if (g.exec != nullptr) (void)cudaGraphExecDestroy(g.exec);
    if (g.graph != nullptr) (void)cudaGraphDestroy(g.graph);
    g = OrderedGraph();
  }

  void Evict() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto oldest = graphs_.begin();
    for (auto i = graphs_.begin(); i != graphs_.end(); ++i) {
      if (i->second.last_use < oldest->second.last_use) oldest = i;
    }
    if (oldest != graphs_.end()) {
      Destroy(oldest->second);
      graphs_.erase(oldest);
    }
  }

  // Device `ordinal`'s copies of the calls' state words (one per slot, device memory: the done
  // kernel reads its call's there, not across the bus). Made on first use, the device current.
  absl::StatusOr<uint32_t*> Mirrors(int ordinal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = mirrors_.find(ordinal);
    if (it != mirrors_.end()) return it->second;
    void* m = nullptr;
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaMalloc(&m, kSlots * sizeof(uint32_t)), "allocating the gate's state words"));
    mirrors_[ordinal] = static_cast<uint32_t*>(m);
    return static_cast<uint32_t*>(m);
  }

  // The op's launches captured into `graph` (after `after`, or as its roots when null) on the
  // device's capture stream, used for nothing else. The op's own error is returned, with
  // *refused when it is the call's answer (bad arguments); the capture's end in *end.
  absl::Status CaptureOp(OpCall& call, kernels::ExecContext ctx, const std::vector<void*>& data,
                         cudaGraph_t graph, const cudaGraphNode_t* after, std::string* impl,
                         bool* refused, cudaError_t* end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<cudaStream_t> cs = Stream(&capture_streams_, ctx.device);
    if (!cs.ok()) return cs.status();
    ctx.stream = *cs;
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaStreamBeginCaptureToGraph(*cs, graph, after, nullptr, after != nullptr ? 1 : 0,
                                           cudaStreamCaptureModeThreadLocal),
             "capturing the op"));
    const absl::Status run = call.Run(ctx, data, impl);
    cudaGraph_t captured = nullptr;
    *end = cudaStreamEndCapture(*cs, &captured);
    if (!run.ok()) {
      (void)cudaGetLastError();
      *refused = run.code() != absl::StatusCode::kInternal && *end == cudaSuccess;
      return run;
    }
    return absl::OkStatus();
  }

  absl::Status Build(OpCall& call, kernels::ExecContext ctx, const std::vector<void*>& data,
                     OrderedGraph* g, std::string* impl, bool* refused)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (skip_form_ == SkipForm::kEnable) {
      std::string why;
      const absl::Status built = BuildEnable(call, ctx, data, g, impl, refused, &why);
      if (built.ok() || why.empty()) return built;  // built, or the op's own error
      Destroy(*g);
      // Once per op and reason: a model's layers build one graph each, for the same reason.
      if (log_ && fallbacks_logged_.insert(absl::StrCat(call.op(), "|", why)).second) {
        log_(absl::StrCat("device-ordered graphs of ", call.op(), ": ", why,
                          ": its op is skipped by a conditional node instead (logged once)"));
      }
    }
    if (!done_after_ && !body_refused_) {
      std::string why;
      const absl::Status built =
          BuildConditional(call, ctx, data, g, impl, refused, /*done_in_body=*/true, &why);
      if (built.ok() || why.empty()) return built;  // built, or the op's own error
      Destroy(*g);
      body_refused_ = true;  // the driver's answer holds for every later graph too
      if (log_ && fallbacks_logged_.insert(absl::StrCat(call.op(), "|", why)).second) {
        log_(absl::StrCat("device-ordered graphs of ", call.op(), ": ", why,
                          ": its done store follows the conditional node instead (logged once)"));
      }
    }
    std::string unused;
    return BuildConditional(call, ctx, data, g, impl, refused, /*done_in_body=*/false, &unused);
  }

  // The enable form: [gate] → the op's launches, captured right after it in the same graph, each
  // kernel node made device-updatable → [done]. OK, or the op's own error (with `why` empty), or
  // a reason in `why` (with an error status) when the op's launches do not suit the form: a node
  // that is not a kernel (it could not be skipped), a programmatic edge out of the gate (the op
  // could start before the gate's decision), more than ko::kMaxBodyNodes kernels, a kernel
  // launched in clusters (or whose cluster size is unknown), a kernel node the driver will not
  // make device-updatable.
  absl::Status BuildEnable(OpCall& call, kernels::ExecContext ctx, const std::vector<void*>& data,
                           OrderedGraph* g, std::string* impl, bool* refused, std::string* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ATTND_RETURN_IF_ERROR(Cuda(cudaGraphCreate(&g->graph, 0), "creating a graph"));
    ko::CallWords* words = device_words(0);
    absl::StatusOr<uint32_t*> mirrors = Mirrors(ctx.device);
    if (!mirrors.ok()) return mirrors.status();
    uint32_t* mirror = *mirrors;
    const void* ready = nullptr;
    unsigned long long ready_value = 0;
    unsigned int sleep_ns = 0;
    ko::BodyNodes nodes{};
    void* gate_args[] = {&nodes, &words, &mirror, &ready, &ready_value, &sleep_ns};
    cudaKernelNodeParams gp = KernelParams(ko::GateEnableKernel(), gate_args);
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaGraphAddKernelNode(&g->gate, g->graph, nullptr, 0, &gp), "adding the gate"));
    cudaError_t end = cudaSuccess;
    ATTND_RETURN_IF_ERROR(CaptureOp(call, ctx, data, g->graph, &g->gate, impl, refused, &end));
    auto unsuitable = [why](std::string reason) {
      *why = std::move(reason);
      return absl::FailedPreconditionError(*why);
    };
    if (end != cudaSuccess) {
      (void)cudaGetLastError();
      return unsuitable(
          absl::StrCat("its launches cannot be captured (", cudaGetErrorString(end), ")"));
    }
    if (!keep_memsets_) {
      ATTND_RETURN_IF_ERROR(HoistWorkspaceMemsetsAfter(g->graph, g->gate, ctx.workspace,
                                                       ctx.workspace_bytes, &g->pre));
    }
    size_t outs = 0;
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaGraphNodeGetDependentNodes(g->gate, nullptr, nullptr, &outs), "listing the op"));
    std::vector<cudaGraphNode_t> firsts(outs);
    std::vector<cudaGraphEdgeData> edges(outs);
    if (outs > 0) {
      ATTND_RETURN_IF_ERROR(
          Cuda(cudaGraphNodeGetDependentNodes(g->gate, firsts.data(), edges.data(), &outs),
               "listing the op"));
    }
    for (const cudaGraphEdgeData& e : edges) {
      if (e.type != cudaGraphDependencyTypeDefault || e.from_port != 0) {
        return unsuitable("a programmatic edge follows the gate");
      }
    }
    std::vector<cudaGraphNode_t> all, leaves;
    ATTND_RETURN_IF_ERROR(ListNodes(g->graph, &all, &leaves));
    for (cudaGraphNode_t x : all) {
      if (x == g->gate) continue;
      cudaGraphNodeType type;
      ATTND_RETURN_IF_ERROR(Cuda(cudaGraphNodeGetType(x, &type), "reading an op node"));
      if (type != cudaGraphNodeTypeKernel) {
        return unsuitable(absl::StrCat("a node of type ", static_cast<int>(type),
                                       " (not a kernel) in its launches"));
      }
      if (nodes.count == ko::kMaxBodyNodes) {
        return unsuitable(absl::StrCat("more than ", ko::kMaxBodyNodes, " kernels"));
      }
      // A kernel launched in clusters: made device-updatable it ran cluster-size times its grid
      // (docs/SERVICE.md "Skipping a cancelled call's op"), so it stays with the conditional form.
      const unsigned cluster = ClusterSize(x);
      if (cluster == 0) {
        return unsuitable("a kernel node whose cluster size the driver does not say");
      }
      if (cluster > 1) {
        return unsuitable(absl::StrCat("a kernel launched in clusters of ", cluster));
      }
      cudaLaunchAttributeValue v{};
      v.deviceUpdatableKernelNode.deviceUpdatable = 1;
      cudaError_t e =
          cudaGraphKernelNodeSetAttribute(x, cudaLaunchAttributeDeviceUpdatableKernelNode, &v);
      cudaLaunchAttributeValue got{};
      if (e == cudaSuccess) {
        e = cudaGraphKernelNodeGetAttribute(x, cudaLaunchAttributeDeviceUpdatableKernelNode, &got);
      }
      if (e != cudaSuccess || got.deviceUpdatableKernelNode.devNode == nullptr) {
        (void)cudaGetLastError();
        return unsuitable(absl::StrCat(
            "a kernel node that cannot be made device-updatable (",
            e != cudaSuccess ? cudaGetErrorString(e) : "the driver returned no handle", ")"));
      }
      nodes.node[nodes.count++] = got.deviceUpdatableKernelNode.devNode;
    }
    gp = KernelParams(ko::GateEnableKernel(), gate_args);  // gate_args[0]: `nodes`, now filled
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaGraphKernelNodeSetParams(g->gate, &gp), "setting the gate's nodes"));
    unsigned long long zero = 0;
    void* done_ptr = &words->scratch;
    void* done_args[] = {&done_ptr, &zero, &words, &mirror};
    cudaKernelNodeParams dp = KernelParams(ko::DoneKernel(), done_args);
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaGraphAddKernelNode(&g->done, g->graph, leaves.data(), leaves.size(), &dp),
             "adding the done store"));
    const cudaError_t ie = cudaGraphInstantiate(&g->exec, g->graph, 0);
    if (ie != cudaSuccess) {
      (void)cudaGetLastError();
      return unsuitable(absl::StrCat("instantiating it failed (", cudaGetErrorString(ie), ")"));
    }
    g->enable = true;
    g->nodes = nodes;
    return absl::OkStatus();
  }

  // The conditional form: [gate] → [IF body = the op → done] with done_in_body, else [gate] →
  // [IF body = the op] → [done]. OK, or the op's own error (with `why` empty), or, only with
  // done_in_body, a reason in `why` (with an error status) when the driver will not set the
  // parameters of a kernel node inside the body of the instantiated graph, which every launch
  // does for the done store.
  absl::Status BuildConditional(OpCall& call, kernels::ExecContext ctx,
                                const std::vector<void*>& data, OrderedGraph* g, std::string* impl,
                                bool* refused, bool done_in_body, std::string* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ATTND_RETURN_IF_ERROR(Cuda(cudaGraphCreate(&g->graph, 0), "creating a graph"));
    ATTND_RETURN_IF_ERROR(Cuda(cudaGraphConditionalHandleCreate(&g->handle, g->graph, 0, 0),
                               "creating a conditional handle"));
    ko::CallWords* words = device_words(0);
    absl::StatusOr<uint32_t*> mirrors = Mirrors(ctx.device);
    if (!mirrors.ok()) return mirrors.status();
    uint32_t* mirror = *mirrors;
    const void* ready = nullptr;
    unsigned long long ready_value = 0;
    unsigned int sleep_ns = 0;
    unsigned long long zero = 0;
    void* done_ptr = &words->scratch;
    cudaGraphConditionalHandle handle = g->handle;
    void* gate_args[] = {&handle, &words, &mirror, &ready, &ready_value, &sleep_ns};
    void* in_args[] = {&handle, &words, &mirror, &ready, &ready_value, &sleep_ns, &done_ptr, &zero};
    cudaKernelNodeParams gp = done_in_body ? KernelParams(ko::GateDoneKernel(), in_args)
                                           : KernelParams(ko::GateKernel(), gate_args);
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaGraphAddKernelNode(&g->gate, g->graph, nullptr, 0, &gp), "adding the gate"));
    cudaGraphNodeParams cp{};
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = g->handle;
    cp.conditional.type = cudaGraphCondTypeIf;
    cp.conditional.size = 1;
    cudaGraphNode_t cond = nullptr;
    ATTND_RETURN_IF_ERROR(Cuda(cudaGraphAddNode(&cond, g->graph, &g->gate, nullptr, 1, &cp),
                               "adding the conditional node"));
    cudaGraph_t body = cp.conditional.phGraph_out[0];
    cudaError_t end = cudaSuccess;
    ATTND_RETURN_IF_ERROR(CaptureOp(call, ctx, data, body, nullptr, impl, refused, &end));
    if (end != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::FailedPreconditionError(
          absl::StrCat(call.op(), ": its launches cannot be captured into a conditional body (",
                       cudaGetErrorString(end), ")"));
    }
    if (!keep_memsets_) {
      ATTND_RETURN_IF_ERROR(
          HoistWorkspaceMemsets(body, ctx.workspace, ctx.workspace_bytes, &g->pre));
    }
    void* done_args[] = {&done_ptr, &zero, &words, &mirror};
    cudaKernelNodeParams dp = KernelParams(ko::DoneKernel(), done_args);
    if (done_in_body) {
      // After every leaf of the op: the body's nodes that nothing follows.
      std::vector<cudaGraphNode_t> all, leaves;
      ATTND_RETURN_IF_ERROR(ListNodes(body, &all, &leaves));
      ATTND_RETURN_IF_ERROR(
          Cuda(cudaGraphAddKernelNode(&g->done, body, leaves.data(), leaves.size(), &dp),
               "adding the done store to the body"));
    } else {
      ATTND_RETURN_IF_ERROR(
          Cuda(cudaGraphAddKernelNode(&g->done, g->graph, &cond, 1, &dp), "adding the done store"));
    }
    ATTND_RETURN_IF_ERROR(Cuda(cudaGraphInstantiate(&g->exec, g->graph, 0),
                               "instantiating the device-ordered graph"));
    if (done_in_body) {
      // Every launch sets the body's done node; a driver that refuses that for a node inside a
      // conditional body gets the form with the done store after the conditional.
      const cudaError_t e = cudaGraphExecKernelNodeSetParams(g->exec, g->done, &dp);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *why = absl::StrCat("the driver does not set a kernel node inside a conditional body (",
                            cudaGetErrorString(e), ")");
        return absl::FailedPreconditionError(*why);
      }
      g->done_in_body = true;
    }
    return absl::OkStatus();
  }

  GpuBackend* const backend_;
  const WaitValue64Fn wait_;
  std::FILE* trace_ = nullptr;                   // set once, before any queue exists
  bool keep_memsets_ = false;                    // set once, before any queue exists
  GateForm gate_form_ = GateForm::kAuto;         // set once, before any queue exists
  unsigned int spin_sleep_ns_ = 64;              // set once, before any queue exists
  SkipForm skip_form_ = SkipForm::kConditional;  // set once, before any queue exists
  bool done_after_ = false;                      // set once, before any queue exists
  std::function<void(const std::string&)> log_;  // set with skip_form_
  absl::Mutex trace_mu_;
  ko::CallWords* const host_words_;
  ko::CallWords* const device_words_;
  SlotTable slots_;
  absl::Mutex mu_;
  std::map<std::string, OrderedGraph> graphs_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> fallbacks_logged_ ABSL_GUARDED_BY(mu_);  // op and reason
  bool body_refused_ ABSL_GUARDED_BY(mu_) = false;  // the driver refused a node inside a body
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, cudaStream_t> capture_streams_ ABSL_GUARDED_BY(mu_);
  std::map<int, cudaStream_t> watchdog_streams_ ABSL_GUARDED_BY(mu_);
  std::map<int, cudaStream_t> readback_streams_ ABSL_GUARDED_BY(mu_);
  std::map<int, uint32_t*> mirrors_ ABSL_GUARDED_BY(mu_);
  struct Lane {
    cudaStream_t stream = nullptr;
    int queues = 0;
  };
  std::map<int, std::vector<Lane> > lanes_ ABSL_GUARDED_BY(mu_);
};

namespace {

// A queue's stream on one device (a lane of the runtime's, or its own when the device has no
// lanes); every pending call holds it.
struct QueueStream {
  std::shared_ptr<OrderedRuntime> rt;
  int ordinal = -1;
  int lane = -1;  // -1: a stream of its own
  cudaStream_t stream = nullptr;

  // The queue's op workspace, reused by every call (docs/SERVICE.md "Stream-ordered calls on a
  // CUDA device": one workspace per queue). Calls on one stream run in order, so each may use it
  // whole; a call holds a reference until it completes, so a larger replacement never frees a
  // block that enqueued work still uses. A stable address keeps the call's graph key, and so its
  // captured graph, the same from one call to the next.
  absl::StatusOr<std::shared_ptr<PoolBlock> > Workspace(MemoryPool& pool, int64_t bytes) {
    absl::MutexLock lock(&mu);
    if (workspace != nullptr && &pool == workspace_pool &&
        workspace->size() >= static_cast<uint64_t>(bytes)) {
      return workspace;
    }
    absl::StatusOr<PoolBlock> block = pool.Allocate(static_cast<uint64_t>(bytes));
    if (!block.ok()) return block.status();
    workspace = std::make_shared<PoolBlock>(*std::move(block));
    workspace_pool = &pool;
    return workspace;
  }
  absl::Mutex mu;
  std::shared_ptr<PoolBlock> workspace ABSL_GUARDED_BY(mu);
  const MemoryPool* workspace_pool ABSL_GUARDED_BY(mu) = nullptr;
  ~QueueStream() {
    if (lane >= 0) {
      rt->GiveLane(ordinal, lane);
    } else if (stream != nullptr) {
      // Work still enqueued completes; the stream's resources go after it (cudaStreamDestroy).
      (void)cudaStreamDestroy(stream);
    }
  }
};

class GpuOrderedCall : public DeviceOrderedCall {
 public:
  GpuOrderedCall(std::shared_ptr<OrderedRuntime> rt, std::shared_ptr<QueueStream> qs, size_t slot)
      : rt_(std::move(rt)), qs_(std::move(qs)), slot_(slot) {}
  ~GpuOrderedCall() override {
    // Only after Poll() left kPending (or nothing was enqueued): the slot and blocks are free.
    for (cudaEvent_t e : {stop_, complete_}) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    if (slot_taken_) rt_->slots().Give(slot_);
  }

  DeviceCallState Poll() override {
    if (state_ != DeviceCallState::kPending) return state_;
    const cudaError_t q = cudaEventQuery(complete_);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return state_;
    }
    if (q != cudaSuccess) {
      error_ = Cuda(q, absl::StrCat("running ", op_, " (device-ordered) on ", result_.device));
      state_ = DeviceCallState::kFailed;
      return state_;
    }
    const ko::CallWords* w = rt_->host_words(slot_);
    const uint32_t s = __atomic_load_n(&w->state, __ATOMIC_ACQUIRE);
    state_ = s == ko::kStateRan ? DeviceCallState::kRan : DeviceCallState::kSkipped;
    if (s == ko::kStateUpdateFailed) {  // the enable form's gate; done has the failure bit
      error_ = absl::InternalError(absl::StrCat(
          op_, " (device-ordered) on ", result_.device,
          ": the gate could not enable or disable the op's kernel nodes (a device-side graph "
          "update failed), so whether the op ran is unknown"));
      state_ = DeviceCallState::kFailed;
    }
    if (state_ == DeviceCallState::kRan) {
      // %globaltimer from the gate's decision to the done kernel's start: the op and the
      // conditional node around it (docs/SERVICE.md "Timestamps").
      const uint64_t gate_ns = __atomic_load_n(&w->gate_ns, __ATOMIC_ACQUIRE);
      const uint64_t done_ns = __atomic_load_n(&w->done_ns, __ATOMIC_ACQUIRE);
      if (gate_ns != 0 && done_ns >= gate_ns) {
        result_.compute = absl::Nanoseconds(static_cast<int64_t>(done_ns - gate_ns));
      }
      for (const Readback& r : readbacks_) std::memcpy(r.to, r.block.data(), r.n);
    }
    if (rt_->tracing()) {
      rt_->Trace(absl::StrCat(
          "{\"op\":\"", op_, "\",\"slot\":", slot_,
          ",\"ready\":", ready_.present ? ready_.value : 0, ",\"done\":", done_value_,
          ",\"state\":\"", state_ == DeviceCallState::kRan ? "ran" : "skipped",
          "\",\"wait_ns\":", __atomic_load_n(&w->wait_ns, __ATOMIC_ACQUIRE),
          ",\"gate_ns\":", __atomic_load_n(&w->gate_ns, __ATOMIC_ACQUIRE),
          ",\"done_ns\":", __atomic_load_n(&w->done_ns, __ATOMIC_ACQUIRE),
          ",\"compute_us\":", absl::ToDoubleMicroseconds(result_.compute),
          ",\"pre_memsets\":", result_.pre_memsets, ",\"gate\":\"", result_.gate, "\",\"skip\":\"",
          result_.skip, "\",\"done_at\":\"", result_.done_at, "\"}"));
    }
    readbacks_.clear();
    staged_.clear();
    workspace_.reset();  // the queue's block: freed once the queue and its calls let go
    return state_;
  }

  bool Gated() const override {
    return __atomic_load_n(&rt_->host_words(slot_)->state, __ATOMIC_ACQUIRE) != ko::kStateNotGated;
  }

  void SetCancel() override {
    __atomic_store_n(&rt_->host_words(slot_)->control, ko::kControlCancel, __ATOMIC_SEQ_CST);
  }

  absl::Status Release() override {
    if (!ready_.present) return absl::OkStatus();
    if (ready_.host_address != nullptr) {
      uint64_t cur = __atomic_load_n(ready_.host_address, __ATOMIC_ACQUIRE);
      while (cur < ready_.value &&
             !__atomic_compare_exchange_n(ready_.host_address, &cur, ready_.value, false,
                                          __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
      }
      return absl::OkStatus();
    }
    return rt_->Raise(qs_->ordinal, ready_.device_address, ready_.value);
  }

  absl::Status error() const override { return error_; }
  void Result(StepResult* result) const override { *result = result_; }

 private:
  friend class GpuOrderedQueue;
  struct Readback {
    void* to;
    PoolBlock block;
    uint64_t n;
  };
  struct Staged {  // an inline input: its device block and its pinned staging
    PoolBlock device;
    PoolBlock host;
    uint64_t n;
  };
  std::shared_ptr<OrderedRuntime> rt_;
  std::shared_ptr<QueueStream> qs_;
  const size_t slot_;
  bool slot_taken_ = true;
  DeviceSignal ready_;
  uint64_t done_value_ = 0;
  std::string op_;
  cudaEvent_t stop_ = nullptr;  // only with readbacks: the op's end, for the readback stream
  cudaEvent_t complete_ = nullptr;
  std::shared_ptr<PoolBlock> workspace_;  // the queue's (QueueStream::Workspace)
  std::vector<Staged> staged_;
  std::vector<Readback> readbacks_;
  StepResult result_;
  DeviceCallState state_ = DeviceCallState::kPending;
  absl::Status error_;
};

class GpuOrderedQueue : public DeviceOrderedQueue {
 public:
  GpuOrderedQueue(GpuBackend* backend, std::shared_ptr<OrderedRuntime> rt)
      : backend_(backend), rt_(std::move(rt)) {}

  absl::StatusOr<std::unique_ptr<DeviceOrderedCall> > Enqueue(OpCall& call,
                                                              const DeviceSignal& ready,
                                                              const DeviceSignal& done) override {
    if (!DevicePathEligible(call.tensors())) {
      return absl::FailedPreconditionError(
          "not every tensor is in a device region or an inline input");
    }
    absl::StatusOr<size_t> index =
        SelectDevice(call.tensors(), call.device_uuid(), backend_->served());
    if (!index.ok()) return index.status();
    GpuDevice& device = backend_->device(*index);
    ATTND_RETURN_IF_ERROR(device.CheckUsable());
    ATTND_RETURN_IF_ERROR(Cuda(cudaSetDevice(device.ordinal()), "selecting the device"));
    absl::StatusOr<std::shared_ptr<QueueStream> > qs = StreamFor(device.ordinal());
    if (!qs.ok()) return qs.status();
    const cudaStream_t stream = (*qs)->stream;

    absl::StatusOr<size_t> slot = rt_->slots().Take();
    if (!slot.ok()) return slot.status();
    auto c = std::make_unique<GpuOrderedCall>(rt_, *qs, *slot);
    c->op_ = std::string(call.op());
    c->result_.device = device.uuid();
    ko::CallWords* w = rt_->host_words(*slot);
    __atomic_store_n(&w->control, ko::kControlRun, __ATOMIC_RELAXED);
    for (uint64_t* stamp : {&w->gate_ns, &w->done_ns, &w->wait_ns}) {
      __atomic_store_n(stamp, uint64_t{0}, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&w->state, ko::kStateNotGated, __ATOMIC_RELEASE);

    kernels::ExecContext ctx;
    ctx.backend = kernels::Backend::kCuda;
    ctx.stream = stream;
    ctx.device = device.ordinal();
    // Inline inputs: copied into pinned staging now (the request's bytes are complete at
    // accept), into device pool blocks by the stream before its wait.
    std::vector<void*> data;
    for (const TensorUse& t : call.tensors()) {
      if (t.span_bytes == 0) {
        data.push_back(device.empty_block());
        continue;
      }
      if (t.residence == Residence::kDeviceRegion) {
        data.push_back(t.device);
        continue;
      }
      if (backend_->staging() == nullptr) {
        return absl::FailedPreconditionError("no pinned staging for inline inputs");
      }
      absl::StatusOr<PoolBlock> d = device.pool().Allocate(t.span_bytes);
      if (!d.ok()) return d.status();
      absl::StatusOr<PoolBlock> h = backend_->staging()->Allocate(t.span_bytes);
      if (!h.ok()) return h.status();
      std::memcpy(h->data(), t.host, t.span_bytes);
      data.push_back(d->data());
      c->staged_.push_back({*std::move(d), *std::move(h), t.span_bytes});
      c->result_.copied_h2d += t.span_bytes;
    }
    std::string impl;
    int64_t workspace_bytes = 0;
    ATTND_RETURN_IF_ERROR(call.Select(ctx, data, &impl, &workspace_bytes));
    if (workspace_bytes > 0) {
      absl::StatusOr<std::shared_ptr<PoolBlock> > ws =
          (*qs)->Workspace(device.pool(), workspace_bytes);
      if (!ws.ok()) return ws.status();
      c->workspace_ = *std::move(ws);
      ctx.workspace = c->workspace_->data();
      ctx.workspace_bytes = workspace_bytes;
    }
    // Readbacks of the work count's index tensors: async copies into pinned staging, moved to
    // the call's buffers at completion.
    for (const TensorUse& t : call.tensors()) {
      if (t.readback == nullptr || t.span_bytes == 0) continue;
      if (backend_->staging() == nullptr) {
        return absl::FailedPreconditionError("no pinned staging for the work count's readback");
      }
      absl::StatusOr<PoolBlock> b = backend_->staging()->Allocate(t.span_bytes);
      if (!b.ok()) return b.status();
      c->readbacks_.push_back({t.readback, *std::move(b), t.span_bytes});
    }
    std::string key = call.LaunchKey();
    absl::StrAppend(&key, "|impl=", impl, "|ws=", ctx.workspace_bytes, "|dev=", device.ordinal());
    for (void* p : data) absl::StrAppend(&key, "|", reinterpret_cast<uintptr_t>(p));
    absl::StrAppend(&key, "|", reinterpret_cast<uintptr_t>(ctx.workspace));

    // No timing events on the lane: the op's time is the gate's and the done kernel's stamps.
    ATTND_RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&c->complete_, cudaEventDisableTiming),
                               "creating the completion event"));

    // Resolve the signal words' device addresses before anything is enqueued.
    DeviceSignal r = ready;
    if (r.present && r.device_address == nullptr) {
      if (cudaHostGetDevicePointer(&r.device_address, r.host_address, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return absl::FailedPreconditionError("the ready word's host region is not pinned");
      }
    }
    void* done_address = &rt_->device_words(*slot)->scratch;  // no done: a daemon scratch word
    if (done.present) {
      done_address = done.device_address;
      if (done_address == nullptr) {
        if (cudaHostGetDevicePointer(&done_address, done.host_address, 0) != cudaSuccess) {
          (void)cudaGetLastError();
          return absl::FailedPreconditionError("the done word's host region is not pinned");
        }
      }
    }
    c->ready_ = r;
    c->done_value_ = done.present ? done.value : 0;
    std::string outcome;
    std::vector<cudaMemsetParams> pre;
    ATTND_RETURN_IF_ERROR(rt_->Ensure(call, ctx, data, key, &impl, &outcome, &pre));
    // The op's workspace memsets: the queue's workspace is its calls' alone and the lane runs
    // them in order, so these wait only for the previous call, never for ready.
    ATTND_RETURN_IF_ERROR(EnqueueMemsets(pre, stream));
    c->result_.pre_memsets = static_cast<int>(pre.size());
    for (const GpuOrderedCall::Staged& st : c->staged_) {
      ATTND_RETURN_IF_ERROR(Cuda(
          cudaMemcpyAsync(st.device.data(), st.host.data(), st.n, cudaMemcpyHostToDevice, stream),
          "copying an inline input to the device"));
    }
    if (!call.ready_event().empty()) {
      ATTND_RETURN_IF_ERROR(device.events().Wait(call.ready_event(), stream));
    }
    // The gate's spin form under MPS, the stream's wait otherwise (docs/SERVICE.md "The gate's
    // two forms").
    const bool spin = r.present && rt_->SpinGate(device.description().mps);
    c->result_.gate = !r.present ? "" : spin ? "spin" : "wait";
    if (r.present && !spin) {
      const CUresult cr = rt_->wait()(reinterpret_cast<CUstream>(stream),
                                      reinterpret_cast<CUdeviceptr>(r.device_address), r.value,
                                      CU_STREAM_WAIT_VALUE_GEQ);
      if (cr != CUDA_SUCCESS) {
        return absl::InternalError(
            absl::StrCat("cuStreamWaitValue64 on the ready word failed (CUresult ", cr, ")"));
      }
    }
    if (rt_->tracing() && !spin) {
      ATTND_RETURN_IF_ERROR(Cuda(
          ko::LaunchStamp(reinterpret_cast<unsigned long long*>(&rt_->device_words(*slot)->wait_ns),
                          stream),
          "stamping the end of the ready wait (trace)"));
    }
    std::string unused;
    bool enable_form = false, done_in_body = false;
    ATTND_RETURN_IF_ERROR(rt_->Launch(call, ctx, data, key, *slot, done_address,
                                      done.present ? done.value : 0,
                                      spin ? r.device_address : nullptr, spin ? r.value : 0, stream,
                                      &impl, &unused, &enable_form, &done_in_body));
    c->result_.skip = enable_form ? "enable" : "cond";
    c->result_.done_at = enable_form ? "" : done_in_body ? "body" : "after";
    // The readback copies run on the device's readback stream after the op (stop_), so the
    // lane's next call need not wait for them; the completion event follows them there.
    cudaStream_t tail = stream;
    if (!c->readbacks_.empty()) {
      ATTND_RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&c->stop_, cudaEventDisableTiming),
                                 "creating the readback's event"));
      ATTND_RETURN_IF_ERROR(Cuda(cudaEventRecord(c->stop_, stream), "recording the stop event"));
      absl::StatusOr<cudaStream_t> rs = rt_->ReadbackStream(device.ordinal());
      if (!rs.ok()) return rs.status();
      tail = *rs;
      ATTND_RETURN_IF_ERROR(
          Cuda(cudaStreamWaitEvent(tail, c->stop_, 0), "ordering the readback after the op"));
    }
    const std::vector<TensorUse>& uses = call.tensors();
    size_t next = 0;
    for (const TensorUse& t : uses) {
      if (t.readback == nullptr || t.span_bytes == 0) continue;
      GpuOrderedCall::Readback& rb = c->readbacks_[next++];
      ATTND_RETURN_IF_ERROR(
          Cuda(cudaMemcpyAsync(rb.block.data(), t.device, rb.n, cudaMemcpyDeviceToHost, tail),
               "reading back the work count's index tensors"));
      c->result_.count_readback += rb.n;
    }
    ATTND_RETURN_IF_ERROR(
        Cuda(cudaEventRecord(c->complete_, tail), "recording the completion event"));
    c->result_.impl = impl;
    c->result_.graph = outcome;
    return std::unique_ptr<DeviceOrderedCall>(std::move(c));
  }

 private:
  absl::StatusOr<std::shared_ptr<QueueStream> > StreamFor(int ordinal) {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(ordinal);
    if (it != streams_.end()) return it->second;
    absl::StatusOr<std::pair<cudaStream_t, int> > lane = rt_->TakeLane(ordinal);
    if (!lane.ok()) return lane.status();
    auto qs = std::make_shared<QueueStream>();
    qs->rt = rt_;
    qs->ordinal = ordinal;
    qs->stream = lane->first;
    qs->lane = lane->second;
    streams_[ordinal] = qs;
    return qs;
  }

  GpuBackend* const backend_;
  const std::shared_ptr<OrderedRuntime> rt_;
  absl::Mutex mu_;
  std::map<int, std::shared_ptr<QueueStream> > streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<OrderedRuntime> MakeOrderedRuntime(
    GpuBackend* backend, const std::function<void(const std::string&)>& log) {
  void* const fn = ::attnd::gpu::DriverEntryPoint("cuStreamWaitValue64");
  if (fn == nullptr) {
    if (log) log("cuStreamWaitValue64 is not available: stream-ordered calls use the host path");
    return nullptr;
  }
  // Lazy module loading (a context made before GpuBackend::Create set CUDA_MODULE_LOADING=EAGER,
  // as in a process that used CUDA first): a kernel's first launch then waits for the whole
  // context, so one pending ready wait would hold up every kernel not yet launched in the process
  // (docs/SERVICE.md "Stream-ordered calls on a CUDA device"). The host path never leaves a wait
  // on a stream.
  using LoadingModeFn = CUresult(CUDAAPI*)(CUmoduleLoadingMode*);
  void* const mode_fn = ::attnd::gpu::DriverEntryPoint("cuModuleGetLoadingMode");
  CUmoduleLoadingMode mode = CU_MODULE_LAZY_LOADING;
  if (mode_fn == nullptr || reinterpret_cast<LoadingModeFn>(mode_fn)(&mode) != CUDA_SUCCESS ||
      mode != CU_MODULE_EAGER_LOADING) {
    (void)cudaGetLastError();
    if (log) {
      log("CUDA module loading is not eager (the process used CUDA before the backend started, or "
          "the driver cannot say): stream-ordered calls use the host path");
    }
    return nullptr;
  }
  void* host = nullptr;
  const size_t bytes = OrderedRuntime::kSlots * sizeof(ko::CallWords);
  if (cudaHostAlloc(&host, bytes, cudaHostAllocPortable | cudaHostAllocMapped) != cudaSuccess) {
    (void)cudaGetLastError();
    if (log) log("cannot allocate mapped pinned words: stream-ordered calls use the host path");
    return nullptr;
  }
  std::memset(host, 0, bytes);
  void* device = nullptr;
  if (cudaHostGetDevicePointer(&device, host, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    (void)cudaFreeHost(host);
    if (log) log("cannot map the pinned words: stream-ordered calls use the host path");
    return nullptr;
  }
  auto rt = std::make_shared<OrderedRuntime>(backend, reinterpret_cast<WaitValue64Fn>(fn),
                                             static_cast<ko::CallWords*>(host),
                                             static_cast<ko::CallWords*>(device));
  if (const char* path = std::getenv("ATTND_ORDERED_TRACE"); path != nullptr && *path != '\0') {
    std::FILE* f = std::fopen(path, "a");
    if (f == nullptr) {
      if (log) log(absl::StrCat("ATTND_ORDERED_TRACE: cannot open ", path, ": no trace"));
    } else {
      rt->SetTrace(f);
      if (log) log(absl::StrCat("tracing device-ordered calls into ", path));
    }
  }
  if (const char* form = std::getenv("ATTND_ORDERED_GATE"); form != nullptr && *form != '\0') {
    const std::string f(form);
    if (f == "spin" || f == "wait") {
      rt->SetGateForm(f == "spin" ? OrderedRuntime::GateForm::kSpin
                                  : OrderedRuntime::GateForm::kWait);
      if (log) log(absl::StrCat("ATTND_ORDERED_GATE=", f, ": every gate in that form"));
    } else if (log) {
      log(absl::StrCat("ATTND_ORDERED_GATE=", f, " is neither spin nor wait: ignored"));
    }
  }
  if (const char* ns = std::getenv("ATTND_ORDERED_SPIN_NS"); ns != nullptr && *ns != '\0') {
    unsigned int v = 0;
    if (absl::SimpleAtoi(ns, &v) && v <= 100000) {
      rt->SetSpinSleep(v);
      if (log) log(absl::StrCat("ATTND_ORDERED_SPIN_NS=", v, ": the spin form's sleep"));
    } else if (log) {
      log(absl::StrCat("ATTND_ORDERED_SPIN_NS=", ns, " is not 0..100000: ignored"));
    }
  }
  if (const char* skip = std::getenv("ATTND_ORDERED_SKIP"); skip != nullptr && *skip != '\0') {
    const std::string f(skip);
    if (f == "enable" || f == "cond") {
      rt->SetSkipForm(f == "enable" ? OrderedRuntime::SkipForm::kEnable
                                    : OrderedRuntime::SkipForm::kConditional,
                      log);
      if (log)
        log(absl::StrCat("ATTND_ORDERED_SKIP=", f, ": a cancelled call's op is skipped by ",
                         f == "enable" ? "disabling its kernel nodes" : "a conditional node"));
    } else if (log) {
      log(absl::StrCat("ATTND_ORDERED_SKIP=", f, " is neither cond nor enable: ignored"));
    }
  }
  if (const char* where = std::getenv("ATTND_ORDERED_DONE"); where != nullptr && *where != '\0') {
    const std::string f(where);
    if (f == "body" || f == "after") {
      rt->SetDoneAfter(f == "after");
      if (log) {
        log(absl::StrCat("ATTND_ORDERED_DONE=", f, ": the conditional form's done store ",
                         f == "after" ? "follows the conditional node" : "ends its body"));
      }
    } else if (log) {
      log(absl::StrCat("ATTND_ORDERED_DONE=", f, " is neither body nor after: ignored"));
    }
  }
  if (const char* keep = std::getenv("ATTND_ORDERED_KEEP_MEMSETS");
      keep != nullptr && std::string(keep) == "1") {
    rt->KeepMemsets();
    if (log) log("ATTND_ORDERED_KEEP_MEMSETS=1: workspace memsets stay in the conditional body");
  }
  // Lanes: the hardware queues left after the worker streams and the watchdog, capture and
  // readback streams (docs/SERVICE.md "Stream-ordered calls on a CUDA device").
  int connections = 8;  // CUDA's default
  if (const char* env = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS")) {
    int v = 0;
    if (absl::SimpleAtoi(env, &v) && v > 0) connections = v;
  }
  const int lanes = std::max(1, connections - std::max(backend->streams_per_device(), 1) - 3);
  for (size_t i = 0; i < backend->served().size(); ++i) {
    const ServedDevice& d = backend->served()[i];
    if (cudaSetDevice(d.ordinal) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (absl::Status st = rt->CreateLanes(d.ordinal, lanes); !st.ok()) {
      if (log) log(absl::StrCat("device-ordered lanes on ", d.uuid, ": ", st.message()));
    }
    if (log) {  // docs/SERVICE.md "The gate's two forms"
      const bool mps = backend->device(i).description().mps;
      log(absl::StrCat("device-ordered gate on ", d.uuid, ": ", rt->SpinGate(mps) ? "spin" : "wait",
                       mps ? " (MPS on)" : " (MPS off)"));
    }
  }
  if (log) {
    log(absl::StrCat("device-ordered calls: ", lanes, " lanes per device (", connections,
                     " hardware queues, CUDA_DEVICE_MAX_CONNECTIONS)"));
  }
  return rt;
}

std::unique_ptr<DeviceOrderedQueue> NewGpuOrderedQueue(GpuBackend* backend,
                                                       std::shared_ptr<OrderedRuntime> runtime) {
  if (runtime == nullptr) return nullptr;
  return std::make_unique<GpuOrderedQueue>(backend, std::move(runtime));
}

#endif  // ATTND_GPU_CUDA

}  // namespace attnd::server::engine::gpu_rt
