// The decode-step benchmark's C++ frontend (the counterpart of bench/decode_step/decode_step.py;
// docs/BENCHMARKS.md "Decode step"): a step of --layers layers, each its own producer kernel (the
// stand-in for the projections: q from the previous layer's output), the paged DsaAttention
// (FP8 KV, 656-byte rows) through attnd, and a consumer kernel reading out. Every tensor lies in
// one cudaMalloc allocation registered once as a device region; each layer is a prepared call.
//
// Paths (one JSON line each, client "cpp", to --out):
//   stream_ordered  per layer: submit the prepared call (submission ring, or RunPrepared with
//                   signals: --submit rpc), then on this process's stream cuStreamWriteValue64
//                   (ready = step) and cuStreamWaitValue64 (done >= step) on words of a host
//                   region mapped into the CUDA context; nothing synchronises inside the step.
//   blocking        per layer: synchronise the stream, the blocking DsaAttention, consume.
// The baseline: the same chain with the DSA kernels launched in this process on the same stream,
// through the operator's own entry (validate, first GPU implementation that supports the call,
// run), as the daemon does. step_us: median of CUDA events around each step on the stream;
// added_us_per_layer = (step_us − baseline_step_us) / layers; caller_cpu_us_per_call: this
// thread's CPU time around the call's submission and its two stream operations, per call.
//   decode_step_cpp --target=unix:/tmp/a.sock --out=r.jsonl [--batch=64,128] [--submit=ring|rpc]
//     [--paths=stream_ordered,blocking] [--layers=61] [--steps=30] [--warmup=3] [--ctx=32768]
//     [--heads=128] [--topk=2048] [--signals=host,device] [--commit=SHA] [--mps=auto|true|false]
//     [--no-baseline] [--tiny]
// --signals=device puts the words in the model's device region (a daemon without the device-side
// wait refuses them: the line records the error; a submission ring takes host words only).
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
#include <iostream>
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
#include "client/host_region.h"
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
  std::vector<std::string> signals = {"host"};  // and/or "device"
  std::string submit = "ring";
  int64_t layers = 61, steps = 30, warmup = 3, blocking_steps = 5;
  int64_t heads = 128, d_qk = 576, ctx = 32768, index_heads = 64, index_dim = 128, topk = 2048;
  int64_t block_size = 64;
  bool baseline = true;
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

// One device allocation carved into 256-byte aligned tensors; registered as one device region.
struct Arena {
  char* base = nullptr;
  uint64_t size = 0, used = 0;
  absl::StatusOr<void*> Take(uint64_t bytes) {
    const uint64_t at = (used + 255) & ~uint64_t{255};
    if (at + bytes > size) return absl::ResourceExhaustedError("arena full");
    used = at + bytes;
    return base + at;
  }
};

struct Model {
  int64_t batch = 0, layers = 0, t = 0, heads = 0, d_qk = 0, hi = 0, di = 0, bs = 0, topk = 0;
  int64_t max_blocks = 0, num_blocks = 0, kv_rows = 0, ctx = 0;
  float sm_scale = 0;
  Arena arena;
  uint8_t *index_cache = nullptr, *kv = nullptr, *index_q = nullptr, *iq_base = nullptr;
  int32_t *block_table = nullptr, *context_lens = nullptr;
  uint16_t *q = nullptr, *q_base = nullptr, *out = nullptr, *check_out = nullptr, *acc = nullptr;
  float* index_weights = nullptr;
  void* words = nullptr;  // 2·layers signal words, 64 bytes apart (--signals=device)
  std::string region;

  int64_t QElems() const { return t * heads * d_qk; }
  int64_t OutElems() const { return t * heads * 512; }
  int64_t IqBytes() const { return batch * hi * di; }
  uint16_t* Q(int64_t l) const { return q + l * QElems(); }
  uint16_t* Out(int64_t l) const { return out + l * OutElems(); }
  uint8_t* Iq(int64_t l) const { return index_q + l * IqBytes(); }
  float* Iw(int64_t l) const { return index_weights + l * t * hi; }

