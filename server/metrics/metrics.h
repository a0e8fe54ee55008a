// attnd's Prometheus metrics (docs/SERVICE.md "Metrics"), base units and Prometheus naming. Built
// on a registry the owner constructs (main, a test) and passes in; never global.
//   auto registry = std::make_shared<prometheus::Registry>();
//   Metrics metrics(registry.get(), "0.1.0", "cpu", {"sparse_mla", ...});
//   metrics.RecordCall({.op = "sparse_mla", .code = absl::StatusCode::kOk, ...});
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace attnd::server::metrics {

// What one finished call (successful or not) reports.
struct CallRecord {
  std::string op;  // "sparse_mla"
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string impl;          // empty when nothing ran
  double total_seconds = 0;  // received -> reply ready
  double queue_seconds = 0;
  double compute_seconds = 0;
  bool ran = false;  // queue/compute/work figures are meaningful
  double flops = 0;
  double logical_bytes = 0;
  uint64_t copied_in = 0;       // inline bytes copied into the daemon
  uint64_t copied_out = 0;      // inline bytes copied out in replies
  uint64_t copied_h2d = 0;      // GPU: bytes DMA'd host -> device
  uint64_t copied_d2h = 0;      // GPU: bytes DMA'd device -> host
  uint64_t count_readback = 0;  // GPU: device index bytes read back for the work count
  std::string work_count;       // "exact" | "upper_bound" (successful calls)
};

class Metrics {
 public:
  // `registry` (not owned) must outlive this object. `ops` are pre-created so every family
  // shows each op from the first scrape.
  Metrics(prometheus::Registry* registry, absl::string_view version, absl::string_view backend,
          const std::vector<std::string>& ops);
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Thread-safe.
  void RecordCall(const CallRecord& r) ABSL_LOCKS_EXCLUDED(mu_);
  void AddInflight(double delta) { inflight_->Increment(delta); }
  // The scheduler's bounds (--queue-capacity, --workers): attnd_queue_capacity, attnd_workers.
  void SetQueueLimits(int capacity, int workers);
  // Calls waiting for a worker and calls running now: attnd_queue_depth, attnd_workers_busy.
  void SetQueueLoad(int queued, int running) {
    queue_depth_->Set(queued);
    workers_busy_->Set(running);
  }
  // kind: "host" or "device".
  void SetRegions(absl::string_view kind, int64_t count, int64_t bytes);
  // One figure of a memory pool: `state` "reserved", "used" or "free" is the metric
  // (attnd_pool_<state>_bytes), `device` (a GPU UUID, "pinned-staging", "cpu") its one label, so
  // that a sum over devices is a total of one kind of bytes. Other states are ignored.
  void SetPoolBytes(absl::string_view device, absl::string_view state, int64_t bytes);
  // attnd_device_up{device}: 1 while usable, 0 once lost.
  void SetDeviceUp(absl::string_view device, bool up);
  // attnd_gpu_mps{device}: 1 when the device's contexts are shared through an MPS server, else 0
  // (docs/OPERATIONS.md "MPS"). Set once at start-up.
  void SetDeviceMps(absl::string_view device, bool mps);
  // result: "hit", "update" or "capture" (attnd_graph_cache_total).
  void RecordGraph(absl::string_view result);
  // Stream-ordered calls (docs/SERVICE.md "Stream-ordered calls and prepared calls"): event
  // "enqueued", "device" (also counted in enqueued: the call took the device path), "done" or
  // "failed" (attnd_stream_ordered_calls_total); a call failed by the
  // watchdog because its ready word was not reached in time (attnd_signal_timeouts_total); the
  // prepared calls alive now (attnd_prepared_calls).
  void RecordStreamOrdered(absl::string_view event);
  void RecordSignalTimeout() { signal_timeouts_->Increment(); }
  void SetPreparedCalls(int64_t live) { prepared_calls_->Set(static_cast<double>(live)); }
  // Submission rings (docs/SERVICE.md "Submission rings"): entries the poller took, by result
  // "submitted" (queued like RunPrepared), "rejected" (valid, but refused when queued: failure
  // bit), "invalid" (a bad entry: failure bit where its done word is valid) or "overrun" (head
  // ran past the ring: the ring errored) (attnd_ring_entries_total); the rings open now
  // (attnd_submission_rings).
  void RecordRingEntry(absl::string_view result);
  void SetSubmissionRings(int64_t open) { rings_->Set(static_cast<double>(open)); }
  // Seconds a daemon thread spent polling without sleeping (--worker-spin), by thread: "worker"
  // (a scheduler worker waiting for a call), "ring" (the submission-ring poller), "waiter" (the
  // stream-ordered waiter) (attnd_poll_spin_seconds_total). Another name is ignored.
  void AddPollSpin(absl::string_view thread, double seconds);

 private:
  struct OpMetrics {
    prometheus::Histogram* request = nullptr;
    prometheus::Histogram* queue = nullptr;
    prometheus::Counter* logical_bytes = nullptr;
    prometheus::Counter* flops = nullptr;
    prometheus::Histogram* bandwidth = nullptr;
    prometheus::Histogram* achieved_flops = nullptr;
  };
  OpMetrics& ForOp(const std::string& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Histogram>& queue_duration_;
  prometheus::Family<prometheus::Histogram>& compute_duration_;
  prometheus::Family<prometheus::Counter>& logical_bytes_;
  prometheus::Family<prometheus::Counter>& flops_;
  prometheus::Family<prometheus::Histogram>& bandwidth_;
  prometheus::Family<prometheus::Histogram>& achieved_flops_;
  prometheus::Family<prometheus::Counter>& copied_bytes_;
  prometheus::Family<prometheus::Gauge>& pool_reserved_;
  prometheus::Family<prometheus::Gauge>& pool_used_;
  prometheus::Family<prometheus::Gauge>& pool_free_;
  prometheus::Family<prometheus::Gauge>& device_up_;
  prometheus::Family<prometheus::Gauge>& gpu_mps_;
  prometheus::Family<prometheus::Gauge>& regions_;
  prometheus::Family<prometheus::Gauge>& region_bytes_;
  prometheus::Family<prometheus::Counter>& graph_cache_;
  prometheus::Family<prometheus::Gauge>& inflight_family_;
  prometheus::Family<prometheus::Gauge>& queue_depth_family_;
  prometheus::Family<prometheus::Gauge>& queue_capacity_family_;
  prometheus::Family<prometheus::Gauge>& workers_busy_family_;
  prometheus::Family<prometheus::Gauge>& workers_family_;
  prometheus::Family<prometheus::Gauge>& build_info_;
  prometheus::Family<prometheus::Counter>& work_counts_;
  prometheus::Gauge* inflight_ = nullptr;
  prometheus::Gauge* queue_depth_ = nullptr;
  prometheus::Gauge* queue_capacity_ = nullptr;
  prometheus::Gauge* workers_busy_ = nullptr;
  prometheus::Gauge* workers_ = nullptr;
  prometheus::Counter* copied_in_ = nullptr;
  prometheus::Counter* copied_out_ = nullptr;
  prometheus::Counter* copied_h2d_ = nullptr;
  prometheus::Counter* copied_d2h_ = nullptr;
  prometheus::Counter* count_readback_ = nullptr;
  // Stream-ordered and prepared calls (registered in the constructor's body).
  prometheus::Family<prometheus::Counter>* stream_ordered_ = nullptr;
  prometheus::Counter* signal_timeouts_ = nullptr;
  prometheus::Gauge* prepared_calls_ = nullptr;
  prometheus::Family<prometheus::Counter>* ring_entries_ = nullptr;
  prometheus::Gauge* rings_ = nullptr;
  prometheus::Counter* spin_worker_ = nullptr;
  prometheus::Counter* spin_ring_ = nullptr;
  prometheus::Counter* spin_waiter_ = nullptr;

  absl::Mutex mu_;
  std::map<std::string, OpMetrics> ops_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, prometheus::Counter*> requests_by_code_
      ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, prometheus::Histogram*> compute_by_impl_
      ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, prometheus::Counter*> work_counts_by_basis_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Counter*> graph_by_result_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<const void*, std::string>, prometheus::Gauge*> pool_gauges_
      ABSL_GUARDED_BY(mu_);
};

// The gRPC-style name of an absl code ("OK", "INVALID_ARGUMENT"): the `code` label.
std::string CodeLabel(absl::StatusCode code);

}  // namespace attnd::server::metrics
