// attnctl bench <op>: many calls of one preset (unary or on a Session, inline or in regions)
// from --concurrency threads; latency percentiles, throughput and the service overhead
// (client round trip minus the server's compute time), with a progress line on stderr.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/attnctl/commands.h"
#include "client/attnctl/json.h"
#include "client/attnctl/report.h"
#include "client/stream_ordered.h"
#include "client/submission_ring.h"

namespace attnd::attnctl {
namespace {

using Clock = std::chrono::steady_clock;

struct Sample {
  // The caller's wall around one call: the request built, sent, the reply received and applied,
  // and (Session) the caller woken. `rpc` is the client library's CallResult::round_trip_seconds
  // (request sent -> reply read by gRPC), which leaves out the building and the wake-up.
  double round_trip = 0;
  double queue = 0;
  double compute = 0;
  double total = 0;
  double prepare = 0;  // the server's phases (CallStats prepare_seconds, run_seconds)
  double run = 0;
  double flops_per_second = 0;
  double bytes_per_second = 0;
  uint64_t copied_in = 0;
  uint64_t copied_out = 0;
  double rpc = 0;
};

// Nearest-rank percentile of a sorted vector.
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return NAN;
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * sorted.size()));
  return sorted[std::min(sorted.size(), std::max<size_t>(rank, 1)) - 1];
}

double Median(const std::vector<double>& sorted) {
  if (sorted.empty()) return NAN;
  const size_t n = sorted.size();
  return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

std::vector<double> Sorted(const std::vector<Sample>& s, double Sample::*field) {
  std::vector<double> v;
  v.reserve(s.size());
  for (const Sample& x : s) v.push_back(x.*field);
  std::sort(v.begin(), v.end());
  return v;
}

// Prints "\r..." every 0.5 s on a terminal, a line every 5 s otherwise, until stopped.
class Progress {
 public:
  Progress(bool enabled, std::string label, int64_t total, const std::atomic<int64_t>* done)
      : enabled_(enabled), label_(std::move(label)), total_(total), done_(done) {
    if (!enabled_) return;
    tty_ = isatty(STDERR_FILENO) != 0;
    start_ = Clock::now();
    thread_ = std::thread([this] { Loop(); });
  }
  ~Progress() { Stop(); }
  void Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    if (!thread_.joinable()) return;
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
    Print(true);
  }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const absl::Duration period = absl::Milliseconds(tty_ ? 500 : 5000);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) Print(false);
  }
  void Print(bool final_line) {
    const double s = std::chrono::duration<double>(Clock::now() - start_).count();
    const int64_t n = done_->load();
    const std::string line = absl::StrFormat("[bench] %s: %d/%d requests, %.1f s, %.1f req/s",
                                             label_, n, total_, s, s > 0 ? n / s : 0.0);
    if (tty_) {
      std::fprintf(stderr, "\r%s%s", line.c_str(), final_line ? "\n" : "");
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }

  const bool enabled_;
  const std::string label_;
  const int64_t total_;
  const std::atomic<int64_t>* const done_;
  bool tty_ = false;
  Clock::time_point start_;
  std::thread thread_;
  absl::Mutex mu_;  // Loop awaits stop_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// CPU time of the whole process (every thread: the caller's and gRPC's own), seconds.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int PingCommand(const CtlOptions& o) {
  if (o.requests < 1 || o.warmup < 0) {
    return Fail(o, absl::InvalidArgumentError("want --requests >= 1, --warmup >= 0"), kExitUsage);
  }
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(o.connect);
  if (!c.ok()) return Fail(o, c.status(), ServiceExit(c.status()));
  std::vector<Sample> samples;
  for (int64_t i = 0; i < o.warmup + o.requests; ++i) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<v1::GetInfoResponse> info = (*c)->GetInfo(o.timeout);
    const double rt = std::chrono::duration<double>(Clock::now() - start).count();
    if (!info.ok()) return Fail(o, info.status(), kExitService);
    if (i >= o.warmup) {
      Sample sample;
      sample.round_trip = rt;
      samples.push_back(sample);
    }
  }
  const auto rt = Sorted(samples, &Sample::round_trip);
  if (o.json) {
    JsonObject j;
    j.Add("command", "ping").Add("target", o.connect.target).Add("requests", o.requests);
    j.Add("median_us", Median(rt) * 1e6).Add("p50_us", Percentile(rt, 50) * 1e6);
    j.Add("p90_us", Percentile(rt, 90) * 1e6).Add("p99_us", Percentile(rt, 99) * 1e6);
    j.Add("min_us", rt.front() * 1e6).Add("max_us", rt.back() * 1e6);
    if (o.samples) {
      std::vector<std::string> rts;
      for (const Sample& x : samples) rts.push_back(absl::StrFormat("%.3f", x.round_trip * 1e6));
      j.AddRaw("round_trip_us_samples", JsonArray(rts));
    }
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("GetInfo round trip to %s over %lld calls: p50 %s  p90 %s  p99 %s  (min %s)\n",
                o.connect.target.c_str(), static_cast<long long>(o.requests),
                FormatSeconds(Percentile(rt, 50)).c_str(),
                FormatSeconds(Percentile(rt, 90)).c_str(),
                FormatSeconds(Percentile(rt, 99)).c_str(), FormatSeconds(rt.front()).c_str());
  }
  return kExitOk;
}

