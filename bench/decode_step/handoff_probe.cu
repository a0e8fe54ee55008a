// handoff_probe: how long the GPU takes to hand work from one process to another and back
// (docs/BENCHMARKS.md "Cross-process hand-off on the GPU timeline"). Two processes (this one, the
// "frontend" A, and a forked "daemon" B) each run `--iters` iterations enqueued ahead of the GPU:
//   A: work(a_us) · stamp A1 · signal(ready = i) · wait(done >= i) · stamp A2
//   B: wait(ready >= i) · stamp B0 · [body: work(b_us) in `--kernels` kernels] · stamp B1 ·
//      signal(done = i)
// Stamps are %globaltimer (one clock for the whole GPU), so B0 − A1 is the A→B hand-off and
// A2 − B1 the B→A one, each including one tiny kernel launch (the "local" row: two stamps back to
// back in one stream). Every mode of signalling and waiting is run:
//   signal  memop: cuStreamWriteValue64 · kernel: one thread, __threadfence_system + volatile store
//           · kernel_gpu: the same with __threadfence (GPU scope; device words only)
//   wait    memop: cuStreamWaitValue64 (GEQ) · spin: one warp polling the word (with a timeout)
//   word    host: one page of shared memory mapped into both contexts · device: cudaMalloc by A,
//           opened by B through CUDA IPC
//   event   signal and wait "event", word "ipc": no signal word; A records ready event i (one of
//           kEventRing interprocess events made by A, opened by B through cudaIpcOpenEventHandle)
//           and B's stream waits on it (cudaStreamWaitEvent), B records done event i and A waits
//           on it. A stream waits on an event's latest record at the time of the call, so each
//           side's host enqueues its wait only once the other's host has enqueued that record
//           (counters in the shared page); both still run ahead of the GPU. An event is recorded
//           again kEventRing iterations later, after the other side has enqueued its wait on it.
// and B's body as plain launches, one graph, or the daemon's form [gate kernel → conditional IF
// body → done kernel] (server/engine/gpu/ordered_queue.cc). One JSON line per mode to --out;
// a table on stdout. Run it twice, with and without MPS (nvidia-cuda-mps-control -d).
//   handoff_probe --iters 300 --a-us 20 --b-us 100 --kernels 4 --out probe.jsonl
// --signal NAME runs only the modes whose signal is NAME (memop, kernel, kernel_gpu or event); the
// event modes run only when named.
// --graph-cost 1 runs the in-process experiment on the graph form instead (GraphCost below):
//   handoff_probe --graph-cost 1 --iters 200 --b-us 5 --out graph_cost.jsonl
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using WaitFn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
using WriteFn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

constexpr int kMaxIters = 4096;
constexpr int kEventRing = 64;  // interprocess events per direction (signal mode "event")
constexpr uint64_t kSpinTimeoutNs = 2000000000ull;  // 2 s: a lost signal ends the spin

#define CHECK(x)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::_Exit(2);                                                                          \
    }                                                                                         \
  } while (0)

__device__ uint64_t Now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void Stamp(uint64_t* at) { *at = Now(); }

// Every thread of every block busy until `ns` after its block began (a stand-in for real work
// that fills the GPU).
__global__ void Work(uint64_t ns) {
  __shared__ uint64_t t0;
  if (threadIdx.x == 0) t0 = Now();
  __syncthreads();
  while (Now() - t0 < ns) {
  }
}

// Work of other shapes, for the graph-form experiment's body kinds: a block of 200 KiB of dynamic
// shared memory, clusters of two, a 1 KiB parameter block.
__global__ void WorkSmem(uint64_t ns) {
  extern __shared__ unsigned char smem[];
  __shared__ uint64_t t0;
  if (threadIdx.x == 0) t0 = Now();
  smem[threadIdx.x] = static_cast<unsigned char>(threadIdx.x);
  __syncthreads();
  while (Now() - t0 < ns) {
  }
  if (smem[(threadIdx.x + 1) % blockDim.x] == 255 && t0 == 0) smem[0] = 1;
}
__global__ void __cluster_dims__(2, 1, 1) WorkCluster(uint64_t ns) {
  __shared__ uint64_t t0;
  if (threadIdx.x == 0) t0 = Now();
  __syncthreads();
  while (Now() - t0 < ns) {
  }
}
struct BigParams {
  uint64_t ns;
  uint64_t pad[127];
};
__global__ void WorkParams(const __grid_constant__ BigParams p) {
  __shared__ uint64_t t0;
  if (threadIdx.x == 0) t0 = Now();
  __syncthreads();
  while (Now() - t0 < p.ns + p.pad[threadIdx.x % 127] * 0) {
  }
}

constexpr int kSmemBytes = 200 * 1024;

// Distinct kernel functions (a body of different kernels, as an op's), each of them writing
// `bytes` of global memory when asked.
template <int I>
__global__ void WorkDistinct(uint64_t ns, uint4* out, uint64_t n16) {
  __shared__ uint64_t t0;
  if (threadIdx.x == 0) t0 = Now();
  __syncthreads();
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n16;
       i += uint64_t{gridDim.x} * blockDim.x) {
    out[i] = make_uint4(I, static_cast<unsigned>(i), 0, 0);
  }
  while (Now() - t0 < ns) {
  }
}
constexpr uint64_t kWriteBytes = 16ull << 20;

// One body kernel of kind `kind` (plain, smem, cluster, params; memset: a 4 KiB memset and a
// plain kernel).
void BodyKernel(const char* kind, int sms, uint64_t ns, cudaStream_t st, void* scratch, int j,
                uint4* big) {
  const std::string k = kind;
  if (k == "carveout" || k == "carveout_fixed") {  // smem 169 / 82 / 225 / 1 KiB in turn
    const int bytes[] = {169 * 1024, 82 * 1024, 225 * 1024, 1024};
    WorkSmem<<<sms, 128, bytes[j % 4], st>>>(ns);
    return;
  }
  if (k == "distinct" || k == "writes" || k == "distinct_writes") {
    const uint64_t n16 = k == "distinct" ? 0 : kWriteBytes / 16;
    uint4* out = big + (j % 4) * (kWriteBytes / 16);
    if (k == "writes") {
      WorkDistinct<0><<<sms, 128, 0, st>>>(ns, out, n16);
      return;
    }
    switch (j % 4) {
      case 0: WorkDistinct<0><<<sms, 128, 0, st>>>(ns, out, n16); break;
      case 1: WorkDistinct<1><<<sms, 128, 0, st>>>(ns, out, n16); break;
      case 2: WorkDistinct<2><<<sms, 128, 0, st>>>(ns, out, n16); break;
      default: WorkDistinct<3><<<sms, 128, 0, st>>>(ns, out, n16); break;
    }
    return;
  }
  if (k == "smem") {
    WorkSmem<<<sms, 128, kSmemBytes, st>>>(ns);
  } else if (k == "cluster") {
    WorkCluster<<<sms / 2 * 2, 128, 0, st>>>(ns);
  } else if (k == "params") {
    BigParams p{};
    p.ns = ns;
    WorkParams<<<sms, 128, 0, st>>>(p);
  } else {
    if (k == "memset") CHECK(cudaMemsetAsync(scratch, 0, 4096, st));
    Work<<<sms, 128, 0, st>>>(ns);
  }
}

__global__ void SpinWait(const unsigned long long* word, unsigned long long value,
                         unsigned int* timeouts) {
  if (threadIdx.x != 0) return;
  const uint64_t t0 = Now();
  while (*reinterpret_cast<const volatile unsigned long long*>(word) < value) {
    if (Now() - t0 > kSpinTimeoutNs) {
      atomicAdd(timeouts, 1u);
      return;
    }
  }
}

__global__ void KernelSignal(unsigned long long* word, unsigned long long value) {
  __threadfence_system();
  *reinterpret_cast<volatile unsigned long long*>(word) = value;
  __threadfence_system();
}
// The same with GPU-scope fences only: enough for a word in device memory that only streams and
// kernels of the same GPU wait on (signal mode kernel_gpu, device words only).
__global__ void KernelSignalGpu(unsigned long long* word, unsigned long long value) {
  __threadfence();
  *reinterpret_cast<volatile unsigned long long*>(word) = value;
  __threadfence();
}

