#include "server/ops/call_runner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/log.h"

namespace attnd::server::ops {

struct CallRunner::State {
  OpId id;
  google::protobuf::Message* response = nullptr;
  CallContext ctx;
  std::function<void(absl::Status)> done;
  std::unique_ptr<PreparedCall> call;
  absl::Time prepared = absl::InfinitePast();  // resolved and validated, about to be queued
};

CallRunner::CallRunner(const OpTable* ops, engine::Scheduler* scheduler,
                       const regions::RegionRegistry* registry, metrics::Metrics* metrics,
                       Options options)
    : ops_(ops), scheduler_(scheduler), registry_(registry), metrics_(metrics), options_(options) {}

void CallRunner::Start(OpId id, const google::protobuf::Message& request,
                       google::protobuf::Message* response, CallContext ctx,
                       std::function<void(absl::Status)> done,
                       engine::Scheduler::Admission admission) {
  auto state = std::make_shared<State>();
  state->id = id;
  state->response = response;
  state->ctx = std::move(ctx);
  state->done = std::move(done);
  if (state->ctx.request_id == 0) state->ctx.request_id = NewRequestId();
  if (state->ctx.received == absl::InfinitePast()) state->ctx.received = absl::Now();
  if (metrics_ != nullptr) metrics_->AddInflight(1);

  const OpHandler* handler = ops_->Find(id);
  if (handler == nullptr) {
    Finish(std::move(state),
           absl::UnimplementedError(absl::StrCat(OpName(id), " is not built into this attnd")),
           nullptr);
    return;
  }
  // Admitted before resolving the regions: a drain that starts meanwhile waits for this call
  // (docs/SERVICE.md "Scheduler, deadlines and shutdown").
  if (!admission) admission = scheduler_->Admit();
  if (!admission) {
    Finish(std::move(state), absl::UnavailableError("attnd is shutting down"), nullptr);
    return;
  }
  PrepareOptions prep;
  prep.registry = registry_;
  prep.max_inline_bytes = options_.max_inline_bytes;
  prep.memory = state->ctx.memory.get();
  prep.owner = state->ctx.owner;
  absl::StatusOr<std::unique_ptr<PreparedCall>> call = handler->Prepare(request, response, prep);
  if (!call.ok()) {
    Finish(std::move(state), call.status(), nullptr);
    return;
  }
  state->call = *std::move(call);
  state->prepared = absl::Now();

  auto job = std::make_unique<engine::Job>();
  job->id = state->ctx.request_id;
  job->op = OpName(id);
  job->deadline = state->ctx.deadline;
  job->cancelled = state->ctx.cancelled;
  job->steps = state->call->Steps();
  job->done = [this, state](engine::JobOutcome outcome) {
    Finish(state, outcome.status, &outcome);
  };
  if (absl::Status s = scheduler_->Submit(std::move(job), &admission); !s.ok()) {
    // The job (and its copy of `state`) is gone; `state` is ours again.
    Finish(std::move(state), s, nullptr);
  }
}

void CallRunner::Finish(std::shared_ptr<State> state, absl::Status status,
                        const engine::JobOutcome* outcome) {
  metrics::CallRecord rec;
  rec.op = OpName(state->id);
  kernels::WorkCount work;
  v1::Precision precision = v1::PRECISION_UNSPECIFIED;
  v1::Precision index_precision = v1::PRECISION_UNSPECIFIED;
  bool batch_invariant = false;
  if (state->call != nullptr) {
    precision = state->call->precision();
    index_precision = state->call->index_precision();
    batch_invariant = state->call->batch_invariant();
    // A host region truncated under the call gave it zero pages: its result is not the client's.
    if (status.ok()) status = state->call->call_tensors().CheckRegions();
    if (status.ok()) {
      state->call->call_tensors().FinishOutputs();
      work = state->call->Count();
      rec.work_count = state->call->count_basis();
    }
    rec.copied_in = state->call->call_tensors().copied_in();
    rec.copied_out = status.ok() ? state->call->call_tensors().copied_out() : 0;
    state->call.reset();  // release region pins and staging buffers now
  }
  const double total = absl::ToDoubleSeconds(absl::Now() - state->ctx.received);
  const double run = outcome != nullptr ? absl::ToDoubleSeconds(outcome->run) : 0.0;
  const double prepare = state->prepared == absl::InfinitePast()
                             ? 0.0
                             : absl::ToDoubleSeconds(state->prepared - state->ctx.received);
  rec.code = status.code();
  rec.total_seconds = total;
  if (outcome != nullptr) {
    rec.ran = outcome->ran;
    rec.impl = outcome->impl;
    rec.queue_seconds = absl::ToDoubleSeconds(outcome->queue);
    rec.compute_seconds = absl::ToDoubleSeconds(outcome->compute);
    rec.copied_h2d = outcome->copied_h2d;
    rec.copied_d2h = outcome->copied_d2h;
    rec.count_readback = outcome->count_readback;
  }
  rec.flops = work.flops;
  rec.logical_bytes = work.bytes;
  if (v1::CallStats* stats = MutableStats(state->response); stats != nullptr) {
    stats->set_queue_seconds(rec.queue_seconds);
    stats->set_compute_seconds(rec.compute_seconds);
    stats->set_total_seconds(total);
    stats->set_prepare_seconds(prepare);
    stats->set_run_seconds(run);
    stats->set_impl(rec.impl);
    stats->set_flops(work.flops);
    stats->set_logical_bytes(work.bytes);
    if (rec.compute_seconds > 0) {
      stats->set_achieved_flops_per_second(work.flops / rec.compute_seconds);
      stats->set_achieved_bytes_per_second(work.bytes / rec.compute_seconds);
    }
    stats->set_copied_bytes_in(rec.copied_in);
    stats->set_copied_bytes_out(rec.copied_out);
    stats->set_request_id(state->ctx.request_id);
    stats->set_copied_bytes_host_to_device(rec.copied_h2d);
    stats->set_copied_bytes_device_to_host(rec.copied_d2h);
    stats->set_count_readback_bytes(rec.count_readback);
    stats->set_work_count(rec.work_count);
    stats->set_precision(precision);
    stats->set_index_precision(index_precision);
    stats->set_batch_invariant(batch_invariant);
    if (outcome != nullptr) {
      stats->set_device_uuid(outcome->device);
      stats->set_graph(outcome->graph);
    }
  }
  if (metrics_ != nullptr) {
    metrics_->RecordCall(rec);
    if (outcome != nullptr && !outcome->graph.empty()) metrics_->RecordGraph(outcome->graph);
    metrics_->AddInflight(-1);
  }
  if (status.ok()) {
    if (LogEnabled(LogLevel::kDebug)) {
      Log(LogLevel::kDebug, "call done",
          {{"req", state->ctx.request_id},
           {"op", rec.op},
           {"origin", state->ctx.origin},
           {"code", "OK"},
           {"impl", rec.impl},
           {"total_us", static_cast<int64_t>(total * 1e6)},
           {"prepare_us", static_cast<int64_t>(prepare * 1e6)},
           {"queue_us", static_cast<int64_t>(rec.queue_seconds * 1e6)},
           {"run_us", static_cast<int64_t>(run * 1e6)},
           {"compute_us", static_cast<int64_t>(rec.compute_seconds * 1e6)}});
    }
  } else {
    Log(LogLevel::kInfo, "call failed",
        {{"req", state->ctx.request_id},
         {"op", rec.op},
         {"origin", state->ctx.origin},
         {"code", metrics::CodeLabel(status.code())},
         {"error", status.message()},
         {"total_us", static_cast<int64_t>(total * 1e6)}});
  }
  auto done = std::move(state->done);
  state.reset();
  if (done) done(std::move(status));
}

}  // namespace attnd::server::ops
