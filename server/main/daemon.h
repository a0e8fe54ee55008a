// The attnd daemon, assembled: metrics registry, region registry, CPU backend and its thread
// pool, scheduler, op handlers, the gRPC server (listeners, TLS, health, reflection) and the
// /metrics endpoint. main() builds one from the flags; tests build one from a DaemonConfig.
//   Daemon daemon(config);
//   ATTND_RETURN_IF_ERROR(daemon.Start());
//   daemon.WaitForShutdownRequest();  // RequestShutdown() from the signal thread
//   daemon.Shutdown();                // graceful drain
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/main/config.h"

namespace grpc {
class Server;
}  // namespace grpc
namespace prometheus {
class Registry;
}  // namespace prometheus
namespace attnd::kernels {
class ThreadPool;
}  // namespace attnd::kernels

namespace attnd::server {
namespace engine {
class Backend;
class CallMemoryBudget;
class Scheduler;
}  // namespace engine
namespace metrics {
class Metrics;
class MetricsEndpoint;
}  // namespace metrics
namespace ops {
class OpTable;
class CallRunner;
}  // namespace ops
namespace regions {
class RegionRegistry;
}  // namespace regions
namespace grpc_front {
class AttentionService;
class UnixPeers;
}  // namespace grpc_front
class UnixListener;

class Daemon {
 public:
  explicit Daemon(DaemonConfig config);
  ~Daemon();  // Shutdown() if it was not called
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Builds everything and starts serving; UNAVAILABLE when an address cannot be bound,
  // INVALID_ARGUMENT for bad config, FAILED_PRECONDITION for a backend not built in.
  // Call once, from one thread.
  absl::Status Start();

  // The bound gRPC addresses ("unix:/run/attnd/attnd.sock", "127.0.0.1:43123") and metrics
  // host:port (empty when off). Valid after Start.
  const std::vector<std::string>& grpc_addresses() const { return grpc_addresses_; }
  const std::string& metrics_address() const { return metrics_address_; }

  // Asks the daemon to stop; thread-safe, non-blocking (the signal thread calls it).
  void RequestShutdown() ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until RequestShutdown was called.
  void WaitForShutdownRequest() ABSL_LOCKS_EXCLUDED(mu_);

  // Graceful stop: health NOT_SERVING (still answered: the listeners keep accepting), new op calls
  // refused, queued and running calls finish within drain_timeout; at it queued calls fail and
  // running ones are stopped (UNAVAILABLE), waited for at most a short grace; then the listeners
  // and the server stop. Returns within drain_timeout + the grace (2 s) unless a call ignores its
  // stop (then the server is left for main to _exit). True when everything finished in time.
  // Idempotent; blocks; call from one thread.
  bool Shutdown();

 private:
  absl::Status StartGrpc();
  absl::Status WriteReadyFile() const;

  const DaemonConfig config_;
  std::shared_ptr<prometheus::Registry> prometheus_;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<regions::RegionRegistry> registry_;
  std::unique_ptr<kernels::ThreadPool> pool_;
  std::unique_ptr<engine::Backend> backend_;
  std::unique_ptr<engine::Scheduler> scheduler_;
  std::unique_ptr<ops::OpTable> ops_;
  std::unique_ptr<ops::CallRunner> runner_;
  std::unique_ptr<engine::CallMemoryBudget> call_memory_;
  std::unique_ptr<grpc_front::UnixPeers> peers_;
  std::unique_ptr<grpc_front::AttentionService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<UnixListener>> unix_listeners_;  // after server_: stopped first
  std::unique_ptr<metrics::MetricsEndpoint> metrics_endpoint_;
  std::vector<std::string> grpc_addresses_;
  std::vector<std::string> unix_paths_;
  std::string metrics_address_;
  absl::Duration worker_spin_;  // the scheduler's, --worker-spin resolved (auto by backend)
  bool started_ = false;
  bool stopped_ = false;

  absl::Mutex mu_;  // WaitForShutdownRequest awaits shutdown_requested_
  bool shutdown_requested_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace attnd::server
