// GetInfo: version, backend, devices, ops with their implementations, limits.
#include "server/grpc/service.h"
#include "server/grpc/status.h"
#include "server/grpc/unary_call.h"

namespace attnd::server::grpc_front {

AttentionService::AttentionService(ServiceDeps deps) : deps_(std::move(deps)) {
  metrics::Metrics* metrics = deps_.runner->metrics();
  prepared_ = std::make_unique<ops::PreparedCallTable>(metrics, ops::PreparedCallTable::Options{});
  ops::StreamOrderedRunner::Options options;
  options.signal_timeout = deps_.signal_timeout;
  options.spin = deps_.poll_spin;
  // CUDA: calls whose tensors all lie in device regions are enqueued wholly on the device
  // (docs/SERVICE.md "Stream-ordered calls on a CUDA device").
  if (deps_.backend != nullptr && deps_.backend->kind() == kernels::Backend::kCuda) {
    options.backend = deps_.backend;
  }
  // The runner's scheduler outlives the service's calls: a drain waits for the pending calls
  // (each holds an admission) and they are failed once its deadline passes, before the daemon
  // tears it down.
  stream_ = std::make_unique<ops::StreamOrderedRunner>(deps_.runner, deps_.ops, deps_.registry,
                                                       metrics, options);
  ops::SubmissionRingTable::Options ring_options;
  ring_options.device_signals = options.backend != nullptr;
  ring_options.spin = deps_.poll_spin;
  rings_ = std::make_unique<ops::SubmissionRingTable>(deps_.registry, metrics, ring_options);
}

grpc::ServerUnaryReactor* AttentionService::GetInfo(grpc::CallbackServerContext* /*ctx*/,
                                                    const Raw* request, Raw* reply) {
  auto* call = new UnaryCall<v1::GetInfoRequest, v1::GetInfoResponse>("GetInfo", request, reply);
  if (!call->parsed()) return call;
  v1::GetInfoResponse* response = call->response();
  response->set_version(deps_.version);
  response->set_backend(deps_.backend->name());
  for (const engine::DeviceDescription& d : deps_.backend->Devices()) {
    v1::DeviceInfo* info = response->add_devices();
    info->set_name(d.name);
    info->set_uuid(d.uuid);
    info->set_memory_bytes(d.memory_bytes);
    info->set_arch(d.arch);
    info->set_cores(d.cores);
    info->set_mps(d.mps);
  }
  for (int i = 0; i < ops::kNumOps; ++i) {
    const auto id = static_cast<ops::OpId>(i);
    const ops::OpHandler* h = deps_.ops->Find(id);
    if (h == nullptr) continue;
    v1::OpInfo* op = response->add_ops();
    op->set_name(ops::OpName(id));
    op->set_rpc(ops::OpRpc(id));
    for (const std::string& impl : h->Implementations()) op->add_implementations(impl);
    op->set_fast_paths(h->FastPaths());
    for (const v1::Precision precision : h->Precisions()) op->add_precisions(precision);
    op->set_batch_invariant(h->BatchInvariant());
    for (const ops::CacheLayoutField& f : h->CacheLayouts()) {
      v1::CacheLayoutInfo* info = op->add_cache_layouts();
      info->set_field(f.field);
      info->set_tensor(f.tensor);
      for (const kernels::CacheLayoutUse& use : f.uses) {
        info->add_accepted(static_cast<v1::CacheLayout>(use.layout));
        if (use.inferred) info->add_inferred(static_cast<v1::CacheLayout>(use.layout));
      }
    }
  }
  v1::Limits* limits = response->mutable_limits();
  limits->set_max_message_bytes(deps_.limits.max_message_bytes);
  limits->set_queue_capacity(deps_.limits.queue_capacity);
  limits->set_workers(deps_.limits.workers);
  limits->set_cpu_threads(deps_.limits.cpu_threads);
  limits->set_allow_client_shm(deps_.limits.allow_client_shm);
  limits->set_max_rank(kernels::kMaxRank);
  limits->set_device_handle_bytes(regions::kDeviceHandleBytes);
  limits->set_pool_bytes_per_device(deps_.limits.pool_bytes_per_device);
  limits->set_graphs(deps_.limits.graphs);
  limits->set_streams_per_device(deps_.limits.streams_per_device);
  limits->set_worker_spin_ns(
      static_cast<uint64_t>(absl::ToInt64Nanoseconds(deps_.limits.worker_spin)));
  call->Reply(absl::OkStatus());
  return call;
}

}  // namespace attnd::server::grpc_front
