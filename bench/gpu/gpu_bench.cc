#include "bench/gpu/gpu_bench.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "bench/gpu/fill.h"
#include "kernels/common/status.h"

namespace attnd::bench {

DeviceArena::~DeviceArena() {
  for (void* p : buffers_) gpu::Free(p);
}

absl::StatusOr<void*> DeviceArena::Alloc(int64_t bytes) {
  void* p = nullptr;
  GPU_RETURN_IF_ERROR(gpu::Malloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)) + 256));
  buffers_.push_back(p);
  bytes_ += bytes;
  return p;
}

absl::StatusOr<void*> DeviceArena::Random(kernels::DType dtype, int64_t elements, float scale,
                                          uint64_t seed) {
  auto p = Alloc(elements * kernels::DTypeSize(dtype));
  if (!p.ok()) return p.status();
  GPU_RETURN_IF_ERROR(LaunchFill(*p, static_cast<int>(dtype), elements, scale, seed, nullptr));
  GPU_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return p;
}

absl::StatusOr<void*> DeviceArena::RandomInt(int64_t elements, int32_t lo, int32_t hi,
                                             uint64_t seed) {
  auto p = Alloc(elements * 4);
  if (!p.ok()) return p.status();
  GPU_RETURN_IF_ERROR(LaunchFillInt(static_cast<int32_t*>(*p), elements, lo, hi, seed, nullptr));
  GPU_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return p;
}

