#include "server/metrics/metrics.h"

#include <cmath>

#include "absl/strings/ascii.h"

namespace attnd::server::metrics {
namespace {

using prometheus::Histogram;

// Powers of `factor` from `start`, `n` boundaries.
Histogram::BucketBoundaries Exponential(double start, double factor, int n) {
  Histogram::BucketBoundaries b;
  double v = start;
  for (int i = 0; i < n; ++i, v *= factor) b.push_back(v);
  return b;
}

// 10 µs .. ~100 s: service latencies from a tiny call on the unix socket to a long prefill.
const Histogram::BucketBoundaries& SecondsBuckets() {
  static const auto* b = new Histogram::BucketBoundaries(Exponential(1e-5, 2.5, 18));
  return *b;
}
// 1 MB/s .. ~10 TB/s.
const Histogram::BucketBoundaries& BandwidthBuckets() {
  static const auto* b = new Histogram::BucketBoundaries(Exponential(1e6, std::sqrt(10.0), 15));
  return *b;
}
// 1 MFLOP/s .. ~3 PFLOP/s.
const Histogram::BucketBoundaries& FlopsBuckets() {
  static const auto* b = new Histogram::BucketBoundaries(Exponential(1e6, std::sqrt(10.0), 20));
  return *b;
}

}  // namespace

std::string CodeLabel(absl::StatusCode code) {
  return absl::AsciiStrToUpper(absl::StatusCodeToString(code));
}

Metrics::Metrics(prometheus::Registry* registry, absl::string_view version,
                 absl::string_view backend, const std::vector<std::string>& ops)
    : requests_(prometheus::BuildCounter()
                    .Name("attnd_requests_total")
                    .Help("Operator calls finished, by op and gRPC status code.")
                    .Register(*registry)),
      request_duration_(prometheus::BuildHistogram()
                            .Name("attnd_request_duration_seconds")
                            .Help("Server-side time from request received to reply ready.")
                            .Register(*registry)),
      queue_duration_(prometheus::BuildHistogram()
                          .Name("attnd_queue_duration_seconds")
                          .Help("Time a call waited in the request queue.")
                          .Register(*registry)),
      compute_duration_(prometheus::BuildHistogram()
                            .Name("attnd_compute_duration_seconds")
                            .Help("Backend compute time of a call, by op and implementation.")
                            .Register(*registry)),
      logical_bytes_(prometheus::BuildCounter()
                         .Name("attnd_logical_bytes_total")
                         .Help("Logical bytes of finished calls (each input read once, each "
                               "output written once).")
                         .Register(*registry)),
      flops_(prometheus::BuildCounter()
                 .Name("attnd_flops_total")
                 .Help("Useful matrix FLOPs of finished calls.")
                 .Register(*registry)),
      bandwidth_(prometheus::BuildHistogram()
                     .Name("attnd_achieved_bandwidth_bytes_per_second")
                     .Help("Logical bytes over compute time, per call.")
                     .Register(*registry)),
      achieved_flops_(prometheus::BuildHistogram()
                          .Name("attnd_achieved_flops_per_second")
                          .Help("FLOPs over compute time (FLOP/s), per call.")
                          .Register(*registry)),
      copied_bytes_(prometheus::BuildCounter()
                        .Name("attnd_copied_bytes_total")
                        .Help("Tensor bytes copied: in/out inline in requests/replies; "
                              "host_to_device/device_to_host DMA on a GPU (inline staging, host "
                              "regions); count_readback: device index data read back for work "
                              "counts. Device-region tensors copy none.")
                        .Register(*registry)),
      pool_reserved_(prometheus::BuildGauge()
                         .Name("attnd_pool_reserved_bytes")
                         .Help("Bytes reserved by the backend's memory pools at start, by pool "
                               "(a GPU UUID, pinned-staging, cpu).")
                         .Register(*registry)),
      pool_used_(prometheus::BuildGauge()
                     .Name("attnd_pool_used_bytes")
                     .Help("Bytes of the memory pools' reservations in use by calls, by pool.")
                     .Register(*registry)),
      pool_free_(prometheus::BuildGauge()
                     .Name("attnd_pool_free_bytes")
                     .Help("Bytes of the memory pools' reservations not in use, by pool.")
                     .Register(*registry)),
      device_up_(prometheus::BuildGauge()
                     .Name("attnd_device_up")
                     .Help("1 while a device is usable, 0 once it was lost (health then reports "
                           "NOT_SERVING; restart attnd).")
                     .Register(*registry)),
      gpu_mps_(prometheus::BuildGauge()
                   .Name("attnd_gpu_mps")
                   .Help("1 when the device's contexts are shared through an MPS server (CUDA), "
                         "0 otherwise (always 0 on HIP and the CPU backend).")
                   .Register(*registry)),
      regions_(prometheus::BuildGauge()
                   .Name("attnd_regions")
                   .Help("Mapped regions, by kind (including unregistered ones still in use).")
                   .Register(*registry)),
      region_bytes_(prometheus::BuildGauge()
                        .Name("attnd_region_bytes")
                        .Help("Bytes of mapped regions, by kind.")
                        .Register(*registry)),
      graph_cache_(prometheus::BuildCounter()
                       .Name("attnd_graph_cache_total")
                       .Help("Graph cache lookups, by result (GPU backends).")
                       .Register(*registry)),
      inflight_family_(prometheus::BuildGauge()
                           .Name("attnd_inflight_requests")
                           .Help("Operator calls received and not yet answered.")
                           .Register(*registry)),
      queue_depth_family_(prometheus::BuildGauge()
                              .Name("attnd_queue_depth")
                              .Help("Operator calls waiting in the request queue for a worker.")
                              .Register(*registry)),
      queue_capacity_family_(prometheus::BuildGauge()
                                 .Name("attnd_queue_capacity")
                                 .Help("Calls the request queue holds (--queue-capacity); one "
                                       "more is refused with RESOURCE_EXHAUSTED.")
                                 .Register(*registry)),
      workers_busy_family_(prometheus::BuildGauge()
                               .Name("attnd_workers_busy")
                               .Help("Workers running an operator call now.")
                               .Register(*registry)),
      workers_family_(prometheus::BuildGauge()
                          .Name("attnd_workers")
                          .Help("Worker threads of the scheduler (--workers).")
                          .Register(*registry)),
      build_info_(prometheus::BuildGauge()
                      .Name("attnd_build_info")
                      .Help("Always 1; labels name the version and the backend.")
                      .Register(*registry)),
      work_counts_(prometheus::BuildCounter()
                       .Name("attnd_work_counts_total")
                       .Help("Successful calls by how their flops/logical bytes were counted: "
                             "exact, or upper_bound (every selection slot counted valid).")
                       .Register(*registry)) {
  inflight_ = &inflight_family_.Add({});
  queue_depth_ = &queue_depth_family_.Add({});
  queue_capacity_ = &queue_capacity_family_.Add({});
  workers_busy_ = &workers_busy_family_.Add({});
  workers_ = &workers_family_.Add({});
  copied_in_ = &copied_bytes_.Add({{"direction", "in"}});
  copied_out_ = &copied_bytes_.Add({{"direction", "out"}});
  copied_h2d_ = &copied_bytes_.Add({{"direction", "host_to_device"}});
  copied_d2h_ = &copied_bytes_.Add({{"direction", "device_to_host"}});
  count_readback_ = &copied_bytes_.Add({{"direction", "count_readback"}});
  build_info_.Add({{"version", std::string(version)}, {"backend", std::string(backend)}}).Set(1);
  for (const char* kind : {"host", "device"}) {
    regions_.Add({{"kind", kind}});
    region_bytes_.Add({{"kind", kind}});
  }
  for (const char* result : {"hit", "update", "capture"}) graph_cache_.Add({{"result", result}});
  stream_ordered_ = &prometheus::BuildCounter()
                         .Name("attnd_stream_ordered_calls_total")
                         .Help(
                             "Stream-ordered calls (ready/done signals) by event: enqueued, "
                             "device (enqueued wholly on a device stream, CUDA), done (ran, "
                             "done stored), failed (done has the failure bit).")
                         .Register(*registry);
  for (const char* event : {"enqueued", "device", "done", "failed"})
    stream_ordered_->Add({{"event", event}});
  signal_timeouts_ = &prometheus::BuildCounter()
                          .Name("attnd_signal_timeouts_total")
                          .Help(
                              "Stream-ordered calls failed by the watchdog without running: "
                              "their ready word was not reached by their deadline.")
                          .Register(*registry)
                          .Add({});
  prepared_calls_ = &prometheus::BuildGauge()
                         .Name("attnd_prepared_calls")
                         .Help("Prepared calls (PrepareCall) alive now.")
                         .Register(*registry)
                         .Add({});
  ring_entries_ = &prometheus::BuildCounter()
                       .Name("attnd_ring_entries_total")
                       .Help(
                           "Submission ring entries taken by the poller, by result: submitted, "
                           "rejected (refused when queued), invalid (bad entry), overrun.")
                       .Register(*registry);
  for (const char* result : {"submitted", "rejected", "invalid", "overrun"}) {
    ring_entries_->Add({{"result", result}});
  }
  rings_ = &prometheus::BuildGauge()
                .Name("attnd_submission_rings")
                .Help("Submission rings (OpenRing) open now.")
                .Register(*registry)
                .Add({});
  auto& spin = prometheus::BuildCounter()
                   .Name("attnd_poll_spin_seconds_total")
                   .Help(
                       "Seconds daemon threads spent polling without sleeping (--worker-spin), "
                       "by thread: worker, ring (the submission-ring poller), waiter (the "
                       "stream-ordered waiter).")
                   .Register(*registry);
  spin_worker_ = &spin.Add({{"thread", "worker"}});
  spin_ring_ = &spin.Add({{"thread", "ring"}});
  spin_waiter_ = &spin.Add({{"thread", "waiter"}});
  absl::MutexLock lock(&mu_);
  for (const std::string& op : ops) {
    ForOp(op);
    requests_by_code_[{op, "OK"}] = &requests_.Add({{"op", op}, {"code", "OK"}});
  }
}

Metrics::OpMetrics& Metrics::ForOp(const std::string& op) {
  auto it = ops_.find(op);
  if (it != ops_.end()) return it->second;
  OpMetrics& m = ops_[op];
  const prometheus::Labels labels{{"op", op}};
  m.request = &request_duration_.Add(labels, SecondsBuckets());
  m.queue = &queue_duration_.Add(labels, SecondsBuckets());
  m.logical_bytes = &logical_bytes_.Add(labels);
  m.flops = &flops_.Add(labels);
  m.bandwidth = &bandwidth_.Add(labels, BandwidthBuckets());
  m.achieved_flops = &achieved_flops_.Add(labels, FlopsBuckets());
  return m;
}

void Metrics::RecordCall(const CallRecord& r) {
  const std::string code = CodeLabel(r.code);
  absl::MutexLock lock(&mu_);
  OpMetrics& m = ForOp(r.op);
  prometheus::Counter*& requests = requests_by_code_[{r.op, code}];
  if (requests == nullptr) requests = &requests_.Add({{"op", r.op}, {"code", code}});
  requests->Increment();
  m.request->Observe(r.total_seconds);
  if (r.copied_in > 0) copied_in_->Increment(static_cast<double>(r.copied_in));
  if (r.copied_out > 0) copied_out_->Increment(static_cast<double>(r.copied_out));
  if (r.copied_h2d > 0) copied_h2d_->Increment(static_cast<double>(r.copied_h2d));
  if (r.copied_d2h > 0) copied_d2h_->Increment(static_cast<double>(r.copied_d2h));
  if (r.count_readback > 0) count_readback_->Increment(static_cast<double>(r.count_readback));
  if (!r.ran) return;
  m.queue->Observe(r.queue_seconds);
  prometheus::Histogram*& compute = compute_by_impl_[{r.op, r.impl}];
  if (compute == nullptr) {
    compute = &compute_duration_.Add({{"op", r.op}, {"impl", r.impl}}, SecondsBuckets());
  }
  compute->Observe(r.compute_seconds);
  if (r.code != absl::StatusCode::kOk) return;
  if (!r.work_count.empty()) {
    prometheus::Counter*& basis = work_counts_by_basis_[{r.op, r.work_count}];
    if (basis == nullptr) basis = &work_counts_.Add({{"op", r.op}, {"basis", r.work_count}});
    basis->Increment();
  }
  m.logical_bytes->Increment(r.logical_bytes);
  m.flops->Increment(r.flops);
  if (r.compute_seconds > 0) {
    m.bandwidth->Observe(r.logical_bytes / r.compute_seconds);
    m.achieved_flops->Observe(r.flops / r.compute_seconds);
  }
}

void Metrics::SetQueueLimits(int capacity, int workers) {
  queue_capacity_->Set(capacity);
  workers_->Set(workers);
}

void Metrics::SetRegions(absl::string_view kind, int64_t count, int64_t bytes) {
  const prometheus::Labels labels{{"kind", std::string(kind)}};
  regions_.Add(labels).Set(static_cast<double>(count));
  region_bytes_.Add(labels).Set(static_cast<double>(bytes));
}

void Metrics::RecordGraph(absl::string_view result) {
  // Per call: the label look-up is cached (Family::Add builds and hashes a label map).
  absl::MutexLock lock(&mu_);
  prometheus::Counter*& counter = graph_by_result_[std::string(result)];
  if (counter == nullptr) counter = &graph_cache_.Add({{"result", std::string(result)}});
  counter->Increment();
}

void Metrics::RecordStreamOrdered(absl::string_view event) {
  stream_ordered_->Add({{"event", std::string(event)}}).Increment();
}

void Metrics::AddPollSpin(absl::string_view thread, double seconds) {
  prometheus::Counter* c = thread == "worker"   ? spin_worker_
                           : thread == "ring"   ? spin_ring_
                           : thread == "waiter" ? spin_waiter_
                                                : nullptr;
  if (c != nullptr && seconds > 0) c->Increment(seconds);
}

void Metrics::RecordRingEntry(absl::string_view result) {
  ring_entries_->Add({{"result", std::string(result)}}).Increment();
}

void Metrics::SetPoolBytes(absl::string_view device, absl::string_view state, int64_t bytes) {
  prometheus::Family<prometheus::Gauge>* family = nullptr;
  if (state == "reserved") {
    family = &pool_reserved_;
  } else if (state == "used") {
    family = &pool_used_;
  } else if (state == "free") {
    family = &pool_free_;
  } else {
    return;
  }
  // Per GPU call (the backend publishes its pools after each): the label look-up is cached.
  absl::MutexLock lock(&mu_);
  prometheus::Gauge*& gauge = pool_gauges_[{family, std::string(device)}];
  if (gauge == nullptr) gauge = &family->Add({{"device", std::string(device)}});
  gauge->Set(static_cast<double>(bytes));
}

void Metrics::SetDeviceUp(absl::string_view device, bool up) {
  device_up_.Add({{"device", std::string(device)}}).Set(up ? 1 : 0);
}

void Metrics::SetDeviceMps(absl::string_view device, bool mps) {
  gpu_mps_.Add({{"device", std::string(device)}}).Set(mps ? 1 : 0);
}

}  // namespace attnd::server::metrics