__global__ void Gate(cudaGraphConditionalHandle h, const unsigned int* control) {
  cudaGraphSetConditional(h, *reinterpret_cast<const volatile unsigned int*>(control) == 0 ? 1 : 0);
  __threadfence_system();
}

// The daemon's gate and done kernels as they are (kernels/common/gpu/ordered_gate.cu): the
// control and state words in `words` (mapped host memory or device memory).
__global__ void DaemonGate(cudaGraphConditionalHandle h, unsigned int* words, int cond) {
  const unsigned int control = *reinterpret_cast<volatile unsigned int*>(&words[0]);
  const bool run = control != 1;
  if (cond) cudaGraphSetConditional(h, run ? 1u : 0u);
  __threadfence_system();
  *reinterpret_cast<volatile unsigned int*>(&words[1]) = run ? 1 : 2;
  __threadfence_system();
}
// The cond_in form's gate: DaemonGate that, when it cancels, also stores done = value | 2^62
// itself, so that the done store of a run can sit inside the IF body, after the op's kernels,
// with no node after the conditional.
__global__ void DaemonGateDone(cudaGraphConditionalHandle h, unsigned int* words,
                               unsigned long long* done, unsigned long long value) {
  const unsigned int control = *reinterpret_cast<volatile unsigned int*>(&words[0]);
  const bool run = control != 1;
  cudaGraphSetConditional(h, run ? 1u : 0u);
  *reinterpret_cast<volatile unsigned int*>(&words[1]) = run ? 1 : 2;
  if (!run) {
    __threadfence_system();
    *reinterpret_cast<volatile unsigned long long*>(done) = value | (1ull << 62);
  }
}
__global__ void DaemonDone(unsigned long long* done, unsigned long long value,
                           const unsigned int* words) {
  const unsigned int state = *reinterpret_cast<const volatile unsigned int*>(&words[1]);
  __threadfence_system();
  *reinterpret_cast<volatile unsigned long long*>(done) = state == 1 ? value : (value | 1ull << 62);
  __threadfence_system();
}

// The tail form's gate: reads control like DaemonGate, writes the state word, and then either
// tail-launches the body (a device-launchable graph of the kernels and DaemonDone) or, cancelled,
// stores done = value | 2^62 itself. The stream goes on once the tail launch has run.
__global__ void TailGate(cudaGraphExec_t body, unsigned int* words, unsigned long long* done,
                         unsigned long long value, unsigned int* errors) {
  const unsigned int control = *reinterpret_cast<volatile unsigned int*>(&words[0]);
  const bool run = control != 1;
  *reinterpret_cast<volatile unsigned int*>(&words[1]) = run ? 1 : 2;
  if (run) {
    if (cudaGraphLaunch(body, cudaStreamGraphTailLaunch) != cudaSuccess) atomicAdd(errors, 1u);
  } else {
    __threadfence_system();
    *reinterpret_cast<volatile unsigned long long*>(done) = value | (1ull << 62);
  }
}

// The enable forms' gate (no conditional node): reads control like DaemonGate and, instead of
// setting an IF handle, enables or disables the body's kernel nodes for this launch through
// their device-updatable handles. `lazy`: only when the decision differs from what the nodes
// were left at (`left_disabled`, a device word), so a run after a run updates nothing; else every
// launch sets every node.
constexpr int kMaxBodyNodes = 16;
struct BodyNodes {
  cudaGraphDeviceNode_t node[kMaxBodyNodes];
  int count;
};
__global__ void EnableGate(unsigned int* words, const __grid_constant__ BodyNodes nodes, int lazy,
                           unsigned int* left_disabled, unsigned int* errors) {
  const unsigned int control = *reinterpret_cast<volatile unsigned int*>(&words[0]);
  const bool run = control != 1;
  const unsigned int was_disabled = *reinterpret_cast<volatile unsigned int*>(left_disabled);
  if (!lazy || (run ? was_disabled != 0 : was_disabled == 0)) {
    for (int i = 0; i < nodes.count; ++i) {
      if (cudaGraphKernelNodeSetEnabled(nodes.node[i], run) != cudaSuccess) atomicAdd(errors, 1u);
    }
    *reinterpret_cast<volatile unsigned int*>(left_disabled) = run ? 0u : 1u;
  }
  __threadfence_system();
  *reinterpret_cast<volatile unsigned int*>(&words[1]) = run ? 1 : 2;
  __threadfence_system();
}

// The enable check's body kernel: counts its runs.
__global__ void CountRun(unsigned int* count) { atomicAdd(count, 1u); }

// The cluster check's body kernel: out[0] counts the CTAs that ran, out[1] the largest
// blockIdx.x, out[2] the largest cluster size (%cluster_nctarank) seen.
__global__ void CountCtas(unsigned int* out) {
  if (threadIdx.x != 0) return;
  unsigned int rank_count = 0;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(rank_count));
  atomicAdd(&out[0], 1u);
  atomicMax(&out[1], blockIdx.x);
  atomicMax(&out[2], rank_count);
}

struct Shared {  // the page both processes map
  unsigned long long ready;
  unsigned long long pad0[7];
  unsigned long long done;
  unsigned long long pad1[7];
  unsigned int control;  // the gate's (always "run")
  unsigned int pad2[15];
  cudaIpcMemHandle_t words_handle;  // A's device words (ready at 0, done at 64 bytes)
  // Signal mode "event": A's interprocess events (ready, then done), and how many records of each
  // direction the recording side's host has enqueued (the waiting side's host reads them).
  cudaIpcEventHandle_t ready_events[kEventRing];
  cudaIpcEventHandle_t done_events[kEventRing];
  unsigned long long ready_recorded;
  unsigned long long pad3[7];
  unsigned long long done_recorded;
  unsigned long long pad4[7];
  uint64_t b_stamps[2 * kMaxIters];
};

// The page's size rounded up to whole pages (cudaHostRegister pins whole pages).
constexpr size_t kShared = (sizeof(Shared) + 4095) / 4096 * 4096;

struct Mode {
  const char* signal;  // memop | kernel | kernel_gpu | event
  const char* wait;    // memop | spin | event
  const char* word;    // host | device | ipc (events: no word)
  const char* body;    // plain | graph | cond
};

struct Args {
  int iters = 300;
  int warmup = 20;
  double a_us = 20;
  double b_us = 100;
  int kernels = 4;
  const char* out = nullptr;
  const char* label = "";
  bool graph_cost = false;       // --graph-cost 1: the in-process graph-form experiment only
  const char* signal = nullptr;  // --signal: only the modes with this signal
};

// The modes a run takes: those of --signal, else every mode but the event ones (asked for by
// name only: measured slower than signal words under MPS, docs/BENCHMARKS.md "Session of
// 2026-12-07, 09:08 UTC").
bool Selected(const Args& a, const char* signal) {
  if (a.signal == nullptr) return std::strcmp(signal, "event") != 0;
  return std::strcmp(a.signal, signal) == 0;
}

// A host counter in the shared page that the other process's host advances.
unsigned long long LoadCounter(const unsigned long long* c) {
  return __atomic_load_n(c, __ATOMIC_ACQUIRE);
}
void AdvanceCounter(unsigned long long* c, unsigned long long v) {
  __atomic_store_n(c, v, __ATOMIC_RELEASE);
}
// Spins (yielding) until *c >= v; false after 10 s (the other side died).
bool AwaitCounter(const unsigned long long* c, unsigned long long v) {
  // By the clock: usleep(1) sleeps tens of µs, so a count of sleeps would wait minutes.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (LoadCounter(c) < v) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    usleep(1);
  }
  return true;
}

struct Side {
  WaitFn wait = nullptr;
  WriteFn write = nullptr;
  cudaStream_t stream = nullptr;
  int sms = 0;
  unsigned int* timeouts = nullptr;
  uint64_t* stamps = nullptr;  // device, 2 per iteration
};

void Signal(const Side& s, const Mode& m, unsigned long long* word, unsigned long long v) {
  if (std::strcmp(m.signal, "memop") == 0) {
    if (s.write(reinterpret_cast<CUstream>(s.stream), reinterpret_cast<CUdeviceptr>(word), v, 0) !=
        CUDA_SUCCESS) {
      std::fprintf(stderr, "cuStreamWriteValue64 failed\n");
      std::_Exit(2);
    }
  } else if (std::strcmp(m.signal, "kernel_gpu") == 0) {
    KernelSignalGpu<<<1, 1, 0, s.stream>>>(word, v);
  } else {
    KernelSignal<<<1, 1, 0, s.stream>>>(word, v);
  }
}