absl::StatusOr<void*> DeviceArena::Upload(const void* host, int64_t bytes) {
  auto p = Alloc(bytes);
  if (!p.ok()) return p.status();
  GPU_RETURN_IF_ERROR(cudaMemcpy(*p, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
  return p;
}

namespace {
std::vector<std::pair<std::string, GpuBenchFactory>>& Registry() {
  static auto* r = new std::vector<std::pair<std::string, GpuBenchFactory>>();
  return *r;
}
}  // namespace

bool RegisterGpuBench(const std::string& op, GpuBenchFactory factory) {
  Registry().emplace_back(op, std::move(factory));
  return true;
}

const std::vector<std::pair<std::string, GpuBenchFactory>>& GpuBenches() { return Registry(); }

}  // namespace attnd::bench

namespace {

using attnd::bench::GpuBenchCase;
using attnd::bench::PeakKind;

// The card's measured ceilings (H200, docs/BENCHMARKS.md "Anchors and ceilings").
constexpr double kPeakBf16 = 685e12, kPeakFp8 = 1420e12, kPeakCopy = 4.28e12;
constexpr int kLaunchesPerGraph = 10;

struct Options {
  std::string filter;
  int replays = 60;
  std::string out;
  std::string commit = "unknown";
  // --interleave: the warm replays of an op's selected cases taken in rounds (one replay of
  // each case per round, each round starting one case later) instead of case after case, so
  // that a drift of the card's clocks over the run (a card that starts idle and cool runs its
  // first heavy case faster: 4 % on an H100, docs/BENCHMARKS.md "Order in one process") and a
  // case's place in the round fall on every case alike.
  bool interleave = false;
};

double Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string Json(const GpuBenchCase& c, const char* cache, double median_us, const Options& o,
                 const std::string& device, const std::string& date, const std::string& error) {
  const double s = median_us * 1e-6;
  const double flops = s > 0 ? c.work.flops / s : 0, bytes = s > 0 ? c.work.bytes / s : 0;
  const double peak = c.peak == PeakKind::kFp8 ? kPeakFp8 : kPeakBf16;
  std::ostringstream j;
  j.precision(6);
  j << "{\"op\": \"" << c.op << "\", \"preset\": \"" << c.preset << "\", \"impl\": \"" << c.impl
    << "\", \"cache\": \"" << cache << "\", \"median_us\": " << median_us
    << ", \"tflops\": " << flops * 1e-12 << ", \"gbps\": " << bytes * 1e-9
    << ", \"pct_peak_flops\": " << 100 * flops / peak
    << ", \"pct_peak_bw\": " << 100 * bytes / kPeakCopy << ", \"flops\": " << c.work.flops
    << ", \"bytes\": " << c.work.bytes << ", \"commit\": \"" << o.commit << "\", \"date\": \""
    << date << "\", \"device\": \"" << device << "\"";
  if (!c.precision.empty()) j << ", \"precision\": \"" << c.precision << "\"";
  if (o.interleave) j << ", \"interleaved\": true";
  if (!error.empty()) j << ", \"error\": \"" << error << "\"";
  j << "}";
  return j.str();
}

// One case's captured graph (kLaunchesPerGraph launches), its stream and timing events.
struct CaseTimer {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  std::vector<float> warm;  // ms per graph replay

  CaseTimer() = default;
  CaseTimer(const CaseTimer&) = delete;
  CaseTimer& operator=(const CaseTimer&) = delete;
  ~CaseTimer() {
    if (e0 != nullptr) cudaEventDestroy(e0);
    if (e1 != nullptr) cudaEventDestroy(e1);
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // Captures the graph and replays it three times untimed.
  absl::Status Prepare(const GpuBenchCase& c) {
    GPU_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    GPU_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    absl::Status launch_status;
    for (int i = 0; i < kLaunchesPerGraph && launch_status.ok(); ++i)
      launch_status = c.launch(stream);
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (!launch_status.ok()) return launch_status;
    GPU_RETURN_IF_ERROR(end);
    GPU_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
    GPU_RETURN_IF_ERROR(cudaEventCreate(&e0));
    GPU_RETURN_IF_ERROR(cudaEventCreate(&e1));
    for (int i = 0; i < 3; ++i) GPU_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
    GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  }

  // The ms between two events around what `enqueue` puts on the stream, appended to `into`.
  template <class Enqueue>
  absl::Status Timed(Enqueue enqueue, std::vector<float>* into) {
    GPU_RETURN_IF_ERROR(cudaEventRecord(e0, stream));
    ATTND_RETURN_IF_ERROR(enqueue());
    GPU_RETURN_IF_ERROR(cudaEventRecord(e1, stream));
    GPU_RETURN_IF_ERROR(cudaEventSynchronize(e1));
    float ms;
    GPU_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, e0, e1));
    into->push_back(ms);
    return absl::OkStatus();
  }

  // One timed replay of the graph, appended to `warm`.
  absl::Status TimeWarm() {
    return Timed(
        [&]() -> absl::Status {
          GPU_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
          return absl::OkStatus();
        },
        &warm);
  }

  // `runs` single launches, each after evicting L2 (60 MB) by writing a much larger buffer
  // outside the timed region: the median µs of a first launch after the flush.
  absl::Status TimeCold(const GpuBenchCase& c, int runs, void* flush, size_t flush_bytes,
                        double* cold_us) {
    std::vector<float> cold;
    for (int r = 0; r < runs; ++r) {
      GPU_RETURN_IF_ERROR(cudaMemsetAsync(flush, r & 0xff, flush_bytes, stream));
      ATTND_RETURN_IF_ERROR(Timed([&] { return c.launch(stream); }, &cold));
    }
    *cold_us = Median(cold) * 1e3;
    return absl::OkStatus();
  }

  double WarmUs() const { return Median(warm) * 1e3 / kLaunchesPerGraph; }
};

absl::Status TimeCase(const GpuBenchCase& c, const Options& o, void* flush, size_t flush_bytes,
                      double* warm_us, double* cold_us) {
  CaseTimer t;
  ATTND_RETURN_IF_ERROR(t.Prepare(c));
  for (int r = 0; r < o.replays; ++r) ATTND_RETURN_IF_ERROR(t.TimeWarm());
  *warm_us = t.WarmUs();
  return t.TimeCold(c, o.replays / 2, flush, flush_bytes, cold_us);
}

}  // namespace

