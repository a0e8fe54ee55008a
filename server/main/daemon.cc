#include "server/main/daemon.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/default_socket.h"
#include "common/grpc_hold.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "kernels/common/thread_pool.h"
#include "prometheus/registry.h"
#include "server/common/log.h"
#include "server/engine/call_memory.h"
#include "server/engine/cpu_backend.h"
#include "server/engine/gpu_backend_factory.h"
#include "server/engine/scheduler.h"
#include "server/grpc/health.h"
#include "server/grpc/service.h"
#include "server/main/listeners.h"
#include "server/metrics/exposer.h"
#include "server/metrics/metrics.h"
#include "server/ops/call_runner.h"
#include "server/ops/op_handler.h"
#include "server/regions/registry.h"

#ifndef ATTND_VERSION
#define ATTND_VERSION "0.0.0"
#endif

namespace attnd::server {
namespace {

// How long past --drain-timeout the drain waits for the calls it stopped there (their kernels
// stop at the next tile; a GPU call finishes what it had enqueued). A call still running after it
// is abandoned: attnd exits without it (docs/SERVICE.md "Scheduler, deadlines and shutdown").
constexpr absl::Duration kStopGrace = absl::Seconds(2);

}  // namespace

Daemon::Daemon(DaemonConfig config) : config_(std::move(config)) {}

Daemon::~Daemon() {
  if (started_) Shutdown();
  // Teardown order: nothing accepts or submits any more; jobs still referencing the runner finish
  // first. A step that takes longer than a second is logged (a teardown should take
  // milliseconds; a slow one is a thread that does not see the stop).
  auto step = [](const char* what, auto&& reset) {
    const absl::Time t0 = absl::Now();
    reset();
    const absl::Duration took = absl::Now() - t0;
    if (took > absl::Seconds(1)) {
      Log(LogLevel::kWarning, "slow teardown step",
          {{"step", what}, {"took", absl::FormatDuration(took)}});
    }
  };
  step("listeners", [&] {
    for (auto& listener : unix_listeners_) listener->Stop();
  });
  step("server", [&] { server_.reset(); });
  step("scheduler", [&] { scheduler_.reset(); });
  step("service", [&] { service_.reset(); });
  step("runner", [&] { runner_.reset(); });
  step("ops", [&] { ops_.reset(); });
  // Regions still pinned keep the backend's opener/pinner alive themselves.
  step("regions", [&] { registry_.reset(); });
  step("backend", [&] { backend_.reset(); });
  step("pool", [&] { pool_.reset(); });
  step("metrics endpoint", [&] { metrics_endpoint_.reset(); });
  step("metrics", [&] { metrics_.reset(); });
}

absl::Status Daemon::Start() {
  if (absl::Status s = CheckConfig(config_); !s.ok()) return s;
  LogLevel level;
  if (!ParseLogLevel(config_.log_level, &level)) {
    return absl::InvalidArgumentError(absl::StrCat("--log-level=", config_.log_level));
  }
  SetMinLogLevel(level);
  const std::string built_gpu = engine::GpuBackendName();
  bool use_gpu = false;
  if (config_.backend == "cuda" || config_.backend == "hip") {
    if (config_.backend != built_gpu) {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend=", config_.backend, ": this attnd is built ",
                       built_gpu.empty() ? std::string("without GPU backends (ATTND_GPU=off)")
                                         : absl::StrCat("with the ", built_gpu, " backend only"),
                       "; use --backend=", built_gpu.empty() ? "cpu" : built_gpu, " or auto"));
    }
    use_gpu = true;
  } else if (config_.backend == "auto") {
    use_gpu = !built_gpu.empty() && engine::VisibleGpuCount() > 0;
  }
  const int threads = config_.cpu_threads > 0
                          ? config_.cpu_threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  ops_ = std::make_unique<ops::OpTable>();
  std::vector<std::string> op_names;
  for (int i = 0; i < ops::kNumOps; ++i) op_names.push_back(ops::OpName(static_cast<ops::OpId>(i)));
  prometheus_ = std::make_shared<prometheus::Registry>();
  metrics_ = std::make_unique<metrics::Metrics>(prometheus_.get(), ATTND_VERSION,
                                                use_gpu ? built_gpu : "cpu", op_names);
  metrics::Metrics* m = metrics_.get();

  pool_ = std::make_unique<kernels::ThreadPool>(threads);
  if (use_gpu) {
    engine::GpuBackendOptions gopt;
    gopt.pool_bytes = static_cast<uint64_t>(config_.pool_bytes);
    gopt.staging_bytes = static_cast<uint64_t>(config_.staging_bytes);
    gopt.streams_per_device = config_.streams_per_device;
    gopt.stall_timeout = config_.device_stall_timeout;
    gopt.graphs = config_.graphs;
    gopt.devices = config_.devices;
    gopt.cpu_pool = pool_.get();
    gopt.on_pool_stats = [m](const std::string& pool, const char* state, int64_t bytes) {
      m->SetPoolBytes(pool, state, bytes);
    };
    gopt.on_log = [](int level, const std::string& message) {
      Log(static_cast<LogLevel>(level), message);
    };
    absl::StatusOr<std::unique_ptr<engine::Backend>> gpu = engine::MakeGpuBackend(gopt);
    if (!gpu.ok()) return gpu.status();
    backend_ = *std::move(gpu);
  } else {
    backend_ = std::make_unique<engine::CpuBackend>(pool_.get());
    metrics_->SetPoolBytes("cpu", "used", 0);
    metrics_->SetPoolBytes("cpu", "reserved", 0);
    metrics_->SetPoolBytes("cpu", "free", 0);
  }
  for (const engine::DeviceDescription& d : backend_->Devices()) {
    metrics_->SetDeviceMps(d.uuid, d.mps);
  }

  regions::RegionRegistry::Options ropt;
  ropt.allow_client_shm = config_.allow_client_shm;
  ropt.max_regions_per_owner = static_cast<size_t>(config_.max_regions_per_client);
  ropt.device_opener = backend_->device_opener();
  ropt.host_pinner = backend_->host_pinner();
  ropt.on_stats = [m](regions::RegionKind kind, int64_t count, int64_t bytes) {
    m->SetRegions(regions::RegionKindName(kind), count, bytes);
  };
  ropt.on_pin_failure = [](const std::string& name, const absl::Status& why) {
    Log(LogLevel::kWarning, "host region not pinned (copies from it are staged, slower)",
        {{"region", name}, {"error", why.message()}});
  };
  registry_ = std::make_unique<regions::RegionRegistry>(std::move(ropt));
  engine::Scheduler::Options sopt;
  sopt.queue_capacity = config_.queue_capacity;
  sopt.workers = config_.workers;
  // Auto: polling with a GPU backend, where a call's own work is short next to the wake-up it
  // saves; not with the CPU backend, whose pool would lose the polling core to it.
  worker_spin_ = config_.worker_spin.value_or(use_gpu ? kGpuWorkerSpin : absl::ZeroDuration());
  sopt.spin = worker_spin_;
  sopt.on_load = [m](int queued, int running) { m->SetQueueLoad(queued, running); };
  sopt.on_spin = [m](double seconds) { m->AddPollSpin("worker", seconds); };
  scheduler_ = std::make_unique<engine::Scheduler>(sopt, backend_.get());
  metrics_->SetQueueLimits(scheduler_->capacity(), std::max(1, scheduler_->workers()));

  engine::CallMemoryBudget::Limits budget;
  budget.total_bytes = static_cast<uint64_t>(config_.call_memory_bytes);
  budget.per_client_bytes = static_cast<uint64_t>(config_.call_memory_bytes_per_client);
  call_memory_ = std::make_unique<engine::CallMemoryBudget>(budget);
  peers_ = std::make_unique<grpc_front::UnixPeers>();

  ops::CallRunner::Options copt;
  copt.max_inline_bytes = static_cast<uint64_t>(config_.max_message_bytes);
  runner_ = std::make_unique<ops::CallRunner>(ops_.get(), scheduler_.get(), registry_.get(),
                                              metrics_.get(), copt);

  grpc_front::ServiceDeps deps;
  deps.version = ATTND_VERSION;
  deps.backend = backend_.get();
  deps.ops = ops_.get();
  deps.runner = runner_.get();
  deps.registry = registry_.get();
  deps.call_memory = call_memory_.get();
  deps.peers = peers_.get();
  deps.signal_timeout = config_.signal_timeout;
  deps.poll_spin = worker_spin_;
  deps.limits.worker_spin = worker_spin_;
  deps.limits.max_message_bytes = static_cast<uint64_t>(config_.max_message_bytes);
  deps.limits.queue_capacity = config_.queue_capacity;
  deps.limits.workers = config_.workers;
  deps.limits.cpu_threads = threads;
  deps.limits.allow_client_shm = config_.allow_client_shm;
  if (use_gpu) {
    deps.limits.pool_bytes_per_device = static_cast<uint64_t>(config_.pool_bytes);
    deps.limits.graphs = config_.graphs;
    deps.limits.streams_per_device = config_.streams_per_device;
  }
  service_ = std::make_unique<grpc_front::AttentionService>(std::move(deps));

  if (!config_.metrics_listen.empty()) {
    auto endpoint = metrics::MetricsEndpoint::Start(config_.metrics_listen, prometheus_);
    if (!endpoint.ok()) return endpoint.status();
    metrics_endpoint_ = *std::move(endpoint);
    metrics_address_ = metrics_endpoint_->address();
  }
  if (absl::Status s = StartGrpc(); !s.ok()) return s;
  started_ = true;
  for (const std::string& a : grpc_addresses_) Log(LogLevel::kInfo, "listening on " + a);
  if (!metrics_address_.empty()) {
    Log(LogLevel::kInfo, "metrics on http://" + metrics_address_ + "/metrics");
  }
  Log(LogLevel::kInfo, "attnd serving",
      {{"version", ATTND_VERSION},
       {"backend", backend_->name()},
       {"devices", static_cast<int64_t>(backend_->Devices().size())},
       {"cpu_threads", threads},
       {"workers", config_.workers},
       {"worker_spin", absl::FormatDuration(worker_spin_)},
       {"queue_capacity", config_.queue_capacity},
       {"allow_client_shm", config_.allow_client_shm}});
  return WriteReadyFile();
}