void Wait(const Side& s, const Mode& m, unsigned long long* word, unsigned long long v) {
  if (std::strcmp(m.wait, "memop") == 0) {
    if (s.wait(reinterpret_cast<CUstream>(s.stream), reinterpret_cast<CUdeviceptr>(word), v,
               CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) {
      std::fprintf(stderr, "cuStreamWaitValue64 failed\n");
      std::_Exit(2);
    }
  } else {
    SpinWait<<<1, 32, 0, s.stream>>>(word, v, s.timeouts);
  }
}

void Body(const Side& s, const Args& a, cudaStream_t st) {
  const uint64_t ns = static_cast<uint64_t>(a.b_us * 1000.0 / a.kernels);
  for (int k = 0; k < a.kernels; ++k) Work<<<s.sms, 128, 0, st>>>(ns);
}

// A kernel node's parameters: `fn` on one thread with `args`.
template <class Kernel>
cudaKernelNodeParams OneThread(Kernel* fn, void** args) {
  cudaKernelNodeParams p{};
  p.func = reinterpret_cast<void*>(fn);
  p.gridDim = dim3(1);
  p.blockDim = dim3(1);
  p.kernelParams = args;
  return p;
}

// The nodes of `g` (top level) that no node depends on.
std::vector<cudaGraphNode_t> Leaves(cudaGraph_t g) {
  size_t count = 0;
  CHECK(cudaGraphGetNodes(g, nullptr, &count));
  std::vector<cudaGraphNode_t> all(count), leaves;
  if (count > 0) CHECK(cudaGraphGetNodes(g, all.data(), &count));
  for (cudaGraphNode_t x : all) {
    size_t outs = 0;
    CHECK(cudaGraphNodeGetDependentNodes(x, nullptr, nullptr, &outs));
    if (outs == 0) leaves.push_back(x);
  }
  return leaves;
}

// An IF node on handle `h` after `after` in `g`; returns its body.
cudaGraph_t AddIf(cudaGraph_t g, cudaGraphNode_t after, cudaGraphConditionalHandle h,
                  cudaGraphNode_t* node) {
  cudaGraphNodeParams cp{};
  cp.type = cudaGraphNodeTypeConditional;
  cp.conditional.handle = h;
  cp.conditional.type = cudaGraphCondTypeIf;
  cp.conditional.size = 1;
  CHECK(cudaGraphAddNode(node, g, &after, nullptr, 1, &cp));
  return cp.conditional.phGraph_out[0];
}

// B's graph for one iteration's body: plain (the kernels) or the daemon's form.
cudaGraphExec_t BodyGraph(const Side& s, const Args& a, bool cond, const unsigned int* control) {
  cudaGraph_t g = nullptr;
  CHECK(cudaGraphCreate(&g, 0));
  cudaStream_t cap = nullptr;
  CHECK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
  cudaGraph_t target = g;
  cudaGraphNode_t cnode = nullptr;
  cudaGraphNode_t gate = nullptr;
  cudaGraphConditionalHandle h = 0;
  if (cond) {
    CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
    const unsigned int* c = control;
    void* gargs[] = {&h, &c};
    const cudaKernelNodeParams gp = OneThread(&Gate, gargs);
    CHECK(cudaGraphAddKernelNode(&gate, g, nullptr, 0, &gp));
    target = AddIf(g, gate, h, &cnode);
  }
  CHECK(cudaStreamBeginCaptureToGraph(cap, target, nullptr, nullptr, 0,
                                      cudaStreamCaptureModeThreadLocal));
  Body(s, a, cap);
  cudaGraph_t captured = nullptr;
  CHECK(cudaStreamEndCapture(cap, &captured));
  if (cond) {  // a trailing one-thread node, as the daemon's done kernel
    uint64_t* at = s.stamps + 2 * kMaxIters;  // scratch
    void* dargs[] = {&at};
    const cudaKernelNodeParams dp = OneThread(&Stamp, dargs);
    cudaGraphNode_t dn = nullptr;
    CHECK(cudaGraphAddKernelNode(&dn, g, &cnode, 1, &dp));
  }
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  CHECK(cudaStreamDestroy(cap));
  return exec;
}

void SetupSide(Side* s) {
  s->wait = nullptr;
  cudaDriverEntryPointQueryResult q{};
  void* f = nullptr;
  CHECK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &f, 12000, cudaEnableDefault, &q));
  s->wait = reinterpret_cast<WaitFn>(f);
  CHECK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &f, 12000, cudaEnableDefault, &q));
  s->write = reinterpret_cast<WriteFn>(f);
  CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  CHECK(cudaDeviceGetAttribute(&s->sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaMalloc(&s->timeouts, sizeof(unsigned int)));
  CHECK(cudaMemset(s->timeouts, 0, sizeof(unsigned int)));
  CHECK(cudaMalloc(&s->stamps, (2 * kMaxIters + 1) * sizeof(uint64_t)));
}

// One pipe each way: a byte is "go" for the next step.
struct Pipes {
  int a2b[2];
  int b2a[2];
};
void Send(int fd) {
  char c = 1;
  if (write(fd, &c, 1) != 1) std::_Exit(3);
}
void Recv(int fd) {
  char c = 0;
  if (read(fd, &c, 1) != 1) std::_Exit(3);
}

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

const Mode kModes[] = {
    {"memop", "memop", "host", "plain"},        {"memop", "memop", "device", "plain"},
    {"kernel", "memop", "host", "plain"},       {"kernel", "memop", "device", "plain"},
    {"memop", "spin", "host", "plain"},         {"memop", "spin", "device", "plain"},
    {"kernel", "spin", "host", "plain"},        {"kernel", "spin", "device", "plain"},
    {"memop", "memop", "device", "graph"},      {"memop", "memop", "device", "cond"},
    {"kernel", "memop", "device", "cond"},      {"kernel", "spin", "device", "cond"},
    {"kernel_gpu", "memop", "device", "plain"}, {"kernel_gpu", "spin", "device", "plain"},
    {"event", "event", "ipc", "plain"},         {"event", "event", "ipc", "cond"},
};

