// The decode-step benchmark's C++ frontend (the counterpart of bench/decode_step/decode_step.py;
// docs/BENCHMARKS.md "Decode step"): a step of --layers layers, each its own producer kernel (the
// stand-in for the projections: q from the previous layer's output), the paged DsaAttention
// (FP8 KV, 656-byte rows) through attnd, and a consumer kernel reading out. Every tensor, out and
// lse included, lies in a device region registered once (--regions per_kind: one cudaMalloc and
// one region per kind of tensor, as the Python frontend's torch storages; one: a single
// allocation carved up, one region), so no tensor travels inline.
//
// Paths (one JSON line each, client "cpp", to --out):
//   stream_ordered  each layer is a prepared call; per layer: submit it (submission ring, or
//                   RunPrepared with signals: --submit rpc; or --submit ordered: one
//                   client::OrderedCaller::Call per layer, the bookkeeping the client's), then
//                   on this process's stream
//                   cuStreamWriteValue64 (ready = step) and cuStreamWaitValue64 (done >= step) on
//                   words of a host region mapped into the CUDA context; nothing synchronises
//                   inside the step.
//   blocking        per layer: synchronise the stream, the blocking call, consume. --blocking-via
//                   (one line each): session (DsaAttention on one Session: its stream, no per-call
//                   RPC set-up), unary (the DsaAttention RPC), prepared (RunPrepared of a call
//                   prepared once, without signals: only the call id travels), ring (the
//                   prepared call through a submission ring, SubmissionRing::Call: no RPC per
//                   call; the thread waits for the done word in a host region, polling it for
//                   --wait-spin first; these lines carry no daemon CallStats), ring_stream (a
//                   RingCaller: the stream writes the call's ready word after the producer and
//                   the thread waits for the done word without synchronising the stream).
// The caller never runs more than two steps ahead of its stream (as the Python frontend: the end
// of step i-1 is awaited, by polling, before step i+1 starts), so a full launch queue never
// blocks it inside a measured call. The baseline: the same chain with the DSA kernels launched in
// this process on the same stream, through the operator's own entry (validate, first GPU
// implementation that supports the call, run), as the daemon does, out and lse written alike.
// step_us: median of CUDA events around each step on the stream; added_us_per_layer = (step_us −
// baseline_step_us) / layers; caller_cpu_us_per_call: this thread's CPU time around the call's
// submission and its two stream operations (blocking: around the synchronise and the call), per
// call. Blocking lines also carry the daemon's CallStats (p50 of compute, total, added) and the
// client's wall time per call, so the line itself says where a layer's time goes.
//   decode_step_cpp --target=unix:/tmp/a.sock --out=r.jsonl [--batch=64,128]
//     [--submit=ring|rpc|ordered]
//     [--paths=stream_ordered,blocking] [--blocking-via=session,unary,prepared,ring,ring_stream]
//     [--wait-spin=2000 (µs; blocking via ring)]
//     [--regions=per_kind|one] [--layers=61] [--steps=30] [--warmup=3] [--blocking-steps=5]
//     [--ctx=32768] [--heads=128] [--topk=2048] [--signals=host,device] [--stream-timeout=60]
//     [--commit=SHA] [--mps=auto|true|false] [--no-baseline] [--inline-lse] [--tiny]
// --signals=device puts the words in a device region (a daemon without the device-side wait
// refuses them: the line records the error; with --submit=ring the ring is opened over that
// device region, SubmissionRing::Open's DeviceRegion form). A stream
// that stalls past --stream-timeout seconds (done words never written) has UNSTICK stored into
// its done words so that it goes on; the line then records the error. --inline-lse: blocking
// calls leave lse out, so that it comes back inline in each reply (the form of commit 8e55a36,
// for comparison; lines say "inline_lse": true and skip the lse check).
#include <cuda.h>
#include <cuda_runtime.h>
#include <grpcpp/client_context.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/decode_step/decode_step_kernels.h"
#include "client/client.h"
#include "client/device_region.h"
#include "client/host_region.h"
#include "client/ordered_caller.h"
#include "client/ring_caller.h"
#include "client/session.h"
#include "client/stream_ordered.h"
#include "client/submission_ring.h"
#include "kernels/common/registry.h"
#include "kernels/common/tensor.h"
#include "kernels/dsa/dsa.h"
#include "kernels/dsa/params.h"