  dsa::Params Params(int64_t l, uint16_t* out_ptr = nullptr) const {
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
    p.out = MakeTensor(out_ptr != nullptr ? out_ptr : Out(l), DType::kBF16, {t, heads, 512});
    return p;
  }
};

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
  const uint64_t parts[] = {
      static_cast<uint64_t>(m->num_blocks * m->bs * (m->di + 4)),
      static_cast<uint64_t>(m->kv_rows) * 656,
      static_cast<uint64_t>(batch * m->max_blocks * 4),
      static_cast<uint64_t>(batch * 4),
      L * m->QElems() * 2,
      static_cast<uint64_t>(m->QElems() * 2),
      L * m->IqBytes(),
      static_cast<uint64_t>(m->IqBytes()),
      L * m->t * m->hi * 4,
      L * m->OutElems() * 2,
      static_cast<uint64_t>(m->OutElems() * 2) * 2,
      L * 2 * 64,
  };
  for (uint64_t p : parts) m->arena.size += p + 256;
  DS_CUDA(cudaMalloc(&m->arena.base, m->arena.size));
  auto take = [&](uint64_t bytes, auto** ptr) -> absl::Status {
    absl::StatusOr<void*> p = m->arena.Take(bytes);
    if (!p.ok()) return p.status();
    *ptr = static_cast<std::remove_reference_t<decltype(*ptr)>>(*p);
    return absl::OkStatus();
  };
  DS_OK(take(parts[0], &m->index_cache));
  DS_OK(take(parts[1], &m->kv));
  DS_OK(take(parts[2], &m->block_table));
  DS_OK(take(parts[3], &m->context_lens));
  DS_OK(take(parts[4], &m->q));
  DS_OK(take(parts[5], &m->q_base));
  DS_OK(take(parts[6], &m->index_q));
  DS_OK(take(parts[7], &m->iq_base));
  DS_OK(take(parts[8], &m->index_weights));
  DS_OK(take(parts[9], &m->out));
  DS_OK(take(m->OutElems() * 2, &m->check_out));
  DS_OK(take(m->OutElems() * 2, &m->acc));
  DS_OK(take(L * 2 * 64, &m->words));
  FillIndexCache(m->index_cache, m->num_blocks, m->bs, m->di, o.seed + 1, stream);
  FillKvFp8(m->kv, m->kv_rows, o.seed + 2, stream);
  FillBf16(m->q_base, m->QElems(), 0.5f, o.seed + 3, stream);
  FillFp8(m->iq_base, m->IqBytes(), o.seed + 4, stream);
  FillF32(m->index_weights, L * m->t * m->hi, 1.0f, o.seed + 5, stream);
  FillValue(m->out, L * m->OutElems(), 0x7fc0, stream);  // NaN: a layer never written shows
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

// Registers the model's allocation as one device region of `client` (its IPC handle).
absl::Status RegisterModel(client::Client* client, const std::string& device_uuid, Model* m) {
  cudaIpcMemHandle_t handle;
  DS_CUDA(cudaIpcGetMemHandle(&handle, m->arena.base));
  v1::RegisterDeviceRegionRequest req;
  m->region = absl::StrCat("ds-cpp-", getpid(), "-", m->batch);
  req.set_name(m->region);
  req.set_raw_handle(std::string(reinterpret_cast<const char*>(&handle), sizeof handle));
  req.set_device_uuid(device_uuid);
  req.set_offset(0);
  req.set_byte_size(m->arena.size);
  v1::RegisterRegionResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  const grpc::Status s = client->stub()->RegisterDeviceRegion(&ctx, req, &resp);
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("RegisterDeviceRegion: ", s.error_message()));
  client->regions().Add(m->region, m->arena.base, m->arena.size);
  return absl::OkStatus();
}