// The daemon side: runs every mode in step with A.
void RunB(Shared* sh, const Pipes& p, const Args& a) {
  Side s;
  SetupSide(&s);
  CHECK(cudaHostRegister(sh, kShared, cudaHostRegisterMapped | cudaHostRegisterPortable));
  Shared* dsh = nullptr;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dsh), sh, 0));
  Recv(p.a2b[0]);  // A's IPC handle is in the page
  void* dwords = nullptr;
  CHECK(cudaIpcOpenMemHandle(&dwords, sh->words_handle, cudaIpcMemLazyEnablePeerAccess));
  cudaEvent_t ready_ev[kEventRing] = {}, done_ev[kEventRing] = {};
  if (Selected(a, "event")) {
    for (int e = 0; e < kEventRing; ++e) {
      CHECK(cudaIpcOpenEventHandle(&ready_ev[e], sh->ready_events[e]));
      CHECK(cudaIpcOpenEventHandle(&done_ev[e], sh->done_events[e]));
    }
  }
  const int n = a.warmup + a.iters;
  for (const Mode& m : kModes) {
    if (!Selected(a, m.signal)) continue;
    const bool events = std::strcmp(m.signal, "event") == 0;
    const bool host = std::strcmp(m.word, "host") == 0;
    auto* ready = host ? &dsh->ready : static_cast<unsigned long long*>(dwords);
    auto* done = host ? &dsh->done : static_cast<unsigned long long*>(dwords) + 8;
    cudaGraphExec_t exec = nullptr;
    if (std::strcmp(m.body, "plain") != 0) {
      exec = BodyGraph(s, a, std::strcmp(m.body, "cond") == 0, &dsh->control);
    }
    CHECK(cudaDeviceSynchronize());
    Send(p.b2a[1]);  // B ready for the mode
    Recv(p.a2b[0]);  // words reset: go
    for (int i = 0; i < n; ++i) {
      const auto v = static_cast<unsigned long long>(i + 1);
      if (events) {
        if (!AwaitCounter(&sh->ready_recorded, v)) std::_Exit(4);  // A's record i is enqueued
        CHECK(cudaStreamWaitEvent(s.stream, ready_ev[i % kEventRing], 0));
      } else {
        Wait(s, m, ready, v);
      }
      Stamp<<<1, 1, 0, s.stream>>>(s.stamps + 2 * i);
      if (exec != nullptr) {
        CHECK(cudaGraphLaunch(exec, s.stream));
      } else {
        Body(s, a, s.stream);
      }
      Stamp<<<1, 1, 0, s.stream>>>(s.stamps + 2 * i + 1);
      if (events) {
        // Record i % kEventRing again only after A enqueued its wait on the previous record of
        // it (iteration i - kEventRing): A enqueues that wait before its record i - kEventRing + 1,
        // which the wait above has seen.
        CHECK(cudaEventRecord(done_ev[i % kEventRing], s.stream));
        AdvanceCounter(&sh->done_recorded, v);
      } else {
        Signal(s, m, done, v);
      }
    }
    CHECK(cudaStreamSynchronize(s.stream));
    CHECK(cudaMemcpy(sh->b_stamps, s.stamps, 2 * n * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    if (exec != nullptr) CHECK(cudaGraphExecDestroy(exec));
    Send(p.b2a[1]);  // stamps in the page
  }
  unsigned int to = 0;
  CHECK(cudaMemcpy(&to, s.timeouts, sizeof(to), cudaMemcpyDeviceToHost));
  if (to != 0) std::fprintf(stderr, "B: %u spin waits timed out\n", to);
  for (int e = 0; e < kEventRing; ++e) {
    if (ready_ev[e] != nullptr) CHECK(cudaEventDestroy(ready_ev[e]));
    if (done_ev[e] != nullptr) CHECK(cudaEventDestroy(done_ev[e]));
  }
  CHECK(cudaIpcCloseMemHandle(dwords));
}

int RunA(Shared* sh, const Pipes& p, const Args& a, pid_t child) {
  Side s;
  SetupSide(&s);
  CHECK(cudaHostRegister(sh, kShared, cudaHostRegisterMapped | cudaHostRegisterPortable));
  Shared* dsh = nullptr;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dsh), sh, 0));
  unsigned long long* dwords = nullptr;
  CHECK(cudaMalloc(&dwords, 4096));
  CHECK(cudaIpcGetMemHandle(&sh->words_handle, dwords));
  cudaEvent_t ready_ev[kEventRing] = {}, done_ev[kEventRing] = {};
  if (Selected(a, "event")) {
    for (int e = 0; e < kEventRing; ++e) {
      for (cudaEvent_t* ev : {&ready_ev[e], &done_ev[e]}) {
        CHECK(cudaEventCreateWithFlags(ev, cudaEventDisableTiming | cudaEventInterprocess));
      }
      CHECK(cudaIpcGetEventHandle(&sh->ready_events[e], ready_ev[e]));
      CHECK(cudaIpcGetEventHandle(&sh->done_events[e], done_ev[e]));
    }
  }
  Send(p.a2b[1]);
  const int n = a.warmup + a.iters;
  std::vector<uint64_t> as(2 * n);
  FILE* out = a.out != nullptr ? std::fopen(a.out, "a") : nullptr;

  // Local: two stamps back to back, and a stamp after work (the kernel-launch floor).
  {
    for (int i = 0; i < n; ++i) {
      Work<<<s.sms, 128, 0, s.stream>>>(static_cast<uint64_t>(a.a_us * 1000));
      Stamp<<<1, 1, 0, s.stream>>>(s.stamps + 2 * i);
      Stamp<<<1, 1, 0, s.stream>>>(s.stamps + 2 * i + 1);
    }
    CHECK(cudaStreamSynchronize(s.stream));
    CHECK(cudaMemcpy(as.data(), s.stamps, 2 * n * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    std::vector<double> d;
    for (int i = a.warmup; i < n; ++i) d.push_back((as[2 * i + 1] - as[2 * i]) * 1e-3);
    std::printf("%-32s stamp->stamp p50 %.2f us p90 %.2f\n", "local", Pct(d, 0.5), Pct(d, 0.9));
    if (out) {
      std::fprintf(out,
                   "{\"op\":\"handoff_probe\",\"label\":\"%s\",\"mode\":\"local\","
                   "\"stamp_to_stamp_us_p50\":%.3f,\"p90\":%.3f}\n",
                   a.label, Pct(d, 0.5), Pct(d, 0.9));
    }
  }

  std::printf("%-32s %9s %9s %9s %9s %9s\n", "signal/wait/word/body", "A->B p50", "p90", "B->A p50",
              "p90", "iter p50");
  for (const Mode& m : kModes) {
    if (!Selected(a, m.signal)) continue;
    const bool events = std::strcmp(m.signal, "event") == 0;
    const bool host = std::strcmp(m.word, "host") == 0;
    auto* ready = host ? &dsh->ready : dwords;
    auto* done = host ? &dsh->done : dwords + 8;
    Recv(p.b2a[0]);  // B ready
    sh->ready = 0;
    sh->done = 0;
    sh->control = 0;
    AdvanceCounter(&sh->ready_recorded, 0);
    AdvanceCounter(&sh->done_recorded, 0);
    CHECK(cudaMemset(dwords, 0, 4096));
    CHECK(cudaDeviceSynchronize());
    Send(p.a2b[1]);
    for (int i = 0; i < n; ++i) {
      const auto v = static_cast<unsigned long long>(i + 1);
      Work<<<s.sms, 128, 0, s.stream>>>(static_cast<uint64_t>(a.a_us * 1000));
      Stamp<<<1, 1, 0, s.stream>>>(s.stamps + 2 * i);
      if (events) {
        // Record i % kEventRing again only after B enqueued its wait on the previous record of it
        // (iteration i - kEventRing), which it did before its done record i - kEventRing, which
        // this host waited for.
        CHECK(cudaEventRecord(ready_ev[i % kEventRing], s.stream));
        AdvanceCounter(&sh->ready_recorded, v);
        if (!AwaitCounter(&sh->done_recorded, v)) std::_Exit(4);  // B's record i is enqueued
        CHECK(cudaStreamWaitEvent(s.stream, done_ev[i % kEventRing], 0));
      } else {
        Signal(s, m, ready, v);
        Wait(s, m, done, v);
      }
      Stamp<<<1, 1, 0, s.stream>>>(s.stamps + 2 * i + 1);
    }
    CHECK(cudaStreamSynchronize(s.stream));
    CHECK(cudaMemcpy(as.data(), s.stamps, 2 * n * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    Recv(p.b2a[0]);  // B's stamps are in the page
    std::vector<double> ab, ba, it;
    for (int i = a.warmup; i < n; ++i) {
      const double a1 = as[2 * i], a2 = as[2 * i + 1];
      const double b0 = sh->b_stamps[2 * i], b1 = sh->b_stamps[2 * i + 1];
      ab.push_back((b0 - a1) * 1e-3);
      ba.push_back((a2 - b1) * 1e-3);
      if (i > a.warmup) it.push_back((a2 - static_cast<double>(as[2 * i - 1])) * 1e-3);
    }
    char name[64];
    std::snprintf(name, sizeof(name), "%s/%s/%s/%s", m.signal, m.wait, m.word, m.body);
    std::printf("%-32s %9.2f %9.2f %9.2f %9.2f %9.2f\n", name, Pct(ab, 0.5), Pct(ab, 0.9),
                Pct(ba, 0.5), Pct(ba, 0.9), Pct(it, 0.5));
    std::fflush(stdout);
    if (out) {
      std::fprintf(out,
                   "{\"op\":\"handoff_probe\",\"label\":\"%s\",\"signal\":\"%s\",\"wait\":\"%s\","
                   "\"word\":\"%s\",\"body\":\"%s\",\"iters\":%d,\"a_us\":%.1f,\"b_us\":%.1f,"
                   "\"kernels\":%d,\"a_to_b_us_p50\":%.3f,\"a_to_b_us_p90\":%.3f,"
                   "\"b_to_a_us_p50\":%.3f,\"b_to_a_us_p90\":%.3f,\"iter_us_p50\":%.3f}\n",
                   a.label, m.signal, m.wait, m.word, m.body, a.iters, a.a_us, a.b_us, a.kernels,
                   Pct(ab, 0.5), Pct(ab, 0.9), Pct(ba, 0.5), Pct(ba, 0.9), Pct(it, 0.5));
    }
  }
  unsigned int to = 0;
  CHECK(cudaMemcpy(&to, s.timeouts, sizeof(to), cudaMemcpyDeviceToHost));
  if (to != 0) std::fprintf(stderr, "A: %u spin waits timed out\n", to);
  for (int e = 0; e < kEventRing; ++e) {
    if (ready_ev[e] != nullptr) CHECK(cudaEventDestroy(ready_ev[e]));
    if (done_ev[e] != nullptr) CHECK(cudaEventDestroy(done_ev[e]));
  }
  if (out) std::fclose(out);
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 && to == 0 ? 0 : 1;
}

// The enable forms' graph: [EnableGate → the body (captured from `capture(stream)`, its kernel
// nodes made device-updatable) → DaemonDone], instantiated and uploaded (a graph whose nodes are
// updated from within it must be uploaded before its first launch). The gate's and done's
// parameters are returned in `gp_args` / `dp_args` form through the nodes, for per-launch
// SetParams. False, with `why`, when a body kernel node refuses the device-updatable attribute or
// the body has more than kMaxBodyNodes kernel nodes; non-kernel nodes (a memset) stay, and run
// whatever the gate decides.
struct EnableGraphOut {
  // The template graph stays alive with the executable one: the gate's and done's per-launch
  // parameters (cudaGraphExecKernelNodeSetParams) name their nodes in it.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaGraphNode_t gate = nullptr, done = nullptr;
  BodyNodes nodes{};
  int non_kernel = 0;
};
template <typename Capture>
bool MakeEnableGraph(Capture capture, unsigned int* words, int lazy, unsigned int* left_disabled,
                     unsigned int* errors, unsigned long long* done, EnableGraphOut* out,
                     std::string* why) {
  cudaGraph_t g = nullptr;
  CHECK(cudaGraphCreate(&g, 0));
  BodyNodes nodes{};
  void* gargs[] = {&words, &nodes, &lazy, &left_disabled, &errors};
  cudaKernelNodeParams gp = OneThread(&EnableGate, gargs);
  CHECK(cudaGraphAddKernelNode(&out->gate, g, nullptr, 0, &gp));
  cudaStream_t cap = nullptr;
  CHECK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
  CHECK(cudaStreamBeginCaptureToGraph(cap, g, &out->gate, nullptr, 1,
                                      cudaStreamCaptureModeThreadLocal));
  capture(cap);
  cudaGraph_t captured = nullptr;
  CHECK(cudaStreamEndCapture(cap, &captured));
  size_t count = 0;
  CHECK(cudaGraphGetNodes(g, nullptr, &count));
  std::vector<cudaGraphNode_t> all(count);
  CHECK(cudaGraphGetNodes(g, all.data(), &count));
  std::vector<cudaGraphNode_t> leaves;
  bool ok = true;
  for (cudaGraphNode_t x : all) {
    size_t outs = 0;
    CHECK(cudaGraphNodeGetDependentNodes(x, nullptr, nullptr, &outs));
    if (outs == 0) leaves.push_back(x);
    if (x == out->gate) continue;
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(x, &type));
    if (type != cudaGraphNodeTypeKernel) {
      ++out->non_kernel;
      continue;
    }
    if (nodes.count == kMaxBodyNodes) {
      *why = "more body kernel nodes than the gate takes";
      ok = false;
      break;
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
      *why = std::string("a body kernel node is not device-updatable: ") +
             (e != cudaSuccess ? cudaGetErrorString(e) : "no handle returned");
      (void)cudaGetLastError();
      ok = false;
      break;
    }
    nodes.node[nodes.count++] = got.deviceUpdatableKernelNode.devNode;
  }
  CHECK(cudaStreamDestroy(cap));
  if (!ok) {
    CHECK(cudaGraphDestroy(g));
    return false;
  }
  out->nodes = nodes;
  gp = OneThread(&EnableGate, gargs);  // gargs[1] points at `nodes`, now filled
  CHECK(cudaGraphKernelNodeSetParams(out->gate, &gp));
  unsigned long long v = 1;
  void* dargs[] = {&done, &v, &words};
  const cudaKernelNodeParams dp = OneThread(&DaemonDone, dargs);
  CHECK(cudaGraphAddKernelNode(&out->done, g, leaves.data(), leaves.size(), &dp));
  const cudaError_t ie = cudaGraphInstantiate(&out->exec, g, 0);
  if (ie != cudaSuccess) {
    CHECK(cudaGraphDestroy(g));
    *why = std::string("instantiate: ") + cudaGetErrorString(ie);
    (void)cudaGetLastError();
    return false;
  }
  out->graph = g;
  cudaStream_t up = nullptr;
  CHECK(cudaStreamCreateWithFlags(&up, cudaStreamNonBlocking));
  CHECK(cudaGraphUpload(out->exec, up));
  CHECK(cudaStreamSynchronize(up));
  CHECK(cudaStreamDestroy(up));
  return true;
}

// Whether the enable form skips the body: a graph [EnableGate → 4 × CountRun → DaemonDone]
// launched with run / cancel decisions in turn (the gate's and done's parameters set before each
// launch, as the daemon does), each launch waited for: the count must move by 4 exactly on the
// runs (so a disabled node stays skipped within the launch that disabled it, and a later run
// enables it again), and done must be the launch's value, with the failure bit on the cancels.
// Both the lazy gate and the one that sets every node each launch. Prints and returns failures.
int EnableCheck(const Args& a, FILE* out) {
  unsigned int* hwords = nullptr;
  CHECK(cudaHostAlloc(&hwords, 4096, cudaHostAllocMapped));
  std::memset(hwords, 0, 4096);
  unsigned int* words = nullptr;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&words), hwords, 0));
  unsigned int *dev = nullptr, *count = nullptr;
  CHECK(cudaMalloc(&dev, 64));
  CHECK(cudaMemset(dev, 0, 64));
  count = dev;                     // dev[0]: the body's runs
  unsigned int* left = dev + 1;    // dev[1]: the nodes left disabled
  unsigned int* errors = dev + 2;  // dev[2]: failed device-side updates
  unsigned long long* done = nullptr;
  CHECK(cudaMalloc(&done, 8));
  CHECK(cudaMemset(done, 0, 8));
  cudaStream_t st = nullptr;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int failures = 0;
  const bool runs[] = {true, false, true, false, false, true, true, false, true};
  for (int lazy : {1, 0}) {
    CHECK(cudaMemset(dev, 0, 64));
    EnableGraphOut g;
    std::string why;
    const bool made = MakeEnableGraph(
        [&](cudaStream_t cap) {
          for (int i = 0; i < 4; ++i) CountRun<<<1, 1, 0, cap>>>(count);
        },
        words, lazy, left, errors, done, &g, &why);
    if (!made) {
      std::printf("enable check (lazy %d): cannot build: %s\n", lazy, why.c_str());
      ++failures;
      continue;
    }
    unsigned int expect = 0;
    int wrong = 0;
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); ++i) {
      hwords[0] = runs[i] ? 0u : 1u;  // control: 1 cancels
      BodyNodes nodes = g.nodes;
      void* gargs[] = {&words, &nodes, &lazy, &left, &errors};
      const cudaKernelNodeParams gp = OneThread(&EnableGate, gargs);
      CHECK(cudaGraphExecKernelNodeSetParams(g.exec, g.gate, &gp));
      unsigned long long v = i + 1;
      void* dargs[] = {&done, &v, &words};
      const cudaKernelNodeParams dp = OneThread(&DaemonDone, dargs);
      CHECK(cudaGraphExecKernelNodeSetParams(g.exec, g.done, &dp));
      CHECK(cudaGraphLaunch(g.exec, st));
      CHECK(cudaStreamSynchronize(st));
      if (runs[i]) expect += 4;
      unsigned int got[3] = {};
      unsigned long long d = 0;
      CHECK(cudaMemcpy(got, dev, sizeof(got), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(&d, done, 8, cudaMemcpyDeviceToHost));
      const unsigned long long want_done = runs[i] ? v : (v | 1ull << 62);
      const bool ok = got[0] == expect && d == want_done && got[2] == 0;
      if (!ok) ++wrong;
      std::printf(
          "enable check (lazy %d) launch %zu %-6s: runs %u (want %u), done %s, update "
          "errors %u: %s\n",
          lazy, i, runs[i] ? "run" : "cancel", got[0], expect, d == want_done ? "right" : "WRONG",
          got[2], ok ? "ok" : "FAIL");
    }
    failures += wrong;
    if (out) {
      std::fprintf(out,
                   "{\"op\":\"handoff_probe_enable_check\",\"label\":\"%s\",\"lazy\":%d,"
                   "\"launches\":%zu,\"failed\":%d}\n",
                   a.label, lazy, sizeof(runs) / sizeof(runs[0]), wrong);
    }
    CHECK(cudaGraphExecDestroy(g.exec));
    CHECK(cudaGraphDestroy(g.graph));
  }
  CHECK(cudaStreamDestroy(st));
  CHECK(cudaFree(done));
  CHECK(cudaFree(dev));
  CHECK(cudaFreeHost(hwords));
  std::printf("enable check: %s\n", failures == 0 ? "PASS" : "FAIL");
  return failures;
}