int main(int argc, char** argv) {
  // A reader of stdout that exits early (`| head`) must not end the run: writes to a closed
  // pipe then fail instead of raising SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const std::string f = std::string(flag) + "=";
      return a.rfind(f, 0) == 0 ? argv[i] + f.size() : nullptr;
    };
    if (const char* v = value("--filter"))
      o.filter = v;
    else if (const char* v = value("--replays"))
      o.replays = std::max(10, std::atoi(v));
    else if (const char* v = value("--out"))
      o.out = v;
    else if (const char* v = value("--commit"))
      o.commit = v;
    else if (a == "--interleave")
      o.interleave = true;
    else {
      std::cerr << "usage: attn_gpu_bench [--filter=SUBSTR] [--replays=N] [--out=FILE.jsonl] "
                   "[--commit=SHA] [--interleave]\n";
      return 2;
    }
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::cerr << "attn_gpu_bench: no CUDA device\n";
    return 1;
  }
  const std::string device = prop.name;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const size_t flush_bytes = size_t{512} << 20;
  void* flush = nullptr;
  if (cudaMalloc(&flush, flush_bytes) != cudaSuccess) return 1;
  std::ofstream out;
  if (!o.out.empty()) out.open(o.out, std::ios::app);
  int failures = 0;
  for (const auto& [op, factory] : attnd::bench::GpuBenches()) {
    auto cases = factory(o.filter);
    if (!cases.ok()) {
      std::cerr << op << ": " << cases.status() << "\n";
      ++failures;
      continue;
    }
    auto write = [&](const GpuBenchCase& c, double warm, double cold, const absl::Status& s) {
      const std::string err = s.ok() ? "" : std::string(s.message());
      if (!s.ok()) ++failures;
      for (auto [cache, us] : {std::pair<const char*, double>{"warm", warm}, {"cold", cold}}) {
        const std::string line = Json(c, cache, us, o, device, date, err);
        // The file first, flushed per line: a run killed in a later case (a hang, a call's time
        // limit) keeps what it measured, and so does one whose stdout was closed early.
        if (out.is_open()) out << line << std::endl;
        std::cout << line << std::endl;
        if (!s.ok()) break;
      }
    };
    std::vector<const GpuBenchCase*> selected;
    for (const auto& c : *cases) {
      const std::string name = absl::StrCat(c.op, "/", c.preset, "/", c.impl,
                                            c.precision.empty() ? "" : "/", c.precision);
      if (!o.filter.empty() && name.find(o.filter) == std::string::npos) continue;
      if (!o.interleave) {
        std::cerr << "running " << name << "\n";
        double warm = 0, cold = 0;
        const absl::Status s = TimeCase(c, o, flush, flush_bytes, &warm, &cold);
        write(c, warm, cold, s);
        continue;
      }
      selected.push_back(&c);
    }
    if (selected.empty()) continue;
    // Interleaved: every graph prepared, then o.replays rounds of one replay each, then the
    // cold launches case by case. A case that fails is reported and left out of the rounds.
    std::vector<std::unique_ptr<CaseTimer>> timers;
    std::vector<absl::Status> status(selected.size());
    for (size_t i = 0; i < selected.size(); ++i) {
      timers.push_back(std::make_unique<CaseTimer>());
      status[i] = timers[i]->Prepare(*selected[i]);
    }
    std::cerr << "interleaving " << selected.size() << " " << op << " cases, " << o.replays
              << " rounds\n";
    // Round r starts at case r mod n, so every case takes every place in a round equally often
    // over n rounds (a case's place in the round measured up to 4 % on an H100).
    const size_t n = selected.size();
    for (int r = 0; r < o.replays; ++r) {
      for (size_t k = 0; k < n; ++k) {
        const size_t i = (static_cast<size_t>(r) + k) % n;
        if (status[i].ok()) status[i] = timers[i]->TimeWarm();
      }
    }
    for (size_t i = 0; i < selected.size(); ++i) {
      double cold = 0;
      if (status[i].ok()) {
        status[i] = timers[i]->TimeCold(*selected[i], o.replays / 2, flush, flush_bytes, &cold);
      }
      write(*selected[i], status[i].ok() ? timers[i]->WarmUs() : 0, cold, status[i]);
    }
  }
  cudaFree(flush);
  return failures == 0 ? 0 : 1;
}