int BenchCommand(const CtlOptions& o, const std::string& op_arg) {
  const std::string op = CanonicalOpName(op_arg);
  if (op.empty()) {
    return Fail(o, absl::InvalidArgumentError(absl::StrCat("unknown op '", op_arg, "'")),
                kExitUsage);
  }
  if (o.requests < 1 || o.concurrency < 1 || o.warmup < 0) {
    return Fail(o,
                absl::InvalidArgumentError("want --requests >= 1, --concurrency >= 1, "
                                           "--warmup >= 0"),
                kExitUsage);
  }
  if (o.stream_ordered && (!o.regions || o.concurrency != 1)) {
    return Fail(o,
                absl::InvalidArgumentError("--stream_ordered needs --regions (outputs in a "
                                           "region) and --concurrency=1 (one ordered queue)"),
                kExitUsage);
  }
  if (o.prepared && (!o.regions || o.session || o.concurrency != 1)) {
    return Fail(o,
                absl::InvalidArgumentError("--prepared needs --regions (every tensor in a region), "
                                           "unary calls and --concurrency=1"),
                kExitUsage);
  }
  if (o.ring && (!o.prepared || !o.stream_ordered)) {
    return Fail(o, absl::InvalidArgumentError("--ring needs --stream_ordered and --prepared"),
                kExitUsage);
  }
  if (o.ring_wait && !o.ring) {
    return Fail(o, absl::InvalidArgumentError("--ring_wait needs --ring"), kExitUsage);
  }
  absl::StatusOr<std::unique_ptr<OpCase>> made = MakeOpCase(op, o.preset, o.set, o.seed);
  if (!made.ok()) return Fail(o, made.status(), kExitUsage);
  OpCase& c = **made;
  if (o.precision.has_value()) {
    if (absl::Status s = c.SetPrecision(*o.precision); !s.ok()) return Fail(o, s, kExitUsage);
  }
  if (o.index_precision.has_value()) {
    if (absl::Status s = c.SetIndexPrecision(*o.index_precision); !s.ok()) {
      return Fail(o, s, kExitUsage);
    }
  }
  if (o.batch_invariant) {
    if (absl::Status s = c.SetBatchInvariant(true); !s.ok()) return Fail(o, s, kExitUsage);
  }
  CallSetup setup;
  // With --ring the region also holds the ring (kRingEntries slots).
  constexpr uint32_t kRingEntries = 1024;
  const uint64_t region_bytes = c.InputBytes() + o.concurrency * c.OutputBytes() + 4096 +
                                (o.ring ? client::ring_layout::Bytes(kRingEntries) + 64 : 0);
  if (absl::Status s = setup.Connect(o, region_bytes); !s.ok()) return Fail(o, s, ServiceExit(s));
  if (setup.region != nullptr) {
    if (absl::Status s = c.MoveInputsTo(setup.region.get()); !s.ok()) {
      return Fail(o, s, kExitLocal);
    }
  }
  std::vector<std::unique_ptr<RemoteCall>> calls;
  for (int w = 0; w < o.concurrency; ++w) {
    absl::StatusOr<std::unique_ptr<RemoteCall>> call = c.NewRemoteCall(setup.region.get());
    if (!call.ok()) return Fail(o, call.status(), kExitLocal);
    calls.push_back(*std::move(call));
  }
  const Caller caller = setup.caller(o);

  // Warm-up on worker 0's buffers; the first reply is checked against the local run.
  bool verified = false;
  for (int64_t i = 0; i < std::max<int64_t>(o.warmup, o.verify ? 1 : 0); ++i) {
    absl::StatusOr<client::CallResult> r = calls[0]->Run(caller);
    if (!r.ok()) return Fail(o, r.status(), kExitService);
    if (i == 0 && o.verify) {
      kernels::ThreadPool pool(o.local_threads);
      if (absl::Status s = c.RunLocal(&pool); !s.ok()) return Fail(o, s, kExitLocal);
      for (const Check& k : c.Compare(*calls[0], *r)) {
        if (!k.pass) {
          return Fail(o,
                      absl::DataLossError(absl::StrCat("the reply does not match the local "
                                                       "run: ",
                                                       k.name, ": ", k.detail)),
                      kExitCheckFailed);
        }
      }
      verified = true;
    }
  }

  // Stream-ordered: a ready word already at 1 (the inputs are in place) and a done word that
  // call i sets to i + 1, both in the region; calls are enqueued back to back.
  uint64_t* done_word = nullptr;
  client::Signal ready_signal, done_signal;
  if (o.stream_ordered) {
    absl::StatusOr<kernels::Tensor> words = setup.region->Allocate(kernels::DType::kU8, {16});
    if (!words.ok()) return Fail(o, words.status(), kExitLocal);
    absl::StatusOr<v1::Tensor> slice = setup.region->Slice(*words);
    if (!slice.ok()) return Fail(o, slice.status(), kExitLocal);
    uint64_t* ready_word = static_cast<uint64_t*>(words->data);
    done_word = ready_word + 1;
    client::StoreSignal(done_word, 0);
    client::StoreSignal(ready_word, 1);
    ready_signal = {slice->region().region(), slice->region().offset(), 1};
    done_signal = {slice->region().region(), slice->region().offset() + 8, 0};
  }

  uint64_t call_id = 0;
  if (o.prepared) {
    absl::StatusOr<uint64_t> id = calls[0]->Prepare(
        setup.client.get(), setup.session != nullptr ? setup.session->lease_id() : std::string());
    if (!id.ok()) return Fail(o, id.status(), ServiceExit(id.status()));
    call_id = *id;
  }
  // --ring_wait: the compute of a blocking run of the same prepared call (p50), the part of a
  // waited ring call's round trip that is not overhead.
  double calibrated_compute = 0;
  int64_t calibration_calls = 0;
  if (o.ring_wait) {
    std::vector<double> computes;
    calibration_calls = std::max<int64_t>(o.warmup, 20);
    for (int64_t i = 0; i < calibration_calls; ++i) {
      absl::StatusOr<v1::CallStats> s =
          client::RunPrepared(setup.client.get(), call_id, std::nullopt, std::nullopt, o.timeout);
      if (!s.ok()) return Fail(o, s.status(), ServiceExit(s.status()));
      computes.push_back(s->compute_seconds());
    }
    std::sort(computes.begin(), computes.end());
    calibrated_compute = computes[computes.size() / 2];
  }
  // --ring: one ring in the region; a run is a Submit (retried while the ring is full).
  std::unique_ptr<client::SubmissionRing> ring;
  if (o.ring) {
    absl::StatusOr<kernels::Tensor> bytes = setup.region->Allocate(
        kernels::DType::kU8, {static_cast<int64_t>(client::ring_layout::Bytes(kRingEntries))});
    if (!bytes.ok()) return Fail(o, bytes.status(), kExitLocal);
    absl::StatusOr<v1::Tensor> slice = setup.region->Slice(*bytes);
    if (!slice.ok()) return Fail(o, slice.status(), kExitLocal);
    absl::StatusOr<std::unique_ptr<client::SubmissionRing>> opened = client::SubmissionRing::Open(
        setup.client.get(), *setup.region, slice->region().offset(), kRingEntries, nullptr,
        setup.session != nullptr ? setup.session->lease_id() : std::string());
    if (!opened.ok()) return Fail(o, opened.status(), ServiceExit(opened.status()));
    ring = *std::move(opened);
  }
  auto submit = [&](int64_t i) -> absl::StatusOr<client::CallResult> {
    const Clock::time_point t0 = Clock::now();
    if (o.ring_wait) {
      // Inputs in place already: no ready word. Its done word counts up as for the others.
      absl::StatusOr<uint64_t> v =
          ring->Call(call_id, client::SubmissionRing::kNoReady, 0, done_signal.offset,
                     static_cast<uint64_t>(i + 1), o.timeout, o.wait_spin);
      if (!v.ok()) return v.status();
      client::CallResult r;
      r.stats.set_compute_seconds(calibrated_compute);
      r.round_trip_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return r;
    }
    absl::StatusCode code;
    while ((code = ring->Submit(call_id, ready_signal.offset, 1, done_signal.offset,
                                static_cast<uint64_t>(i + 1))) ==
           absl::StatusCode::kResourceExhausted) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if (code != absl::StatusCode::kOk) {
      return absl::Status(code, "the submission ring was closed or errored by the daemon");
    }
    client::CallResult r;
    r.stats.set_enqueued(true);
    r.round_trip_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return r;
  };
  // A prepared run's reply: its CallStats (blocking) or "enqueued" (stream-ordered), timed here.
  auto run_prepared = [&](int64_t i) -> absl::StatusOr<client::CallResult> {
    if (ring != nullptr) return submit(i);
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<v1::CallStats> s =
        o.stream_ordered
            ? client::RunPrepared(setup.client.get(), call_id, ready_signal,
                                  client::Signal{done_signal.region, done_signal.offset,
                                                 static_cast<uint64_t>(i + 1)},
                                  o.timeout)
            : client::RunPrepared(setup.client.get(), call_id, std::nullopt, std::nullopt,
                                  o.timeout);
    if (!s.ok()) return s.status();
    client::CallResult r;
    r.stats = *std::move(s);
    r.round_trip_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return r;
  };

  std::vector<std::vector<Sample>> per_worker(o.concurrency);
  std::atomic<int64_t> next{0}, done{0}, errors{0};
  absl::Mutex error_mu;
  std::string first_error;
  const std::string transport = o.regions ? "regions" : "inline";
  const double cpu_start = ProcessCpuSeconds();
  const Clock::time_point start = Clock::now();
  {
    Progress progress(o.progress, absl::StrCat(op, " ", o.preset, " ", transport), o.requests,
                      &done);
    std::vector<std::thread> threads;
    for (int w = 0; w < o.concurrency; ++w) {
      threads.emplace_back([&, w] {
        int64_t i;
        while ((i = next.fetch_add(1)) < o.requests) {
          absl::StatusOr<client::CallResult> r;
          const Clock::time_point call_start = Clock::now();
          if (o.prepared) {
            r = run_prepared(i);
          } else if (o.stream_ordered) {
            Caller ordered = caller;
            ordered.options.ready = ready_signal;
            ordered.options.done = done_signal;
            ordered.options.done->value = static_cast<uint64_t>(i + 1);
            r = calls[w]->Run(ordered);
          } else {
            r = calls[w]->Run(caller);
          }
          const double call_wall = std::chrono::duration<double>(Clock::now() - call_start).count();
          done.fetch_add(1);
          if (!r.ok()) {
            errors.fetch_add(1);
            // The daemon is gone (a ring call saw it stop polling, or the channel failed):
            // no more calls.
            if (r.status().code() == absl::StatusCode::kUnavailable) next.store(o.requests);
            absl::MutexLock lock(&error_mu);
            if (first_error.empty()) first_error = r.status().ToString();
            continue;
          }
          const v1::CallStats& s = r->stats;
          per_worker[w].push_back({call_wall, s.queue_seconds(), s.compute_seconds(),
                                   s.total_seconds(), s.prepare_seconds(), s.run_seconds(),
                                   s.achieved_flops_per_second(), s.achieved_bytes_per_second(),
                                   s.copied_bytes_in(), s.copied_bytes_out(),
                                   r->round_trip_seconds});
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
  // Every thread of the process (the callers' and gRPC's) while the calls were made, per call.
  const double cpu_per_call = (ProcessCpuSeconds() - cpu_start) / static_cast<double>(o.requests);
  const double calls_wall = std::chrono::duration<double>(Clock::now() - start).count();
  if (o.stream_ordered && errors.load() == 0) {
    // The calls of one queue run in order: the last one's done value (no failure bit) ends it.
    absl::StatusOr<uint64_t> last =
        client::WaitSignal(done_word, static_cast<uint64_t>(o.requests), o.timeout);
    if (!last.ok() || *last != static_cast<uint64_t>(o.requests)) {
      errors.fetch_add(1);
      first_error = last.ok() ? absl::StrCat("done word ", *last, ", want ", o.requests)
                              : last.status().ToString();
    }
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<Sample> samples;
  for (auto& v : per_worker) samples.insert(samples.end(), v.begin(), v.end());
  std::vector<Sample> overheads = samples;
  for (Sample& s : overheads) s.round_trip -= s.compute;  // service overhead per call
  std::vector<Sample> transport_overheads = samples;
  for (Sample& s : transport_overheads) s.round_trip -= s.total;
  const auto rt = Sorted(samples, &Sample::round_trip);
  const auto oh = Sorted(overheads, &Sample::round_trip);
  const auto toh = Sorted(transport_overheads, &Sample::round_trip);
  const auto compute = Sorted(samples, &Sample::compute);
  const auto queue = Sorted(samples, &Sample::queue);
  const auto total = Sorted(samples, &Sample::total);
  const auto prepare = Sorted(samples, &Sample::prepare);
  const auto rpc = Sorted(samples, &Sample::rpc);
  const auto run = Sorted(samples, &Sample::run);
  const auto gflops = Sorted(samples, &Sample::flops_per_second);
  const auto gbytes = Sorted(samples, &Sample::bytes_per_second);
  uint64_t copied_in = 0, copied_out = 0;
  double mean = 0;
  for (const Sample& s : samples) {
    copied_in = std::max(copied_in, s.copied_in);
    copied_out = std::max(copied_out, s.copied_out);
    mean += s.round_trip / samples.size();
  }
  const double throughput = wall > 0 ? samples.size() / wall : 0;

  if (o.json) {
    JsonObject j;
    j.Add("command", "bench").Add("op", op).Add("preset", o.preset).Add("shape", c.shape());
    j.Add("transport", transport).Add("api", o.session ? "session" : "unary");
    j.Add("target", o.connect.target).Add("requests", o.requests);
    j.Add("concurrency", o.concurrency).Add("warmup", o.warmup).Add("verified", verified);
    j.Add("errors", errors.load()).Add("first_error", first_error).Add("wall_s", wall);
    j.Add("throughput_rps", throughput);
    // path: "stream_ordered" (round trips are the enqueue RPCs; the server's figures of such
    // a reply are zero) or "blocking".
    // --ring_wait: "blocking" (each call waited for), its compute from the calibration calls.
    j.Add("path", o.stream_ordered && !o.ring_wait ? "stream_ordered" : "blocking");
    j.Add("prepared", o.prepared).Add("ring", o.ring).Add("ring_wait", o.ring_wait);
    j.Add("wait_spin_us", absl::ToDoubleMicroseconds(o.wait_spin));
    if (o.ring_wait) {
      j.Add("compute_from", "blocking_run_prepared_p50");
      j.Add("calibration_calls", calibration_calls);
    }
    j.Add("caller_cpu_us_per_call", cpu_per_call * 1e6).Add("calls_wall_s", calls_wall);
    j.Add("median_us", Median(rt) * 1e6).Add("p50_us", Percentile(rt, 50) * 1e6);
    j.Add("p90_us", Percentile(rt, 90) * 1e6).Add("p99_us", Percentile(rt, 99) * 1e6);
    j.Add("min_us", rt.empty() ? NAN : rt.front() * 1e6);
    j.Add("max_us", rt.empty() ? NAN : rt.back() * 1e6).Add("mean_us", mean * 1e6);
    j.Add("rpc_p50_us", Percentile(rpc, 50) * 1e6);
    j.Add("server_queue_p50_us", Percentile(queue, 50) * 1e6);
    j.Add("server_compute_p50_us", Percentile(compute, 50) * 1e6);
    j.Add("server_total_p50_us", Percentile(total, 50) * 1e6);
    j.Add("server_prepare_p50_us", Percentile(prepare, 50) * 1e6);
    j.Add("server_run_p50_us", Percentile(run, 50) * 1e6);
    j.Add("overhead_p50_us", Percentile(oh, 50) * 1e6);
    j.Add("overhead_p90_us", Percentile(oh, 90) * 1e6);
    j.Add("overhead_p99_us", Percentile(oh, 99) * 1e6);
    j.Add("transport_overhead_p50_us", Percentile(toh, 50) * 1e6);
    j.Add("copied_bytes", copied_in + copied_out).Add("copied_bytes_in", copied_in);
    j.Add("copied_bytes_out", copied_out);
    j.Add("gflops_per_second", Percentile(gflops, 50) / 1e9);
    j.Add("gbytes_per_second", Percentile(gbytes, 50) / 1e9);
    if (o.samples) {
      // Per call, in completion order per worker: for merging several runs (bench/).
      std::vector<std::string> rts, computes, totals;
      for (const Sample& x : samples) {
        rts.push_back(absl::StrFormat("%.3f", x.round_trip * 1e6));
        computes.push_back(absl::StrFormat("%.3f", x.compute * 1e6));
        totals.push_back(absl::StrFormat("%.3f", x.total * 1e6));
      }
      j.AddRaw("round_trip_us_samples", JsonArray(rts));
      j.AddRaw("compute_us_samples", JsonArray(computes));
      j.AddRaw("total_us_samples", JsonArray(totals));
    }
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf(
        "%s %s (%s) via %s, %s %s%s: %lld requests, concurrency %d, %lld errors%s%s\n", op.c_str(),
        o.preset.c_str(), c.shape().c_str(), o.connect.target.c_str(), transport.c_str(),
        o.session ? "session" : "unary",
        o.ring_wait  ? " prepared, blocking via a submission ring (each done word waited for)"
        : o.ring     ? " prepared stream-ordered via a submission ring"
        : o.prepared ? (o.stream_ordered ? " prepared stream-ordered" : " prepared")
                     : (o.stream_ordered ? " stream-ordered" : ""),
        static_cast<long long>(o.requests), o.concurrency, static_cast<long long>(errors.load()),
        first_error.empty() ? "" : ": ", first_error.c_str());
    std::printf(
        "  round trip  p50 %s  p90 %s  p99 %s  (min %s, max %s; the caller's wall; "
        "the RPC alone p50 %s)\n",
        FormatSeconds(Percentile(rt, 50)).c_str(), FormatSeconds(Percentile(rt, 90)).c_str(),
        FormatSeconds(Percentile(rt, 99)).c_str(),
        FormatSeconds(rt.empty() ? NAN : rt.front()).c_str(),
        FormatSeconds(rt.empty() ? NAN : rt.back()).c_str(),
        FormatSeconds(Percentile(rpc, 50)).c_str());
    std::printf(
        "  server      prepare p50 %s  queue p50 %s  run p50 %s  compute p50 %s  total p50 %s  "
        "%.2f GFLOP/s  %.2f GB/s\n",
        FormatSeconds(Percentile(prepare, 50)).c_str(),
        FormatSeconds(Percentile(queue, 50)).c_str(), FormatSeconds(Percentile(run, 50)).c_str(),
        FormatSeconds(Percentile(compute, 50)).c_str(),
        FormatSeconds(Percentile(total, 50)).c_str(), Percentile(gflops, 50) / 1e9,
        Percentile(gbytes, 50) / 1e9);
    std::printf("  overhead    (round trip - compute) p50 %s  p90 %s  p99 %s\n",
                FormatSeconds(Percentile(oh, 50)).c_str(),
                FormatSeconds(Percentile(oh, 90)).c_str(),
                FormatSeconds(Percentile(oh, 99)).c_str());
    std::printf("  caller      %s of CPU per call (every thread of this process)%s\n",
                FormatSeconds(cpu_per_call).c_str(),
                o.ring_wait ? absl::StrCat("; compute: p50 of ", calibration_calls,
                                           " blocking RunPrepared calls made first")
                                  .c_str()
                : o.stream_ordered
                    ? absl::StrCat(o.ring ? "; ring: round trips are the Submits, "
                                          : "; stream-ordered: round trips are the enqueues, ",
                                   FormatSeconds(calls_wall), " to enqueue all")
                          .c_str()
                    : "");
    std::printf("  throughput  %.1f requests/s over %s; copied per request in %s, out %s%s\n",
                throughput, FormatSeconds(wall).c_str(), FormatBytes(copied_in).c_str(),
                FormatBytes(copied_out).c_str(), verified ? "; reply verified" : "");
  }
  return errors.load() == 0 ? kExitOk : kExitService;
}

}  // namespace attnd::attnctl