// The in-process cost of the daemon's graph form (no second process): per iteration, a stamp,
// the body of `k` kernels (each `us` of work over every SM) in one of these forms, a stamp:
//   stream       the kernels launched one by one
//   graph        one graph of the kernels
//   gated        [gate → kernels → done] without a conditional (the two tiny kernels' cost)
//   cond_host    [gate → IF{kernels} → done], control and state words in mapped host memory
//                (the daemon's form), with the daemon's two cudaGraphExecKernelNodeSetParams
//                before every launch
//   cond_dev     the same with the words in device memory, no SetParams
//   cond_in      [gate → IF{kernels → done}]: cond_dev with the done store inside the body and
//                nothing after the conditional (the gate stores done | 2^62 itself on a cancel)
//   cond_dev_set cond_dev with the daemon's two SetParams before every launch (gate, done)
//   cond_in_set  cond_in with them, the done node's inside the body: the daemon's
//                ATTND_ORDERED_DONE=body form on device words
//   cond_child   the IF body a child-graph node holding the kernels (host words)
//   tail         [TailGate], which tail-launches a device-launchable graph [kernels → done]
//                (no conditional node; host words)
//   en_host      [EnableGate → kernels → done], no conditional node: the body's kernel nodes
//                are device-updatable and the gate disables them for a cancelled launch (lazy:
//                it updates them only when the decision changes, so a run of runs updates
//                nothing); host words and the per-launch SetParams, as cond_host
//   en_always    the same with the gate setting every node's enabled state at every launch
//   en_dev       en_host with device words and no SetParams (as cond_dev)
// Before the timings, EnableCheck proves the enable forms skip the body on a cancel and run it
// again afterwards (a failure makes the exit status 1), and ClusterCheck reports whether a
// cluster-launched kernel keeps its grid in each form (reported only).
// for bodies of `k` kernels of each kind (BodyKernel: plain; 200 KiB of shared memory; clusters
// of two; a 1 KiB parameter block; a 4 KiB memset before each kernel; four distinct kernel
// functions; kernels writing 16 MiB each; both; kernels of 169 / 82 / 225 / 1 KiB of shared
// memory in turn, without and with the most-shared-memory carveout preference); k 1, 4, 8 and 16
// for plain, 4 for the others. Every iteration is enqueued ahead of the GPU; p50 of (stamp after
// − stamp before) is printed.
// Whether a kernel launched in clusters keeps its grid in a graph whose kernel nodes are
// device-updatable (the enable form): one launch of CountCtas, grid 8 CTAs in clusters of 2,
// captured into (a) a plain graph, (b) the same with the node made device-updatable, (c) the
// enable form's graph [EnableGate → it → DaemonDone] with a lazy gate (no node update on a run),
// (d) the same with the gate enabling the node at every launch. Each must run 8 CTAs,
// blockIdx.x up to 7, in clusters of 2. Prints each form's count (a finding about the driver,
// not a failure of the probe).
void ClusterCheck(const Args& a, FILE* out) {
  constexpr unsigned int kGrid = 8, kCluster = 2;
  unsigned int* counts = nullptr;
  CHECK(cudaMalloc(&counts, 64));
  auto launch = [&](cudaStream_t s) {
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(kGrid, 1, 1);
    c.blockDim = dim3(32, 1, 1);
    c.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = kCluster;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    c.attrs = at;
    c.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&c, CountCtas, counts));
  };
  cudaStream_t st = nullptr;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  unsigned int* hwords = nullptr;
  CHECK(cudaHostAlloc(&hwords, 4096, cudaHostAllocMapped));
  std::memset(hwords, 0, 4096);  // control 0: the gate runs the body
  unsigned int* words = nullptr;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&words), hwords, 0));
  unsigned int* en = nullptr;  // [0] left disabled, [1] update errors
  CHECK(cudaMalloc(&en, 64));
  CHECK(cudaMemset(en, 0, 64));
  unsigned long long* done = nullptr;
  CHECK(cudaMalloc(&done, 8));
  int failures = 0;
  for (const char* form : {"plain", "updatable", "enable_lazy", "enable_gate"}) {
    const std::string f = form;
    CHECK(cudaMemset(counts, 0, 64));
    cudaGraph_t g = nullptr;
    cudaGraphExec_t exec = nullptr;
    unsigned int cluster_attr = 0;
    if (f.rfind("enable_", 0) == 0) {
      // enable_lazy: the gate updates no node on a run (nothing was disabled); enable_gate: it
      // enables the node from the device at every launch, as the daemon's gate does.
      CHECK(cudaMemset(en, 0, 64));
      EnableGraphOut eg;
      std::string why;
      const int lazy = f == "enable_lazy" ? 1 : 0;
      if (!MakeEnableGraph([&](cudaStream_t cap) { launch(cap); }, words, lazy, en, en + 1, done,
                           &eg, &why)) {
        std::printf("cluster check %-11s: cannot build: %s\n", form, why.c_str());
        ++failures;
        continue;
      }
      g = eg.graph;
      exec = eg.exec;
      size_t n = 1;
      cudaGraphNode_t body = nullptr;
      CHECK(cudaGraphNodeGetDependentNodes(eg.gate, &body, nullptr, &n));
      cudaLaunchAttributeValue cv{};
      CHECK(cudaGraphKernelNodeGetAttribute(body, cudaLaunchAttributeClusterDimension, &cv));
      cluster_attr = cv.clusterDim.x * cv.clusterDim.y * cv.clusterDim.z;
    } else {
      CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      launch(st);
      CHECK(cudaStreamEndCapture(st, &g));
      size_t n = 1;
      cudaGraphNode_t node = nullptr;
      CHECK(cudaGraphGetNodes(g, &node, &n));
      if (f == "updatable") {
        cudaLaunchAttributeValue v{};
        v.deviceUpdatableKernelNode.deviceUpdatable = 1;
        CHECK(cudaGraphKernelNodeSetAttribute(node, cudaLaunchAttributeDeviceUpdatableKernelNode,
                                              &v));
      }
      cudaLaunchAttributeValue cv{};
      CHECK(cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeClusterDimension, &cv));
      cluster_attr = cv.clusterDim.x * cv.clusterDim.y * cv.clusterDim.z;
      CHECK(cudaGraphInstantiate(&exec, g, 0));
      CHECK(cudaGraphUpload(exec, st));
    }
    CHECK(cudaGraphLaunch(exec, st));
    CHECK(cudaStreamSynchronize(st));
    unsigned int got[3] = {};
    CHECK(cudaMemcpy(got, counts, sizeof(got), cudaMemcpyDeviceToHost));
    const bool ok = got[0] == kGrid && got[1] == kGrid - 1 && got[2] == kCluster;
    if (!ok) ++failures;
    std::printf(
        "cluster check %-11s: grid %u in clusters of %u: %u CTAs ran, blockIdx.x up to %u, "
        "cluster size %u (node attribute %u): %s\n",
        form, kGrid, kCluster, got[0], got[1], got[2], cluster_attr, ok ? "ok" : "WRONG");
    if (out) {
      std::fprintf(out,
                   "{\"op\":\"handoff_probe_cluster_check\",\"label\":\"%s\",\"form\":\"%s\","
                   "\"grid\":%u,\"cluster\":%u,\"ctas\":%u,\"max_block\":%u,"
                   "\"cluster_seen\":%u,\"ok\":%s}\n",
                   a.label, form, kGrid, kCluster, got[0], got[1], got[2], ok ? "true" : "false");
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
  }
  CHECK(cudaFree(done));
  CHECK(cudaFree(en));
  CHECK(cudaFreeHost(hwords));
  CHECK(cudaFree(counts));
  CHECK(cudaStreamDestroy(st));
  // A finding about the driver, not a failure of the probe: the daemon keeps ops with such
  // kernels in the conditional form (docs/SERVICE.md "Skipping a cancelled call's op").
  std::printf(
      "cluster check: %s\n",
      failures == 0 ? "PASS" : "WRONG grids (the daemon keeps cluster-launched ops conditional)");
}