absl::Status Daemon::StartGrpc() {
  HoldGrpcForProcess();  // the destructor must not wait on gRPC's own shutdown
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(static_cast<int>(config_.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(config_.max_message_bytes));
  // A taken TCP port must fail the start, not be shared with another daemon.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tcp_creds = TcpCredentials(config_);
  if (!tcp_creds.ok()) return tcp_creds.status();

  // No --listen: the default socket, in a directory of attnd's own (created 0750).
  const std::vector<std::string> listen =
      config_.listen.empty() ? std::vector<std::string>{DefaultSocketTarget()} : config_.listen;
  std::vector<ListenAddress> addresses;
  std::vector<std::unique_ptr<int>> ports;
  for (const std::string& text : listen) {
    absl::StatusOr<ListenAddress> a = ParseListenAddress(text);
    if (!a.ok()) return a.status();
    if (a->is_unix) {
      if (config_.listen.empty()) {
        const std::string dir = a->unix_path.substr(0, a->unix_path.rfind('/'));
        if (absl::Status s = PrepareSocketDirectory(dir, 0750); !s.ok()) return s;
      }
      if (absl::Status s = PrepareUnixSocket(a->unix_path); !s.ok()) return s;
      // Unix sockets are accepted by attnd itself (UnixListener: survives EMFILE, knows peers).
      absl::StatusOr<std::unique_ptr<UnixListener>> listener =
          UnixListener::Bind(a->unix_path, peers_.get());
      if (!listener.ok()) return listener.status();
      unix_listeners_.push_back(*std::move(listener));
      unix_paths_.push_back(a->unix_path);
      ports.push_back(nullptr);
      addresses.push_back(*std::move(a));
      continue;
    }
    ports.push_back(std::make_unique<int>(0));
    builder.AddListeningPort(
        a->address,
        a->address.rfind("unix-abstract:", 0) == 0 ? grpc::InsecureServerCredentials() : *tcp_creds,
        ports.back().get());
    addresses.push_back(*std::move(a));
  }
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", absl::StrJoin(listen, ",")));
  }
  for (auto& listener : unix_listeners_) listener->Start(server_.get());
  for (size_t i = 0; i < addresses.size(); ++i) {
    const ListenAddress& a = addresses[i];
    if (a.is_unix) {
      grpc_addresses_.push_back(a.address);
    } else if (a.address.rfind("unix-abstract:", 0) == 0) {
      grpc_addresses_.push_back(a.address);
    } else {
      if (*ports[i] == 0) return absl::UnavailableError(absl::StrCat("cannot bind ", a.address));
      grpc_addresses_.push_back(WithPort(a.address, *ports[i]));
    }
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
  server_->GetHealthCheckService()->SetServingStatus(v1::Attention::service_full_name(), true);
  // A lost device turns both NOT_SERVING for good (removed in Shutdown, before the server goes).
  grpc_front::WatchDeviceLoss(backend_.get(), server_->GetHealthCheckService(), metrics_.get());
  return absl::OkStatus();
}

absl::Status Daemon::WriteReadyFile() const {
  if (config_.ready_file.empty()) return absl::OkStatus();
  std::string text;
  for (const std::string& a : grpc_addresses_) absl::StrAppend(&text, "grpc ", a, "\n");
  if (!metrics_address_.empty()) absl::StrAppend(&text, "metrics ", metrics_address_, "\n");
  // A fresh temporary file beside the ready file (mkostemp creates it with O_EXCL: never an
  // existing file, never through a planted symlink), then renamed over the ready file (rename
  // replaces a symlink there, it does not follow it).
  std::string tmp = absl::StrCat(config_.ready_file, ".XXXXXX");
  const int fd = mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create a file beside --ready-file '",
                                            config_.ready_file, "': ", strerror(errno)));
  }
  bool ok = fchmod(fd, 0644) == 0;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = close(fd) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), config_.ready_file.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot write --ready-file '", config_.ready_file, "': ", strerror(err)));
  }
  return absl::OkStatus();
}