void ReleaseModel(client::Client* client, Model* m) {
  if (!m->region.empty()) {
    (void)client->UnregisterRegion(m->region);
    client->regions().Remove(m->arena.base);
  }
  if (m->arena.base != nullptr) cudaFree(m->arena.base);
  m->arena.base = nullptr;
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

// Warm-up steps, a synchronise, then the measured steps (events around each on `stream`).
// layer_fn(layer, step_value) returns the caller CPU ns of its call.
template <class F>
absl::StatusOr<LoopResult> Loop(const Options& o, int64_t steps, Model* m, uint64_t* seq,
                                cudaStream_t stream, F layer_fn) {
  for (int64_t w = 0; w < o.warmup; ++w) {
    ++*seq;
    for (int64_t l = 0; l < m->layers; ++l) {
      absl::StatusOr<double> r = layer_fn(l, *seq);
      if (!r.ok()) return r.status();
    }
  }
  DS_CUDA(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> ev(2 * steps);
  for (auto& e : ev) DS_CUDA(cudaEventCreate(&e));
  double cpu_ns = 0;
  const auto w0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    ++*seq;
    DS_CUDA(cudaEventRecord(ev[2 * i], stream));
    for (int64_t l = 0; l < m->layers; ++l) {
      absl::StatusOr<double> r = layer_fn(l, *seq);
      if (!r.ok()) return r.status();
      cpu_ns += *r;
    }
    DS_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
  }
  DS_CUDA(cudaStreamSynchronize(stream));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  std::vector<double> us;
  for (int64_t i = 0; i < steps; ++i) {
    float ms = 0;
    DS_CUDA(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    us.push_back(ms * 1e3);
  }
  for (auto& e : ev) cudaEventDestroy(e);
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
    w->region_name = m.region;
    w->base = reinterpret_cast<char*>(m.words) - m.arena.base;
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

// The last layer's out against the in-process kernels on the same inputs.
std::string Check(const Model& m, const Inproc* ip, client::Client* client, cudaStream_t stream) {
  cudaStreamSynchronize(stream);
  const int64_t l = m.layers - 1, n = m.OutElems();
  FillValue(m.check_out, n, 0x7fc0, stream);
  dsa::Params p = m.Params(l, m.check_out);
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
  cudaStreamSynchronize(stream);
  cudaMemcpy(got.data(), m.Out(l), n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(want.data(), m.check_out, n * 2, cudaMemcpyDeviceToHost);
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
  return absl::StrCat(", \"check\": ", Q(verdict), ", \"check_against\": ", Q(against),
                      ", \"check_max_abs\": ", J(max_abs),
                      ", \"check_rel_l2\": ", J(std::sqrt(num / std::max(den, 1e-30))),
                      nan ? ", \"check_detail\": \"NaN in out\"" : "");
}

absl::StatusOr<LoopResult> RunStreamOrdered(const Options& o, client::Client* client, Model* m,
                                            const StreamOps& ops, const std::string& signals,
                                            uint64_t* seq, cudaStream_t stream,
                                            std::string* extra) {
  Words words;
  DS_OK(MakeWords(client, *m, signals, &words));
  if (o.submit == "ring" && words.region == nullptr) {
    return absl::InvalidArgumentError("a submission ring takes host signal words (--submit=rpc)");
  }
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
    uint32_t entries = 64;
    while (entries < 2 * m->layers) entries *= 2;
    client::HostRegionOptions ho;
    ho.bytes = client::ring_layout::Bytes(entries);
    ho.name = absl::StrCat("ds-cpp-ring-", getpid(), "-", m->batch);
    absl::StatusOr<std::unique_ptr<client::HostRegion>> r = client::HostRegion::Create(client, ho);
    if (!r.ok()) {
      release();
      return r.status();
    }
    ring_region = std::move(*r);
    absl::StatusOr<std::unique_ptr<client::SubmissionRing>> opened =
        client::SubmissionRing::Open(client, *ring_region, 0, entries, words.region.get());
    if (!opened.ok()) {
      release();
      return opened.status();
    }
    ring = std::move(*opened);
  }
  int64_t full = 0;
  absl::Status bad;
  auto layer = [&](int64_t l, uint64_t n) -> absl::StatusOr<double> {
    Produce(m->Q(l), m->q_base, m->acc, m->t * m->heads, m->d_qk, m->Iq(l), m->iq_base,
            m->IqBytes(), stream);
    const double t0 = ThreadCpuNs();
    const uint64_t r_off = words.Offset(2 * l), d_off = words.Offset(2 * l + 1);
    if (ring != nullptr) {
      absl::StatusCode c;
      while ((c = ring->Submit(ids[l], r_off, n, d_off, n)) ==
             absl::StatusCode::kResourceExhausted) {
        ++full;
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
  // Start past any value the words hold.
  absl::StatusOr<LoopResult> r = Loop(o, o.steps, m, seq, stream, layer);
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
  if (r.ok() && (failed || stale))
    return absl::InternalError(absl::StrCat("done words: ", failed, " failed, ", stale, " stale"));
  return r;
}

absl::StatusOr<LoopResult> RunBlocking(const Options& o, client::Client* client, Model* m,
                                       uint64_t* seq, cudaStream_t stream) {
  std::vector<dsa::Params> params;
  for (int64_t l = 0; l < m->layers; ++l) params.push_back(m->Params(l));
  auto layer = [&](int64_t l, uint64_t) -> absl::StatusOr<double> {
    Produce(m->Q(l), m->q_base, m->acc, m->t * m->heads, m->d_qk, m->Iq(l), m->iq_base,
            m->IqBytes(), stream);
    const double t0 = ThreadCpuNs();
    DS_CUDA(cudaStreamSynchronize(stream));  // the blocking form: inputs complete first
    absl::StatusOr<client::CallResult> r = client->DsaAttention(params[l]);
    const double t1 = ThreadCpuNs();
    if (!r.ok()) return r.status();
    Consume(m->acc, m->Out(l), m->OutElems(), stream);
    return t1 - t0;
  };
  return Loop(o, o.blocking_steps, m, seq, stream, layer);
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
    else if (k == "--tiny")
      tiny = true;
    else
      ok = false;
    for (const std::string& sig : o.signals) ok = ok && (sig == "host" || sig == "device");
    for (const std::string& path : o.paths)
      ok = ok && (path == "stream_ordered" || path == "blocking");
    if (!ok || (o.submit != "ring" && o.submit != "rpc")) {
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
    std::vector<std::pair<std::string, std::string>> configs;  // (path, signals)
    for (const std::string& path : o.paths) {
      if (path == "blocking")
        configs.emplace_back(path, "");
      else
        for (const std::string& sig : o.signals) configs.emplace_back(path, sig);
    }
    for (const auto& [path, sig] : configs) {
      std::string extra;
      absl::StatusOr<LoopResult> r =
          path == "blocking" ? RunBlocking(o, client, &m, &seq, stream)
                             : RunStreamOrdered(o, client, &m, ops, sig, &seq, stream, &extra);
      std::ostringstream line;
      line << "{\"op\": \"decode_step\", \"preset\": " << Q(preset)
           << ", \"client\": \"cpp\", \"mps\": " << (mps ? "true" : "false")
           << ", \"path\": " << Q(path)
           << ", \"signals\": " << (path == "blocking" ? "null" : Q(sig))
           << ", \"submit\": " << (path == "blocking" ? "null" : Q(o.submit))
           << ", \"batch\": " << batch << ", \"layers\": " << o.layers
           << ", \"steps\": " << (path == "blocking" ? o.blocking_steps : o.steps)
           << ", \"heads\": " << o.heads << ", \"d_qk\": " << o.d_qk << ", \"ctx\": " << o.ctx
           << ", \"topk\": " << o.topk << ", \"kv\": \"fp8_656\", \"next_n\": 1";
      if (r.ok()) {
        line << ", \"step_us\": " << J(r->step_us) << ", \"step_us_min\": " << J(r->step_us_min)
             << ", \"step_us_max\": " << J(r->step_us_max)
             << ", \"caller_cpu_us_per_call\": " << J(r->caller_cpu_us_per_call)
             << ", \"host_wall_us_per_step\": " << J(r->host_wall_us_per_step);
        line << Check(m, baseline ? &ip : nullptr, client, stream);
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