int GraphCost(const Args& a) {
  Side s;
  SetupSide(&s);
  unsigned int* hwords = nullptr;
  CHECK(cudaHostAlloc(&hwords, 4096, cudaHostAllocMapped));
  std::memset(hwords, 0, 4096);
  unsigned int* hwords_dev = nullptr;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&hwords_dev), hwords, 0));
  unsigned int* dwords = nullptr;
  CHECK(cudaMalloc(&dwords, 4096));
  CHECK(cudaMemset(dwords, 0, 4096));
  unsigned long long* done = nullptr;
  CHECK(cudaMalloc(&done, 64));
  FILE* out = a.out != nullptr ? std::fopen(a.out, "a") : nullptr;
  const int n = a.warmup + a.iters;
  std::vector<uint64_t> st(2 * n);
  const char* forms[] = {"stream",  "graph",        "gated",       "cond_host",  "cond_dev",
                         "cond_in", "cond_dev_set", "cond_in_set", "cond_child", "tail",
                         "en_host", "en_always",    "en_dev"};
  unsigned int* en_words = nullptr;  // [0] nodes left disabled (the lazy gates), [1] errors
  CHECK(cudaMalloc(&en_words, 64));
  CHECK(cudaMemset(en_words, 0, 64));
  const int check_failures = EnableCheck(a, out);
  ClusterCheck(a, out);
  unsigned int* errors = nullptr;
  CHECK(cudaMalloc(&errors, sizeof(unsigned int)));
  CHECK(cudaMemset(errors, 0, sizeof(unsigned int)));
  std::printf("%-8s %-12s %4s %10s %10s %10s\n", "kind", "form", "k", "p50 us", "p90 us",
              "over graph");
  CHECK(cudaFuncSetAttribute(WorkSmem, cudaFuncAttributeMaxDynamicSharedMemorySize, 225 * 1024));
  void* scratch = nullptr;
  CHECK(cudaMalloc(&scratch, 4096));
  uint4* big = nullptr;
  CHECK(cudaMalloc(&big, 4 * kWriteBytes));
  // carveout_fixed last: it sets a lasting attribute on the kernels.
  const char* kinds[] = {"plain",    "smem",   "cluster",         "params",   "memset",
                         "distinct", "writes", "distinct_writes", "carveout", "carveout_fixed"};
  for (const char* kind : kinds)
    for (int k : {1, 4, 8, 16}) {
      if (std::string(kind) != "plain" && k != 4) continue;
      const uint64_t ns = static_cast<uint64_t>(a.b_us * 1000.0);
      if (std::string(kind) == "carveout_fixed") {  // every kernel prefers the most shared memory
        for (const void* f :
             {reinterpret_cast<const void*>(&WorkSmem), reinterpret_cast<const void*>(&DaemonGate),
              reinterpret_cast<const void*>(&DaemonDone), reinterpret_cast<const void*>(&Stamp)}) {
          CHECK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
        }
      }
      double graph_p50 = 0;
      for (const char* form : forms) {
        const std::string f = form;
        cudaGraphExec_t exec = nullptr, tail_body = nullptr;
        cudaGraphNode_t gate = nullptr, dn = nullptr;
        cudaGraphConditionalHandle h = 0;
        unsigned int* words =
            f.rfind("cond_dev", 0) == 0 || f.rfind("cond_in", 0) == 0 || f == "en_dev" ? dwords
                                                                                       : hwords_dev;
        const bool in_body = f.rfind("cond_in", 0) == 0;  // cond_in, cond_in_set
        int cond = f.rfind("cond", 0) == 0 ? 1 : 0;
        const bool enable = f.rfind("en_", 0) == 0;
        int lazy = f == "en_always" ? 0 : 1;
        unsigned int* en_left = en_words;
        unsigned int* en_errors = en_words + 1;
        BodyNodes en_nodes{};
        cudaGraph_t en_graph = nullptr;
        if (enable) {
          CHECK(cudaMemset(en_left, 0, sizeof(unsigned int)));
          EnableGraphOut eg;
          std::string why;
          const bool made = MakeEnableGraph(
              [&](cudaStream_t cap) {
                for (int i = 0; i < k; ++i) BodyKernel(kind, s.sms, ns, cap, scratch, i, big);
              },
              words, lazy, en_left, en_errors, done, &eg, &why);
          if (!made) {
            std::printf("%-8s %-12s %4d  %s\n", kind, form, k, why.c_str());
            continue;
          }
          exec = eg.exec;
          en_graph = eg.graph;
          gate = eg.gate;
          dn = eg.done;
          en_nodes = eg.nodes;
        } else if (f == "tail") {
          // The body: the kernels then DaemonDone, instantiated for device launch and uploaded.
          cudaGraph_t body = nullptr;
          CHECK(cudaGraphCreate(&body, 0));
          cudaStream_t cap = nullptr;
          CHECK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
          CHECK(cudaStreamBeginCaptureToGraph(cap, body, nullptr, nullptr, 0,
                                              cudaStreamCaptureModeThreadLocal));
          for (int i = 0; i < k; ++i) BodyKernel(kind, s.sms, ns, cap, scratch, i, big);
          unsigned long long v = 1;
          DaemonDone<<<1, 1, 0, cap>>>(done, v, words);
          cudaGraph_t captured = nullptr;
          CHECK(cudaStreamEndCapture(cap, &captured));
          const cudaError_t ie =
              cudaGraphInstantiate(&tail_body, body, cudaGraphInstantiateFlagDeviceLaunch);
          if (ie != cudaSuccess) {
            std::printf("%-8s %-12s %4d  not instantiable for device launch: %s\n", kind, form, k,
                        cudaGetErrorString(ie));
            (void)cudaGetLastError();
            CHECK(cudaStreamDestroy(cap));
            continue;
          }
          CHECK(cudaGraphUpload(tail_body, cap));
          CHECK(cudaStreamSynchronize(cap));
          // The parent: the gate alone, itself device-launchable (a kernel that launches a graph
          // runs in a graph).
          cudaGraph_t g = nullptr;
          CHECK(cudaGraphCreate(&g, 0));
          unsigned long long value = 1;
          void* targs[] = {&tail_body, &words, &done, &value, &errors};
          const cudaKernelNodeParams tp = OneThread(&TailGate, targs);
          CHECK(cudaGraphAddKernelNode(&gate, g, nullptr, 0, &tp));
          CHECK(cudaGraphInstantiate(&exec, g, cudaGraphInstantiateFlagDeviceLaunch));
          CHECK(cudaGraphUpload(exec, cap));
          CHECK(cudaStreamSynchronize(cap));
          CHECK(cudaStreamDestroy(cap));
        } else if (f != "stream") {
          cudaGraph_t g = nullptr;
          CHECK(cudaGraphCreate(&g, 0));
          cudaGraph_t target = g;
          cudaGraphNode_t cnode = nullptr;
          cudaStream_t cap = nullptr;
          CHECK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
          if (f != "graph") {
            if (cond) CHECK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
            unsigned long long one = 1;
            void* gargs[] = {&h, &words, &cond};
            void* in_args[] = {&h, &words, &done, &one};
            const cudaKernelNodeParams gp =
                in_body ? OneThread(&DaemonGateDone, in_args) : OneThread(&DaemonGate, gargs);
            CHECK(cudaGraphAddKernelNode(&gate, g, nullptr, 0, &gp));
            cnode = gate;
            if (cond) {
              target = AddIf(g, gate, h, &cnode);
            }
          }
          cudaGraph_t body = target;
          if (f == "cond_child") CHECK(cudaGraphCreate(&body, 0));
          if (f == "gated") {  // the kernels after the gate, in the same graph
            CHECK(cudaStreamBeginCaptureToGraph(cap, g, &gate, nullptr, 1,
                                                cudaStreamCaptureModeThreadLocal));
          } else {
            CHECK(cudaStreamBeginCaptureToGraph(cap, body, nullptr, nullptr, 0,
                                                cudaStreamCaptureModeThreadLocal));
          }
          for (int i = 0; i < k; ++i) BodyKernel(kind, s.sms, ns, cap, scratch, i, big);
          if (in_body) {  // the done store inside the body, after the kernels
            unsigned long long v = 1;
            DaemonDone<<<1, 1, 0, cap>>>(done, v, words);
          }
          cudaGraph_t captured = nullptr;
          CHECK(cudaStreamEndCapture(cap, &captured));
          if (f == "cond_child") {
            cudaGraphNode_t child = nullptr;
            CHECK(cudaGraphAddChildGraphNode(&child, target, nullptr, 0, body));
          }
          if (in_body) dn = Leaves(body).back();  // the body's one leaf: the done store
          if (f != "graph" && !in_body) {
            const std::vector<cudaGraphNode_t> leaves =
                f == "gated" ? Leaves(g) : std::vector<cudaGraphNode_t>{cnode};
            unsigned long long v = 1;
            void* dargs[] = {&done, &v, &words};
            const cudaKernelNodeParams dp = OneThread(&DaemonDone, dargs);
            CHECK(cudaGraphAddKernelNode(&dn, g, leaves.data(), leaves.size(), &dp));
          }
          CHECK(cudaGraphInstantiate(&exec, g, 0));
          CHECK(cudaStreamDestroy(cap));
        }
        for (int i = 0; i < n; ++i) {
          Stamp<<<1, 1, 0, s.stream>>>(s.stamps + 2 * i);
          if (exec == nullptr) {
            for (int j = 0; j < k; ++j) BodyKernel(kind, s.sms, ns, s.stream, scratch, j, big);
          } else {
            if (f == "en_host" || f == "en_always") {  // as cond_host, with the enable gate
              void* gargs[] = {&words, &en_nodes, &lazy, &en_left, &en_errors};
              const cudaKernelNodeParams gp = OneThread(&EnableGate, gargs);
              CHECK(cudaGraphExecKernelNodeSetParams(exec, gate, &gp));
              unsigned long long v = static_cast<unsigned long long>(i + 1);
              void* dargs[] = {&done, &v, &words};
              const cudaKernelNodeParams dp = OneThread(&DaemonDone, dargs);
              CHECK(cudaGraphExecKernelNodeSetParams(exec, dn, &dp));
            }
            if (f == "cond_host" || f == "cond_dev_set" || f == "cond_in_set") {
              // The daemon's per-launch parameter updates: the gate, then the done node (inside
              // the body for cond_in_set).
              unsigned long long gv = static_cast<unsigned long long>(i + 1);
              void* gargs[] = {&h, &words, &cond};
              void* in_args[] = {&h, &words, &done, &gv};
              const cudaKernelNodeParams gp = f == "cond_in_set"
                                                  ? OneThread(&DaemonGateDone, in_args)
                                                  : OneThread(&DaemonGate, gargs);
              CHECK(cudaGraphExecKernelNodeSetParams(exec, gate, &gp));
              unsigned long long v = static_cast<unsigned long long>(i + 1);
              void* dargs[] = {&done, &v, &words};
              const cudaKernelNodeParams dp = OneThread(&DaemonDone, dargs);
              CHECK(cudaGraphExecKernelNodeSetParams(exec, dn, &dp));
            }
            CHECK(cudaGraphLaunch(exec, s.stream));
          }
          Stamp<<<1, 1, 0, s.stream>>>(s.stamps + 2 * i + 1);
        }
        CHECK(cudaStreamSynchronize(s.stream));
        CHECK(cudaMemcpy(st.data(), s.stamps, 2 * n * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        std::vector<double> d;
        for (int i = a.warmup; i < n; ++i) d.push_back((st[2 * i + 1] - st[2 * i]) * 1e-3);
        const double p50 = Pct(d, 0.5);
        if (f == "graph") graph_p50 = p50;
        std::printf("%-8s %-12s %4d %10.2f %10.2f %10.2f\n", kind, form, k, p50, Pct(d, 0.9),
                    f == "stream" ? 0.0 : p50 - graph_p50);
        std::fflush(stdout);
        if (out) {
          std::fprintf(out,
                       "{\"op\":\"handoff_probe_graph_cost\",\"label\":\"%s\",\"kind\":\"%s\","
                       "\"form\":\"%s\","
                       "\"kernels\":%d,\"kernel_us\":%.1f,\"iters\":%d,\"us_p50\":%.3f,"
                       "\"us_p90\":%.3f}\n",
                       a.label, kind, form, k, a.b_us, a.iters, p50, Pct(d, 0.9));
        }
        if (exec != nullptr) CHECK(cudaGraphExecDestroy(exec));
        if (en_graph != nullptr) CHECK(cudaGraphDestroy(en_graph));
        if (tail_body != nullptr) CHECK(cudaGraphExecDestroy(tail_body));
      }
    }
  unsigned int tail_errors = 0, update_errors = 0;
  CHECK(cudaMemcpy(&tail_errors, errors, sizeof(tail_errors), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&update_errors, en_words + 1, sizeof(update_errors), cudaMemcpyDeviceToHost));
  if (tail_errors != 0) std::printf("tail: %u device-side launches failed\n", tail_errors);
  if (update_errors != 0) std::printf("enable: %u device-side updates failed\n", update_errors);
  if (out) std::fclose(out);
  return tail_errors == 0 && update_errors == 0 && check_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (v == nullptr) {
      std::fprintf(stderr, "%s needs a value\n", k.c_str());
      return 2;
    }
    if (k == "--iters") {
      a.iters = std::atoi(v);
    } else if (k == "--warmup") {
      a.warmup = std::atoi(v);
    } else if (k == "--a-us") {
      a.a_us = std::atof(v);
    } else if (k == "--b-us") {
      a.b_us = std::atof(v);
    } else if (k == "--kernels") {
      a.kernels = std::atoi(v);
    } else if (k == "--out") {
      a.out = v;
    } else if (k == "--label") {
      a.label = v;
    } else if (k == "--graph-cost") {
      a.graph_cost = std::atoi(v) != 0;
    } else if (k == "--signal") {
      a.signal = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
    ++i;
  }
  if (a.signal != nullptr) {
    bool known = false;
    for (const Mode& m : kModes) known = known || std::strcmp(m.signal, a.signal) == 0;
    if (!known) {
      std::fprintf(stderr,
                   "--signal %s: not a signal of any mode (memop, kernel, kernel_gpu, event)\n",
                   a.signal);
      return 2;
    }
  }
  if (a.iters < 1 || a.warmup < 0 || a.iters + a.warmup > kMaxIters || a.kernels < 1 ||
      a.a_us < 0 || a.b_us < 0) {
    std::fprintf(stderr, "bad arguments (iters + warmup <= %d, kernels >= 1)\n", kMaxIters);
    return 2;
  }
  if (a.graph_cost) return GraphCost(a);
  void* page = mmap(nullptr, kShared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return 2;
  auto* sh = static_cast<Shared*>(page);
  std::memset(sh, 0, sizeof(Shared));
  Pipes p;
  if (pipe(p.a2b) != 0 || pipe(p.b2a) != 0) return 2;
  const pid_t child = fork();  // before either side touches CUDA
  if (child < 0) return 2;
  if (child == 0) {
    RunB(sh, p, a);
    std::_Exit(0);
  }
  return RunA(sh, p, a, child);
}