void Daemon::RequestShutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_requested_ = true;
}

void Daemon::WaitForShutdownRequest() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&shutdown_requested_));
}

bool Daemon::Shutdown() {
  if (!started_ || stopped_) return true;
  stopped_ = true;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + config_.drain_timeout;
  Log(LogLevel::kInfo, "draining",
      {{"timeout", absl::FormatDuration(config_.drain_timeout)},
       {"queued", scheduler_->queued()},
       {"running", scheduler_->running()},
       {"preparing", scheduler_->admitted()},
       {"sessions", service_->open_sessions()}});
  // Health turns NOT_SERVING and stays answerable while the scheduler drains: the listeners keep
  // accepting, so probes (and new clients) see NOT_SERVING, and new op calls get UNAVAILABLE from
  // the scheduler. At the deadline the scheduler fails what is queued and stops what runs (the
  // kernels poll the calls' stop tokens); then the server stops, cancelling what is still open.
  server_->GetHealthCheckService()->SetServingStatus(false);
  const bool drained = scheduler_->Drain(deadline, kStopGrace);
  backend_->SetDeviceLostCallback(nullptr);  // it sets the server's health
  const int abandoned = scheduler_->running();
  for (auto& listener : unix_listeners_) listener->Stop();
  if (abandoned == 0) {
    server_->Shutdown(absl::ToChronoTime(deadline));
    server_->Wait();
  } else {
    // gRPC's shutdown would wait for those calls' replies: exit without them (main _exits).
    Log(LogLevel::kWarning, "calls did not stop within the grace; exiting without them",
        {{"running", abandoned}, {"grace", absl::FormatDuration(kStopGrace)}});
  }
  for (const std::string& path : unix_paths_) unlink(path.c_str());
  if (!config_.ready_file.empty()) unlink(config_.ready_file.c_str());
  Log(LogLevel::kInfo, "stopped",
      {{"drained", drained}, {"took", absl::FormatDuration(absl::Now() - start)}});
  return drained;
}

}  // namespace attnd::server