namespace attnd::bench::decode_step {
namespace {

using kernels::DType;
using kernels::MakeTensor;
namespace dsa = kernels::dsa;

#define DS_CUDA(expr)                                                                \
  do {                                                                               \
    const cudaError_t e_ = (expr);                                                   \
    if (e_ != cudaSuccess)                                                           \
      return absl::InternalError(absl::StrCat(#expr, ": ", cudaGetErrorString(e_))); \
  } while (0)
#define DS_OK(expr)           \
  do {                        \
    absl::Status s_ = (expr); \
    if (!s_.ok()) return s_;  \
  } while (0)

struct Options {
  std::string target, out, commit = "unknown", mps = "auto";
  std::vector<int64_t> batch = {64, 128};
  std::vector<std::string> paths = {"stream_ordered", "blocking"};
  std::vector<std::string> signals = {"host"};          // and/or "device"
  std::vector<std::string> blocking_via = {"session"};  // and/or "unary", "prepared", "ring"
  int64_t wait_spin_us = 2000;                          // blocking via ring: poll before sleeping
  std::string submit = "ring", regions = "per_kind";    // or "one"
  double stream_timeout = 60;                           // seconds a stream may stall
  int64_t layers = 61, steps = 30, warmup = 3, blocking_steps = 5;
  int64_t heads = 128, d_qk = 576, ctx = 32768, index_heads = 64, index_dim = 128, topk = 2048;
  int64_t block_size = 64;
  bool baseline = true;
  bool inline_lse = false;  // blocking calls leave lse out: it comes back inline (8e55a36's form)
  uint64_t seed = 20261202;
};

double ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// cuStreamWriteValue64 / cuStreamWaitValue64 through the runtime's driver entry points.
using WriteValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
struct StreamOps {
  WriteValueFn write = nullptr, wait = nullptr;
  absl::Status Load() {
    cudaDriverEntryPointQueryResult q;
    void* fn = nullptr;
    DS_CUDA(cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &fn, 12000, cudaEnableDefault,
                                             &q));
    if (q != cudaDriverEntryPointSuccess || fn == nullptr)
      return absl::UnavailableError("cuStreamWriteValue64 not found");
    write = reinterpret_cast<WriteValueFn>(fn);
    DS_CUDA(
        cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || fn == nullptr)
      return absl::UnavailableError("cuStreamWaitValue64 not found");
    wait = reinterpret_cast<WriteValueFn>(fn);
    return absl::OkStatus();
  }
};

// A device allocation registered as one device region.
struct Buffer {
  std::string region;
  char* base = nullptr;
  uint64_t size = 0;
  std::shared_ptr<client::DeviceRegion> registered = nullptr;  // once registered
};

struct Model {
  int64_t batch = 0, layers = 0, t = 0, heads = 0, d_qk = 0, hi = 0, di = 0, bs = 0, topk = 0;
  int64_t max_blocks = 0, num_blocks = 0, kv_rows = 0, ctx = 0;
  float sm_scale = 0;
  std::vector<Buffer> buffers;
  uint8_t *index_cache = nullptr, *kv = nullptr, *index_q = nullptr, *iq_base = nullptr;
  int32_t *block_table = nullptr, *context_lens = nullptr;
  uint16_t *q = nullptr, *q_base = nullptr, *out = nullptr, *check_out = nullptr, *acc = nullptr;
  float *index_weights = nullptr, *lse = nullptr, *check_lse = nullptr;
  void* words = nullptr;  // 2·layers signal words, 64 bytes apart (--signals=device)

  int64_t QElems() const { return t * heads * d_qk; }
  int64_t OutElems() const { return t * heads * 512; }
  int64_t LseElems() const { return t * heads; }
  int64_t IqBytes() const { return batch * hi * di; }
  uint16_t* Q(int64_t l) const { return q + l * QElems(); }
  uint16_t* Out(int64_t l) const { return out + l * OutElems(); }
  float* Lse(int64_t l) const { return lse + l * LseElems(); }
  uint8_t* Iq(int64_t l) const { return index_q + l * IqBytes(); }
  float* Iw(int64_t l) const { return index_weights + l * t * hi; }

  // The buffer holding p (null when none does).
  const Buffer* Holding(const void* p) const {
    const char* c = static_cast<const char*>(p);
    for (const Buffer& b : buffers)
      if (c >= b.base && c < b.base + b.size) return &b;
    return nullptr;
  }

  // Layer l's call; check: into check_out / check_lse instead of the layer's own out and lse.
  dsa::Params Params(int64_t l, bool check = false) const {
    dsa::Params p;
    p.index_q = MakeTensor(Iq(l), DType::kFp8E4M3, {batch, 1, hi, di});
    p.index_weights = MakeTensor(Iw(l), DType::kF32, {t, hi});
    p.index_cache = MakeTensor(index_cache, DType::kU8, {num_blocks, bs * (di + 4)});
    p.index_block_size = bs;
    p.index_block_table = MakeTensor(block_table, DType::kI32, {batch, max_blocks});
    p.context_lens = MakeTensor(context_lens, DType::kI32, {batch});
    p.q = MakeTensor(Q(l), DType::kBF16, {t, heads, d_qk});
    p.kv = MakeTensor(kv, DType::kU8, {kv_rows, 656});
    p.topk = topk;
    p.sm_scale = sm_scale;
    // lse in a region too: the daemon always returns it (docs/SERVICE.md "Tensors"), so left
    // absent it comes back inline in every reply, and a prepared call, which takes no inline
    // tensor, is refused.
    p.out = MakeTensor(check ? check_out : Out(l), DType::kBF16, {t, heads, 512});
    p.lse = MakeTensor(check ? check_lse : Lse(l), DType::kF32, {t, heads});
    return p;
  }
};

// The model's tensors: with --regions=one carved (256-byte aligned) from one allocation, else one
// allocation each, rounded up to 2 MiB so that the runtime never packs two small ones together
// (an IPC handle names a whole allocation, and the daemon maps a region from the base of what its
// handle names). `at` receives their addresses in the order of `parts`.
absl::Status Allocate(const std::string& mode, const std::string& prefix,
                      const std::vector<std::pair<std::string, uint64_t>>& parts, Model* m,
                      std::vector<void*>* at) {
  constexpr uint64_t kTwoMiB = uint64_t{1} << 21;
  auto aligned = [](uint64_t b) { return (b + 255) & ~uint64_t{255}; };
  if (mode == "one") {
    uint64_t total = 0;
    for (const auto& part : parts) total += aligned(part.second);
    void* base = nullptr;
    DS_CUDA(cudaMalloc(&base, total));
    m->buffers.push_back(Buffer{prefix, static_cast<char*>(base), total});
    uint64_t offset = 0;
    for (const auto& part : parts) {
      at->push_back(static_cast<char*>(base) + offset);
      offset += aligned(part.second);
    }
    return absl::OkStatus();
  }
  for (const auto& [name, bytes] : parts) {
    void* base = nullptr;
    DS_CUDA(cudaMalloc(&base, (bytes + kTwoMiB - 1) / kTwoMiB * kTwoMiB));
    m->buffers.push_back(Buffer{absl::StrCat(prefix, "-", name), static_cast<char*>(base), bytes});
    at->push_back(base);
  }
  return absl::OkStatus();
}

absl::Status BuildModel(const Options& o, int64_t batch, cudaStream_t stream, Model* m) {
  m->batch = batch;
  m->layers = o.layers;
  m->t = batch;  // next_n 1
  m->heads = o.heads;
  m->d_qk = o.d_qk;
  m->hi = o.index_heads;
  m->di = o.index_dim;
  m->bs = o.block_size;
  m->topk = o.topk;
  m->ctx = o.ctx;
  m->max_blocks = (o.ctx + o.block_size - 1) / o.block_size;
  m->num_blocks = batch * m->max_blocks + 1;
  m->kv_rows = m->num_blocks * m->bs;
  m->sm_scale = 1.0f / std::sqrt(static_cast<float>(o.d_qk));
  const uint64_t L = o.layers;
  auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  const std::vector<std::pair<std::string, uint64_t>> parts = {
      {"index_cache", u(m->num_blocks * m->bs * (m->di + 4))},
      {"kv", u(m->kv_rows) * 656},
      {"block_table", u(batch * m->max_blocks * 4)},
      {"context_lens", u(batch * 4)},
      {"q", L * m->QElems() * 2},
      {"q_base", u(m->QElems() * 2)},
      {"index_q", L * m->IqBytes()},
      {"iq_base", u(m->IqBytes())},
      {"index_weights", L * m->t * m->hi * 4},
      {"out", L * m->OutElems() * 2},
      {"check_out", u(m->OutElems() * 2)},
      {"acc", u(m->OutElems() * 2)},
      {"lse", L * m->LseElems() * 4},
      {"check_lse", u(m->LseElems() * 4)},
      {"words", L * 2 * 64},
  };
  std::vector<void*> at;
  DS_OK(Allocate(o.regions, absl::StrCat("ds-cpp-", getpid(), "-", batch), parts, m, &at));
  m->index_cache = static_cast<uint8_t*>(at[0]);
  m->kv = static_cast<uint8_t*>(at[1]);
  m->block_table = static_cast<int32_t*>(at[2]);
  m->context_lens = static_cast<int32_t*>(at[3]);
  m->q = static_cast<uint16_t*>(at[4]);
  m->q_base = static_cast<uint16_t*>(at[5]);
  m->index_q = static_cast<uint8_t*>(at[6]);
  m->iq_base = static_cast<uint8_t*>(at[7]);
  m->index_weights = static_cast<float*>(at[8]);
  m->out = static_cast<uint16_t*>(at[9]);
  m->check_out = static_cast<uint16_t*>(at[10]);
  m->acc = static_cast<uint16_t*>(at[11]);
  m->lse = static_cast<float*>(at[12]);
  m->check_lse = static_cast<float*>(at[13]);
  m->words = at[14];
  FillIndexCache(m->index_cache, m->num_blocks, m->bs, m->di, o.seed + 1, stream);
  FillKvFp8(m->kv, m->kv_rows, o.seed + 2, stream);
  FillBf16(m->q_base, m->QElems(), 0.5f, o.seed + 3, stream);
  FillFp8(m->iq_base, m->IqBytes(), o.seed + 4, stream);
  FillF32(m->index_weights, L * m->t * m->hi, 1.0f, o.seed + 5, stream);
  FillValue(m->out, L * m->OutElems(), 0x7fc0, stream);  // NaN: a layer never written shows
  DS_CUDA(cudaMemsetAsync(m->lse, 0xff, L * m->LseElems() * 4, stream));  // f32 NaN likewise
  FillValue(m->acc, m->OutElems(), 0, stream);
  FillI32(m->context_lens, batch, static_cast<int32_t>(o.ctx), stream);
  for (int64_t l = 0; l < m->layers; ++l) {
    DS_CUDA(cudaMemcpyAsync(m->Q(l), m->q_base, m->QElems() * 2, cudaMemcpyDeviceToDevice, stream));
    DS_CUDA(cudaMemcpyAsync(m->Iq(l), m->iq_base, m->IqBytes(), cudaMemcpyDeviceToDevice, stream));
  }
  // The block table: a random permutation of the blocks (block 0..num_blocks-1), on the host.
  std::vector<int32_t> perm(m->num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(o.seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  DS_CUDA(
      cudaMemcpy(m->block_table, perm.data(), batch * m->max_blocks * 4, cudaMemcpyHostToDevice));
  DS_CUDA(cudaGetLastError());
  DS_CUDA(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

// Registers each of the model's allocations as a device region of `client` (its IPC handle).
absl::Status RegisterModel(client::Client* client, const std::string& device_uuid, Model* m) {
  for (Buffer& b : m->buffers) {
    cudaIpcMemHandle_t handle;
    DS_CUDA(cudaIpcGetMemHandle(&handle, b.base));
    client::DeviceRegionOptions o;
    o.name = b.region;
    o.raw_handle.assign(reinterpret_cast<const char*>(&handle), sizeof handle);
    o.device_uuid = device_uuid;
    o.allocation = b.base;
    o.bytes = b.size;
    o.timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<client::DeviceRegion>> r =
        client::DeviceRegion::Register(client, o);
    if (!r.ok()) {
      return absl::Status(r.status().code(), absl::StrCat("RegisterDeviceRegion ", b.region, ": ",
                                                          r.status().message()));
    }
    b.registered = *std::move(r);
  }
  return absl::OkStatus();
}

void ReleaseModel(client::Client* /*client*/, Model* m) {
  for (Buffer& b : m->buffers) {
    if (b.registered != nullptr) (void)b.registered->Close();
    b.registered.reset();
    cudaFree(b.base);
  }
  m->buffers.clear();
}

// The in-process DSA: the operator's entry as the daemon runs it.
struct Inproc {
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

absl::Status InprocPrepare(const Model& m, cudaStream_t stream, Inproc* ip) {
  dsa::Params p = m.Params(0);
  kernels::ExecContext ctx;
  ctx.backend = kernels::kGpuBackend;
  ctx.stream = stream;
  DS_OK(dsa::Validate(p));
  std::string why;
  const auto* impl = kernels::SelectImpl(dsa::Implementations(), p, ctx, &why);
  if (impl == nullptr) return absl::UnimplementedError("no GPU implementation: " + why);
  ip->workspace_bytes = impl->workspace ? impl->workspace(p) : 0;
  if (ip->workspace_bytes > 0) DS_CUDA(cudaMalloc(&ip->workspace, ip->workspace_bytes));
  return absl::OkStatus();
}

absl::Status InprocRun(const dsa::Params& p, const Inproc& ip, cudaStream_t stream) {
  kernels::ExecContext ctx;
  ctx.backend = kernels::kGpuBackend;
  ctx.stream = stream;
  ctx.workspace = ip.workspace;
  ctx.workspace_bytes = ip.workspace_bytes;
  std::string name;
  return dsa::Run(p, ctx, &name);
}

struct LoopResult {
  double step_us = 0, step_us_min = 0, step_us_max = 0, caller_cpu_us_per_call = 0;
  double host_wall_us_per_step = 0;
};

// What stream-ordered runs store into done words the daemon never wrote, so that a stream
// waiting on them goes on (the run then reports the stall).
constexpr uint64_t kUnstick = uint64_t{1} << 62;

struct Events {
  std::vector<cudaEvent_t> ev;
  ~Events() {
    for (cudaEvent_t e : ev) cudaEventDestroy(e);
  }
  absl::Status Make(size_t n, unsigned flags) {
    for (size_t i = 0; i < n; ++i) {
      cudaEvent_t e;
      DS_CUDA(cudaEventCreateWithFlags(&e, flags));
      ev.push_back(e);
    }
    return absl::OkStatus();
  }
};

// Waits until the stream has passed `e`, polling (the thread sleeps, so its CPU time is not
// spent). Past `timeout` seconds `unstick` (when given) is called every 50 ms until it has, and
// the wait reports the stall; without it the wait gives up.
absl::Status Await(cudaEvent_t e, double timeout, const std::function<void()>& unstick) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  bool stalled = false;
  for (;;) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady)
      return absl::InternalError(absl::StrCat("cudaEventQuery: ", cudaGetErrorString(q)));
    const Clock::time_point now = Clock::now();
    if (std::chrono::duration<double>(now - start).count() > timeout) {
      if (!unstick)
        return absl::DeadlineExceededError(
            absl::StrCat("the stream did not pass an event in ", timeout, " s"));
      if (!stalled || now - last > std::chrono::milliseconds(50)) {
        unstick();
        last = now;
      }
      stalled = true;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (stalled)
    return absl::DeadlineExceededError(
        absl::StrCat("the stream stalled past --stream-timeout (", timeout,
                     " s): done words not written; UNSTICK was stored into them"));
  return absl::OkStatus();
}

// Warm-up steps, a wait for the stream, then the measured steps (timing events around each on
// `stream`). After each step the thread waits for the end of the step before it: it stays at
// most two steps ahead of the stream, never blocking in a full launch queue. layer_fn(layer,
// step_value) returns the caller CPU ns of its call. `unstick` frees a stalled stream
// (stream-ordered runs).
template <class F>
absl::StatusOr<LoopResult> Loop(const Options& o, int64_t steps, Model* m, uint64_t* seq,
                                cudaStream_t stream, F layer_fn,
                                const std::function<void()>& unstick = {}) {
  Events ends, timing;
  DS_OK(ends.Make(o.warmup + steps + 1, cudaEventDisableTiming));
  DS_OK(timing.Make(2 * steps, cudaEventDefault));
  size_t n_end = 0;
  auto step_end = [&]() -> absl::Status {
    DS_CUDA(cudaEventRecord(ends.ev[n_end], stream));
    ++n_end;
    return n_end >= 2 ? Await(ends.ev[n_end - 2], o.stream_timeout, unstick) : absl::OkStatus();
  };
  auto drained = [&]() -> absl::Status {
    if (n_end == 0) return absl::OkStatus();
    return Await(ends.ev[n_end - 1], o.stream_timeout, unstick);
  };
  // An error goes up once the stream is past what was enqueued (freed when it must be).
  auto fail = [&](const absl::Status& s) -> absl::Status {
    if (cudaEventRecord(ends.ev.back(), stream) == cudaSuccess)
      (void)Await(ends.ev.back(), o.stream_timeout, unstick);
    return s;
  };
  for (int64_t w = 0; w < o.warmup; ++w) {
    ++*seq;
    for (int64_t l = 0; l < m->layers; ++l) {
      absl::StatusOr<double> r = layer_fn(l, *seq);
      if (!r.ok()) return fail(r.status());
    }
    if (absl::Status s = step_end(); !s.ok()) return fail(s);
  }
  if (absl::Status s = drained(); !s.ok()) return fail(s);
  DS_CUDA(cudaStreamSynchronize(stream));
  double cpu_ns = 0;
  const auto w0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    ++*seq;
    DS_CUDA(cudaEventRecord(timing.ev[2 * i], stream));
    for (int64_t l = 0; l < m->layers; ++l) {
      absl::StatusOr<double> r = layer_fn(l, *seq);
      if (!r.ok()) return fail(r.status());
      cpu_ns += *r;
    }
    DS_CUDA(cudaEventRecord(timing.ev[2 * i + 1], stream));
    if (absl::Status s = step_end(); !s.ok()) return fail(s);
  }
  if (absl::Status s = drained(); !s.ok()) return fail(s);
  DS_CUDA(cudaStreamSynchronize(stream));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  std::vector<double> us;
  for (int64_t i = 0; i < steps; ++i) {
    float ms = 0;
    DS_CUDA(cudaEventElapsedTime(&ms, timing.ev[2 * i], timing.ev[2 * i + 1]));
    us.push_back(ms * 1e3);
  }
  LoopResult r;
  std::vector<double> sorted = us;
  std::sort(sorted.begin(), sorted.end());
  r.step_us = sorted[sorted.size() / 2];
  r.step_us_min = sorted.front();
  r.step_us_max = sorted.back();
  r.caller_cpu_us_per_call = cpu_ns / (steps * m->layers) / 1e3;
  r.host_wall_us_per_step = wall / steps * 1e6;
  return r;
}

// Signal words, one per cache line: in a host region mapped into this CUDA context ("host"), or
// in the model's device region ("device": the stream operations address device memory, which
// only a daemon with the device-side wait accepts).
struct Words {
  static constexpr uint64_t kSpacing = 64;
  std::unique_ptr<client::HostRegion> region;  // host words only
  std::string region_name;
  uint64_t base = 0;  // offset of word 0 in region_name
  char* host = nullptr;
  CUdeviceptr device = 0;
  bool registered = false;
  uint64_t Offset(int64_t i) const { return base + i * kSpacing; }
  CUdeviceptr Device(int64_t i) const { return device + i * kSpacing; }
  uint64_t Read(int64_t i) const {  // after the stream is synchronised
    if (host != nullptr)
      return client::LoadSignal(reinterpret_cast<uint64_t*>(host + i * kSpacing));
    uint64_t v = 0;
    cudaMemcpy(&v, reinterpret_cast<void*>(Device(i)), 8, cudaMemcpyDeviceToHost);
    return v;
  }
  ~Words() {
    if (registered) cudaHostUnregister(region->data());
  }
};

absl::Status MakeWords(client::Client* client, const Model& m, const std::string& kind, Words* w) {
  const int64_t count = 2 * m.layers;
  if (kind == "device") {
    const Buffer* b = m.Holding(m.words);
    if (b == nullptr) return absl::InternalError("the signal words lie in no region");
    w->region_name = b->region;
    w->base = static_cast<char*>(m.words) - b->base;
    w->device = reinterpret_cast<CUdeviceptr>(m.words);
    DS_CUDA(cudaMemset(m.words, 0, count * Words::kSpacing));
    return absl::OkStatus();
  }
  client::HostRegionOptions ho;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  ho.bytes = (count * Words::kSpacing + page - 1) / page * page;
  ho.name = absl::StrCat("ds-cpp-words-", getpid());
  absl::StatusOr<std::unique_ptr<client::HostRegion>> r = client::HostRegion::Create(client, ho);
  if (!r.ok()) return r.status();
  w->region = std::move(*r);
  w->region_name = w->region->name();
  w->host = w->region->data();
  std::memset(w->region->data(), 0, w->region->size());
  DS_CUDA(cudaHostRegister(w->region->data(), w->region->size(),
                           cudaHostRegisterPortable | cudaHostRegisterMapped));
  w->registered = true;
  void* dp = nullptr;
  DS_CUDA(cudaHostGetDevicePointer(&dp, w->region->data(), 0));
  w->device = reinterpret_cast<CUdeviceptr>(dp);
  return absl::OkStatus();
}

std::string J(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream s;
  s.precision(6);
  s << v;
  return s.str();
}

std::string Q(const std::string& v) {
  std::string r = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') r += '\\';
    r += (c == '\n' ? ' ' : c);
  }
  return r + "\"";
}

// The last layer's out and lse against the in-process kernels on the same inputs (or a blocking
// call without a baseline).
std::string Check(const Model& m, const Inproc* ip, client::Client* client, cudaStream_t stream,
                  bool check_lse) {
  cudaStreamSynchronize(stream);
  const int64_t l = m.layers - 1, n = m.OutElems(), nl = m.LseElems();
  FillValue(m.check_out, n, 0x7fc0, stream);
  cudaMemsetAsync(m.check_lse, 0xff, nl * 4, stream);
  dsa::Params p = m.Params(l, /*check=*/true);
  std::string against;
  if (ip != nullptr) {
    against = "inproc";
    if (absl::Status s = InprocRun(p, *ip, stream); !s.ok())
      return absl::StrCat(", \"check\": \"error\", \"check_detail\": ", Q(s.ToString()));
  } else {
    against = "blocking";
    cudaStreamSynchronize(stream);
    absl::StatusOr<client::CallResult> r = client->DsaAttention(p);
    if (!r.ok())
      return absl::StrCat(", \"check\": \"error\", \"check_detail\": ", Q(r.status().ToString()));
  }
  std::vector<uint16_t> got(n), want(n);
  std::vector<float> got_lse(nl), want_lse(nl);
  cudaStreamSynchronize(stream);
  cudaMemcpy(got.data(), m.Out(l), n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(want.data(), m.check_out, n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(got_lse.data(), m.Lse(l), nl * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(want_lse.data(), m.check_lse, nl * 4, cudaMemcpyDeviceToHost);
  auto f = [](uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return static_cast<double>(v);
  };
  double num = 0, den = 0, max_abs = 0, scale = 0;
  bool nan = false, equal = true;
  for (int64_t i = 0; i < n; ++i) {
    const double g = f(got[i]), w = f(want[i]);
    if (std::isnan(g)) nan = true;
    equal = equal && got[i] == want[i];
    num += (g - w) * (g - w);
    den += w * w;
    max_abs = std::max(max_abs, std::fabs(g - w));
    scale = std::max(scale, std::fabs(w));
  }
  std::string verdict;
  if (nan) {
    verdict = "fail";
  } else if (equal) {
    verdict = "bitwise";
  } else {
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    verdict = rel <= 1e-2 && max_abs <= 2e-2 * std::max(scale, 1.0) ? "close" : "fail";
  }
  // lse (natural log, f32): equal, or within 1e-3 relative (−inf only where the reference has it).
  bool lse_equal = std::memcmp(got_lse.data(), want_lse.data(), nl * 4) == 0, lse_ok = true;
  double lse_max_abs = 0;
  for (int64_t i = 0; i < nl; ++i) {
    const double g = got_lse[i], w = want_lse[i];
    if (g == w) continue;
    const double d = std::fabs(g - w);
    if (!(d <= 1e-3 * std::max(1.0, std::fabs(w)))) lse_ok = false;  // NaN fails too
    if (std::isfinite(d)) lse_max_abs = std::max(lse_max_abs, d);
  }
  const char* lse_verdict = !check_lse  ? "skipped"
                            : lse_equal ? "bitwise"
                            : lse_ok    ? "close"
                                        : "fail";
  return absl::StrCat(", \"check\": ", Q(verdict), ", \"check_against\": ", Q(against),
                      ", \"check_max_abs\": ", J(max_abs),
                      ", \"check_rel_l2\": ", J(std::sqrt(num / std::max(den, 1e-30))),
                      nan ? ", \"check_detail\": \"NaN in out\"" : "",
                      ", \"check_lse\": ", Q(lse_verdict),
                      ", \"check_lse_max_abs\": ", J(lse_max_abs));
}

// A submission ring of at least 2 · layers entries in a host region of its own, its signal words
// in `words`.
absl::Status OpenRing(client::Client* client, const Model& m, const Words& words,
                      std::unique_ptr<client::HostRegion>* ring_region,
                      std::unique_ptr<client::SubmissionRing>* ring) {
  uint32_t entries = 64;
  while (entries < 2 * m.layers) entries *= 2;
  client::HostRegionOptions ho;
  ho.bytes = client::ring_layout::Bytes(entries);
  ho.name = absl::StrCat("ds-cpp-ring-", getpid(), "-", m.batch);
  absl::StatusOr<std::unique_ptr<client::HostRegion>> r = client::HostRegion::Create(client, ho);
  if (!r.ok()) return r.status();
  *ring_region = std::move(*r);
  absl::StatusOr<std::unique_ptr<client::SubmissionRing>> opened;
  if (words.region != nullptr) {
    opened = client::SubmissionRing::Open(client, **ring_region, 0, entries, words.region.get());
  } else {  // device words: the region registered over the words' buffer
    const Buffer* b = m.Holding(m.words);
    if (b == nullptr || b->registered == nullptr) {
      return absl::InternalError("the device signal words lie in no registered region");
    }
    opened = client::SubmissionRing::Open(client, **ring_region, 0, entries, *b->registered);
  }
  if (!opened.ok()) return opened.status();
  *ring = std::move(*opened);
  return absl::OkStatus();
}

absl::StatusOr<LoopResult> RunStreamOrdered(const Options& o, client::Client* client, Model* m,
                                            const StreamOps& ops, const std::string& signals,
                                            uint64_t* seq, cudaStream_t stream,
                                            std::string* extra) {
  Words words;
  DS_OK(MakeWords(client, *m, signals, &words));
  std::vector<uint64_t> ids;
  auto release = [&] {
    for (uint64_t id : ids) (void)client::ReleaseCall(client, id);
  };
  for (int64_t l = 0; l < m->layers; ++l) {
    absl::StatusOr<uint64_t> id = client::PrepareCall(client, m->Params(l));
    if (!id.ok()) {
      release();
      return id.status();
    }
    ids.push_back(*id);
  }
  std::unique_ptr<client::HostRegion> ring_region;
  std::unique_ptr<client::SubmissionRing> ring;
  if (o.submit == "ring") {
    if (absl::Status s = OpenRing(client, *m, words, &ring_region, &ring); !s.ok()) {
      release();
      return s;
    }
  }
  // Frees a stalled stream: UNSTICK into every done word (host words from here; device words by a
  // stream write on a side stream, not behind the stuck wait).
  cudaStream_t side = nullptr;
  if (words.host == nullptr) DS_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  auto unstick = [&] {
    for (int64_t l = 0; l < m->layers; ++l) {
      if (words.host != nullptr) {
        client::StoreSignal(reinterpret_cast<uint64_t*>(words.host + (2 * l + 1) * Words::kSpacing),
                            kUnstick);
      } else {
        (void)ops.write(reinterpret_cast<CUstream>(side), words.Device(2 * l + 1), kUnstick,
                        CU_STREAM_WRITE_VALUE_DEFAULT);
      }
    }
  };
  int64_t full = 0;
  auto layer = [&](int64_t l, uint64_t n) -> absl::StatusOr<double> {
    Produce(m->Q(l), m->q_base, m->acc, m->t * m->heads, m->d_qk, m->Iq(l), m->iq_base,
            m->IqBytes(), stream);
    const double t0 = ThreadCpuNs();
    const uint64_t r_off = words.Offset(2 * l), d_off = words.Offset(2 * l + 1);
    if (ring != nullptr) {
      absl::StatusCode c;
      const auto since = std::chrono::steady_clock::now();
      while ((c = ring->Submit(ids[l], r_off, n, d_off, n)) ==
             absl::StatusCode::kResourceExhausted) {
        ++full;
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count() >
            o.stream_timeout)
          return absl::DeadlineExceededError("the submission ring stayed full");
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      if (c != absl::StatusCode::kOk) return absl::Status(c, "the submission ring refused");
    } else {
      absl::StatusOr<v1::CallStats> s =
          client::RunPrepared(client, ids[l], client::Signal{words.region_name, r_off, n},
                              client::Signal{words.region_name, d_off, n});
      if (!s.ok()) return s.status();
    }
    CUresult w = ops.write(reinterpret_cast<CUstream>(stream), words.Device(2 * l), n,
                           CU_STREAM_WRITE_VALUE_DEFAULT);
    CUresult v = ops.wait(reinterpret_cast<CUstream>(stream), words.Device(2 * l + 1), n,
                          CU_STREAM_WAIT_VALUE_GEQ);
    const double t1 = ThreadCpuNs();
    if (w != CUDA_SUCCESS || v != CUDA_SUCCESS)
      return absl::InternalError(absl::StrCat("stream memory operations: CUresult ", w, " / ", v));
    Consume(m->acc, m->Out(l), m->OutElems(), stream);
    return t1 - t0;
  };
  absl::StatusOr<LoopResult> r = Loop(o, o.steps, m, seq, stream, layer, unstick);
  int64_t failed = 0, stale = 0;
  for (int64_t l = 0; l < m->layers; ++l) {
    const uint64_t d = words.Read(2 * l + 1);
    if (d & client::kSignalFailureBit)
      ++failed;
    else if (d != *seq)
      ++stale;
  }
  *extra = absl::StrCat(", \"failed_layers\": ", failed, ", \"stale_layers\": ", stale,
                        ", \"done_words_ok\": ", failed == 0 && stale == 0 ? "true" : "false",
                        ", \"ring_full_retries\": ", full);
  if (ring != nullptr) (void)ring->Close();
  release();
  if (side != nullptr) cudaStreamDestroy(side);
  if (r.ok() && (failed || stale))
    return absl::InternalError(absl::StrCat("done words: ", failed, " failed, ", stale, " stale"));
  return r;
}

// --submit=ordered: the stream-ordered path through client::OrderedCaller, one Call per layer
// (its prepared call made on the first step and kept; the ready and done words in the caller's
// own region, registered mapped with CUDA; the stream hooks are the two stream memory
// operations at the words' device addresses). The caller CPU per call is the client's whole
// cost: the request encoded and looked up, the ring entry, the two stream operations.
absl::StatusOr<LoopResult> RunOrderedCaller(const Options& o, client::Client* client, Model* m,
                                            const StreamOps& ops, uint64_t* seq,
                                            cudaStream_t stream, std::string* extra) {
  client::OrderedCallerOptions co;
  co.depth = static_cast<uint32_t>(std::min<int64_t>(4096, 4 * m->layers));
  co.timeout = absl::Seconds(o.stream_timeout);
  absl::StatusOr<std::unique_ptr<client::OrderedCaller>> opened =
      client::OrderedCaller::Open(client, co);
  if (!opened.ok()) return opened.status();
  std::unique_ptr<client::OrderedCaller> caller = std::move(*opened);
  const client::HostRegion& r = caller->region();
  DS_CUDA(cudaHostRegister(r.data(), r.size(), cudaHostRegisterPortable | cudaHostRegisterMapped));
  void* dp = nullptr;
  if (const cudaError_t e = cudaHostGetDevicePointer(&dp, r.data(), 0); e != cudaSuccess) {
    cudaHostUnregister(r.data());
    return absl::InternalError(absl::StrCat("cudaHostGetDevicePointer: ", cudaGetErrorString(e)));
  }
  const CUdeviceptr device = reinterpret_cast<CUdeviceptr>(dp);
  const char* base = r.data();
  auto op = [&](bool write, uint64_t* word, uint64_t value) -> absl::Status {
    const CUdeviceptr at = device + (reinterpret_cast<char*>(word) - base);
    const CUresult cr =
        write ? ops.write(reinterpret_cast<CUstream>(stream), at, value,
                          CU_STREAM_WRITE_VALUE_DEFAULT)
              : ops.wait(reinterpret_cast<CUstream>(stream), at, value, CU_STREAM_WAIT_VALUE_GEQ);
    return cr == CUDA_SUCCESS ? absl::OkStatus()
                              : absl::InternalError(absl::StrCat("stream memory operation: ", cr));
  };
  client::StreamHooks hooks;
  hooks.write = [&](uint64_t* word, uint64_t value) { return op(true, word, value); };
  hooks.wait = [&](uint64_t* word, uint64_t value) { return op(false, word, value); };
  auto layer = [&](int64_t l, uint64_t) -> absl::StatusOr<double> {
    Produce(m->Q(l), m->q_base, m->acc, m->t * m->heads, m->d_qk, m->Iq(l), m->iq_base,
            m->IqBytes(), stream);
    const double t0 = ThreadCpuNs();
    absl::StatusOr<uint64_t> n = caller->Call(m->Params(l), &hooks);
    const double t1 = ThreadCpuNs();
    if (!n.ok()) return n.status();
    Consume(m->acc, m->Out(l), m->OutElems(), stream);
    return t1 - t0;
  };
  // A stalled stream: the pending calls' done words get the failure bit (they go on).
  absl::StatusOr<LoopResult> res =
      Loop(o, o.steps, m, seq, stream, layer, [&] { caller->Abort(); });
  absl::Status waited =
      caller->Wait(client::OrderedCaller::kLatest, absl::Seconds(o.stream_timeout));
  if (!waited.ok()) caller->Abort();
  cudaStreamSynchronize(stream);  // past its last wait before the words are unmapped
  cudaHostUnregister(r.data());
  *extra = absl::StrCat(", \"prepares\": ", caller->prepares(),
                        ", \"done_words_ok\": ", waited.ok() ? "true" : "false");
  absl::Status closed = caller->Close();
  if (res.ok() && !waited.ok()) return waited;
  if (res.ok() && !closed.ok()) return closed;
  return res;
}

double P50(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The blocking form, `via` a Session, the unary RPC, RunPrepared of calls prepared once, or those
// through a submission ring (SubmissionRing::Call). extra: the daemon's CallStats (p50 over the
// measured calls; none through the ring) and the client's wall time per call.
absl::StatusOr<LoopResult> RunBlocking(const Options& o, client::Client* client, Model* m,
                                       const StreamOps& ops, const std::string& via, uint64_t* seq,
                                       cudaStream_t stream, std::string* extra) {
  std::vector<dsa::Params> params;
  for (int64_t l = 0; l < m->layers; ++l) {
    params.push_back(m->Params(l));
    if (o.inline_lse) params.back().lse = kernels::Tensor();
  }
  std::unique_ptr<client::Session> session;
  std::vector<uint64_t> ids;
  Words words;  // via ring: the done words
  std::unique_ptr<client::HostRegion> ring_region;
  std::unique_ptr<client::SubmissionRing> ring;
  std::unique_ptr<client::RingCaller> caller;  // via ring_stream
  CUdeviceptr ready_device = 0;                // its ready word, mapped into this context
  bool caller_registered = false;
  auto release = [&] {
    if (caller_registered) cudaHostUnregister(caller->region().data());
    if (caller != nullptr) (void)caller->Close();
    if (ring != nullptr) (void)ring->Close();
    for (uint64_t id : ids) (void)client::ReleaseCall(client, id);
    if (session != nullptr) (void)session->Close();
  };
  if (via == "session") {
    absl::StatusOr<std::unique_ptr<client::Session>> s = client::Session::Open(client);
    if (!s.ok()) return s.status();
    session = std::move(*s);
  } else if (via == "prepared" || via == "ring" || via == "ring_stream") {
    for (int64_t l = 0; l < m->layers; ++l) {
      absl::StatusOr<uint64_t> id = client::PrepareCall(client, params[l]);
      if (!id.ok()) {
        release();
        return id.status();
      }
      ids.push_back(*id);
    }
  }
  if (via == "ring") {
    absl::Status s = MakeWords(client, *m, "host", &words);
    if (s.ok()) s = OpenRing(client, *m, words, &ring_region, &ring);
    if (!s.ok()) {
      release();
      return s;
    }
  }
  if (via == "ring_stream") {
    client::RingCallerOptions co;
    co.entries = 64;
    co.spin = absl::Microseconds(o.wait_spin_us);
    absl::StatusOr<std::unique_ptr<client::RingCaller>> opened =
        client::RingCaller::Open(client, co);
    absl::Status s = opened.status();
    if (s.ok()) {
      caller = std::move(*opened);
      const client::HostRegion& r = caller->region();
      cudaError_t e =
          cudaHostRegister(r.data(), r.size(), cudaHostRegisterPortable | cudaHostRegisterMapped);
      void* dp = nullptr;
      if (e == cudaSuccess) {
        caller_registered = true;
        e = cudaHostGetDevicePointer(&dp, r.data(), 0);
      }
      if (e != cudaSuccess) s = absl::InternalError(cudaGetErrorString(e));
      ready_device = reinterpret_cast<CUdeviceptr>(dp);
    }
    if (!s.ok()) {
      release();
      return s;
    }
  }
  std::vector<v1::CallStats> stats;
  std::vector<double> wall_us;
  auto layer = [&](int64_t l, uint64_t) -> absl::StatusOr<double> {
    Produce(m->Q(l), m->q_base, m->acc, m->t * m->heads, m->d_qk, m->Iq(l), m->iq_base,
            m->IqBytes(), stream);
    const double t0 = ThreadCpuNs();
    // The blocking form: inputs complete first (ring_stream: the stream writes the ready word
    // after the producer instead, nothing synchronises).
    if (caller == nullptr) DS_CUDA(cudaStreamSynchronize(stream));
    const auto w0 = std::chrono::steady_clock::now();
    absl::StatusOr<v1::CallStats> s;
    if (caller != nullptr) {
      const char* base = caller->region().data();
      absl::Status r = caller->RunAfter(
          ids[l],
          [&](uint64_t* word, uint64_t value) -> absl::Status {
            const CUdeviceptr at = ready_device + (reinterpret_cast<char*>(word) - base);
            const CUresult cr = ops.write(reinterpret_cast<CUstream>(stream), at, value,
                                          CU_STREAM_WRITE_VALUE_DEFAULT);
            return cr == CUDA_SUCCESS
                       ? absl::OkStatus()
                       : absl::InternalError(absl::StrCat("cuStreamWriteValue64: ", cr));
          },
          absl::Seconds(o.stream_timeout));
      s = r.ok() ? absl::StatusOr<v1::CallStats>(v1::CallStats()) : r;
    } else if (ring != nullptr) {
      // The done word of layer l counts the calls made of it: 1, 2, ...
      const uint64_t value = client::LoadSignal(reinterpret_cast<const uint64_t*>(
                                 words.host + (2 * l + 1) * Words::kSpacing)) +
                             1;
      absl::StatusOr<uint64_t> d =
          ring->Call(ids[l], client::SubmissionRing::kNoReady, 0, words.Offset(2 * l + 1), value,
                     absl::Seconds(o.stream_timeout), absl::Microseconds(o.wait_spin_us));
      s = d.ok() ? absl::StatusOr<v1::CallStats>(v1::CallStats()) : d.status();
    } else if (session != nullptr) {
      absl::StatusOr<client::CallResult> r = session->Call(params[l]);
      s = r.ok() ? absl::StatusOr<v1::CallStats>(std::move(r->stats)) : r.status();
    } else if (!ids.empty()) {
      s = client::RunPrepared(client, ids[l]);
    } else {
      absl::StatusOr<client::CallResult> r = client->DsaAttention(params[l]);
      s = r.ok() ? absl::StatusOr<v1::CallStats>(std::move(r->stats)) : r.status();
    }
    const auto w1 = std::chrono::steady_clock::now();
    const double t1 = ThreadCpuNs();
    if (!s.ok()) return s.status();
    stats.push_back(*std::move(s));
    wall_us.push_back(std::chrono::duration<double, std::micro>(w1 - w0).count());
    Consume(m->acc, m->Out(l), m->OutElems(), stream);
    return t1 - t0;
  };
  absl::StatusOr<LoopResult> r = Loop(o, o.blocking_steps, m, seq, stream, layer);
  release();
  if (!r.ok()) return r;
  // The measured calls: the last blocking_steps · layers.
  const size_t measured = std::min<size_t>(stats.size(), o.blocking_steps * m->layers);
  std::vector<double> compute, total, added, wall, client_added;
  if (ring != nullptr || caller != nullptr) {  // no CallStats: the client's wall per call only
    for (size_t i = stats.size() - measured; i < stats.size(); ++i) wall.push_back(wall_us[i]);
    *extra = absl::StrCat(", \"client_wall_us_per_call_p50\": ", J(P50(wall)),
                          ", \"wait_spin_us\": ", o.wait_spin_us);
    return r;
  }
  uint64_t copied = 0, readback = 0;
  std::map<std::string, int64_t> graphs;
  for (size_t i = stats.size() - measured; i < stats.size(); ++i) {
    const v1::CallStats& c = stats[i];
    compute.push_back(c.compute_seconds() * 1e6);
    total.push_back(c.total_seconds() * 1e6);
    added.push_back((c.total_seconds() - c.compute_seconds()) * 1e6);
    wall.push_back(wall_us[i]);
    client_added.push_back(wall_us[i] - c.total_seconds() * 1e6);
    copied = std::max<uint64_t>(copied, c.copied_bytes_in() + c.copied_bytes_out() +
                                            c.copied_bytes_host_to_device() +
                                            c.copied_bytes_device_to_host());
    readback = std::max<uint64_t>(readback, c.count_readback_bytes());
    ++graphs[c.graph().empty() ? "none" : c.graph()];
  }
  std::string graph_json;
  for (const auto& [name, count] : graphs)
    absl::StrAppend(&graph_json, graph_json.empty() ? "" : ", ", Q(name), ": ", count);
  *extra = absl::StrCat(", \"daemon_compute_us_per_call_p50\": ", J(P50(compute)),
                        ", \"daemon_total_us_per_call_p50\": ", J(P50(total)),
                        ", \"daemon_added_us_per_call_p50\": ", J(P50(added)),
                        ", \"client_wall_us_per_call_p50\": ", J(P50(wall)),
                        ", \"client_added_us_per_call_p50\": ", J(P50(client_added)),
                        ", \"copied_bytes_per_call_max\": ", copied,
                        ", \"count_readback_bytes_per_call_max\": ", readback, ", \"graph\": {",
                        graph_json, "}");
  return r;
}

bool ParseList(const std::string& v, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view p : absl::StrSplit(v, ',')) {
    int64_t x;
    if (!absl::SimpleAtoi(p, &x)) return false;
    out->push_back(x);
  }
  return !out->empty();
}

int Main(int argc, char** argv) {
  Options o;
  bool tiny = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string k = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    auto num = [&](int64_t* x) { return absl::SimpleAtoi(v, x); };
    bool ok = true;
    if (k == "--target")
      o.target = v;
    else if (k == "--out")
      o.out = v;
    else if (k == "--commit")
      o.commit = v;
    else if (k == "--mps")
      o.mps = v;
    else if (k == "--submit")
      o.submit = v;
    else if (k == "--regions")
      o.regions = v;
    else if (k == "--blocking-via")
      o.blocking_via = absl::StrSplit(v, ',');
    else if (k == "--wait-spin")
      ok = num(&o.wait_spin_us) && o.wait_spin_us >= 0 && o.wait_spin_us <= 100000;
    else if (k == "--stream-timeout")
      ok = absl::SimpleAtod(v, &o.stream_timeout) && o.stream_timeout > 0;
    else if (k == "--batch")
      ok = ParseList(v, &o.batch);
    else if (k == "--signals")
      o.signals = absl::StrSplit(v, ',');
    else if (k == "--paths")
      o.paths = absl::StrSplit(v, ',');
    else if (k == "--layers")
      ok = num(&o.layers);
    else if (k == "--steps")
      ok = num(&o.steps);
    else if (k == "--warmup")
      ok = num(&o.warmup);
    else if (k == "--blocking-steps")
      ok = num(&o.blocking_steps);
    else if (k == "--heads")
      ok = num(&o.heads);
    else if (k == "--ctx")
      ok = num(&o.ctx);
    else if (k == "--topk")
      ok = num(&o.topk);
    else if (k == "--no-baseline")
      o.baseline = false;
    else if (k == "--inline-lse")
      o.inline_lse = true;
    else if (k == "--tiny")
      tiny = true;
    else
      ok = false;
    for (const std::string& sig : o.signals) ok = ok && (sig == "host" || sig == "device");
    for (const std::string& path : o.paths)
      ok = ok && (path == "stream_ordered" || path == "blocking");
    for (const std::string& via : o.blocking_via)
      ok = ok && (via == "session" || via == "unary" || via == "prepared" || via == "ring" ||
                  via == "ring_stream");
    if (!ok || (o.submit != "ring" && o.submit != "rpc" && o.submit != "ordered") ||
        (o.regions != "per_kind" && o.regions != "one") ||
        (o.mps != "auto" && o.mps != "true" && o.mps != "false")) {
      std::cerr << "decode_step_cpp: bad argument '" << a << "' (see the file's header)\n";
      return 2;
    }
  }
  if (o.target.empty() || o.out.empty()) {
    std::cerr << "decode_step_cpp: --target and --out are required\n";
    return 2;
  }
  if (tiny) {
    o.heads = 16, o.ctx = 256, o.index_heads = 8, o.topk = 64, o.block_size = 16;
    o.layers = std::min<int64_t>(o.layers, 4), o.steps = 3, o.warmup = 1, o.blocking_steps = 2;
    for (auto& b : o.batch) b = std::min<int64_t>(b, 2);
  }
  client::ConnectOptions co;
  co.target = o.target;
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(co);
  if (!c.ok()) {
    std::cerr << "decode_step_cpp: " << c.status() << "\n";
    return 3;
  }
  client::Client* client = c->get();
  absl::StatusOr<v1::GetInfoResponse> info = client->GetInfo();
  if (!info.ok() || info->devices_size() == 0) {
    std::cerr << "decode_step_cpp: GetInfo: "
              << (info.ok() ? "no devices" : info.status().ToString()) << "\n";
    return 3;
  }
  const v1::DeviceInfo& dev0 = info->devices(0);
  const bool mps = o.mps == "auto" ? dev0.mps() : o.mps == "true";
  StreamOps ops;
  if (absl::Status s = ops.Load(); !s.ok()) {
    std::cerr << "decode_step_cpp: " << s << "\n";
    return 1;
  }
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::ofstream out(o.out, std::ios::app);
  int rc = 0;
  uint64_t seq = 0;
  for (int64_t batch : o.batch) {
    const std::string preset =
        absl::StrCat("b", batch, "_h", o.heads, "_ctx", o.ctx / 1024, "k_fp8");
    std::cerr << "== " << preset << ": building the caches\n";
    Model m;
    if (absl::Status s = BuildModel(o, batch, stream, &m); !s.ok()) {
      std::cerr << "decode_step_cpp: " << s << "\n";
      ReleaseModel(client, &m);
      rc = 1;
      continue;
    }
    if (absl::Status s = RegisterModel(client, dev0.uuid(), &m); !s.ok()) {
      std::cerr << "decode_step_cpp: " << s << "\n";
      ReleaseModel(client, &m);
      rc = 1;
      continue;
    }
    Inproc ip;
    std::optional<LoopResult> baseline;
    std::string baseline_error;
    if (o.baseline) {
      absl::Status s = InprocPrepare(m, stream, &ip);
      if (s.ok()) {
        auto layer = [&](int64_t l, uint64_t) -> absl::StatusOr<double> {
          Produce(m.Q(l), m.q_base, m.acc, m.t * m.heads, m.d_qk, m.Iq(l), m.iq_base, m.IqBytes(),
                  stream);
          const double t0 = ThreadCpuNs();
          absl::Status r = InprocRun(m.Params(l), ip, stream);
          const double t1 = ThreadCpuNs();
          if (!r.ok()) return r;
          Consume(m.acc, m.Out(l), m.OutElems(), stream);
          return t1 - t0;
        };
        absl::StatusOr<LoopResult> r = Loop(o, o.steps, &m, &seq, stream, layer);
        if (r.ok())
          baseline = *r;
        else
          s = r.status();
      }
      if (!s.ok()) baseline_error = s.ToString();
      if (baseline) std::cerr << "  inproc baseline: " << baseline->step_us << " us/step\n";
    }
    struct Config {
      std::string path, sig, via;  // sig: stream_ordered only; via: blocking only
    };
    std::vector<Config> configs;
    for (const std::string& path : o.paths) {
      if (path == "blocking")
        for (const std::string& via : o.blocking_via) configs.push_back({path, "", via});
      else
        for (const std::string& sig : o.signals) configs.push_back({path, sig, ""});
    }
    for (const auto& [path, sig, via] : configs) {
      // Outputs poisoned again: what the check reads was written by this configuration.
      FillValue(m.out, o.layers * m.OutElems(), 0x7fc0, stream);
      cudaMemsetAsync(m.lse, 0xff, o.layers * m.LseElems() * 4, stream);
      cudaStreamSynchronize(stream);
      std::string extra;
      absl::StatusOr<LoopResult> r =
          path == "blocking"      ? RunBlocking(o, client, &m, ops, via, &seq, stream, &extra)
          : o.submit != "ordered" ? RunStreamOrdered(o, client, &m, ops, sig, &seq, stream, &extra)
          : sig == "host"         ? RunOrderedCaller(o, client, &m, ops, &seq, stream, &extra)
                                  : absl::StatusOr<LoopResult>(absl::InvalidArgumentError(
                                        "--submit=ordered: host signal words only"));
      std::ostringstream line;
      line << "{\"op\": \"decode_step\", \"preset\": " << Q(preset)
           << ", \"client\": \"cpp\", \"mps\": " << (mps ? "true" : "false")
           << ", \"path\": " << Q(path)
           << ", \"signals\": " << (path == "blocking" ? "null" : Q(sig))
           << ", \"submit\": " << (path == "blocking" ? "null" : Q(o.submit))
           << ", \"blocking_via\": " << (path == "blocking" ? Q(via) : "null")
           << ", \"regions\": " << Q(o.regions)
           << ", \"inline_lse\": " << (path == "blocking" && o.inline_lse ? "true" : "false")
           << ", \"batch\": " << batch << ", \"layers\": " << o.layers
           << ", \"steps\": " << (path == "blocking" ? o.blocking_steps : o.steps)
           << ", \"heads\": " << o.heads << ", \"d_qk\": " << o.d_qk << ", \"ctx\": " << o.ctx
           << ", \"topk\": " << o.topk << ", \"kv\": \"fp8_656\", \"next_n\": 1";
      if (r.ok()) {
        line << ", \"step_us\": " << J(r->step_us) << ", \"step_us_min\": " << J(r->step_us_min)
             << ", \"step_us_max\": " << J(r->step_us_max)
             << ", \"caller_cpu_us_per_call\": " << J(r->caller_cpu_us_per_call)
             << ", \"host_wall_us_per_step\": " << J(r->host_wall_us_per_step);
        line << Check(m, baseline ? &ip : nullptr, client, stream,
                      /*lse=*/path != "blocking" || !o.inline_lse);
      } else {
        line << ", \"error\": " << Q(r.status().ToString().substr(0, 500));
        rc = 1;
        cudaStreamSynchronize(stream);
      }
      line << extra;
      if (baseline) {
        line << ", \"baseline_step_us\": " << J(baseline->step_us)
             << ", \"baseline_caller_cpu_us_per_call\": " << J(baseline->caller_cpu_us_per_call)
             << ", \"added_us_per_layer\": "
             << (r.ok() ? J((r->step_us - baseline->step_us) / o.layers) : "null");
      } else {
        line << ", \"baseline_step_us\": null, \"added_us_per_layer\": null";
        if (!baseline_error.empty()) line << ", \"baseline_error\": " << Q(baseline_error);
      }
      line << ", \"commit\": " << Q(o.commit) << ", \"date\": " << Q(date)
           << ", \"device\": " << Q(dev0.name()) << ", \"backend\": " << Q(info->backend()) << "}";
      std::cout << line.str() << std::endl;
      out << line.str() << "\n";
      out.flush();
    }
    if (ip.workspace != nullptr) cudaFree(ip.workspace);
    ReleaseModel(client, &m);
  }
  cudaStreamDestroy(stream);
  return rc;
}

}  // namespace
}  // namespace attnd::bench::decode_step

int main(int argc, char** argv) { return attnd::bench::decode_step::Main(argc, argv); }
