// The daemon's configuration: what attnd's flags (docs/FLAGS.md) say, as a plain struct that
// tests can fill directly.
//   ATTND_ASSIGN_OR_RETURN(DaemonConfig config, ConfigFromFlags());
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace attnd::server {

// --worker-spin=auto with a GPU backend (docs/FLAGS.md; measured in docs/BENCHMARKS.md).
inline constexpr absl::Duration kGpuWorkerSpin = absl::Milliseconds(1);

struct DaemonConfig {
  // gRPC addresses; empty: the default socket (DefaultSocketTarget, common/default_socket.h).
  std::vector<std::string> listen;
  std::string metrics_listen = "127.0.0.1:9464";  // host:port of /metrics; empty = off
  bool allow_client_shm = false;
  // Regions one client (docs/SERVICE.md "Trust model": a uid, a certificate subject, a TCP
  // connection) may have registered at once.
  int max_regions_per_client = 4096;
  std::string backend = "auto";  // auto | cpu | cuda | hip
  std::string tls_cert;          // PEM files; TLS on TCP listeners when cert and key are given
  std::string tls_key;
  std::string tls_ca;  // verify client certificates against this CA (mTLS)
  bool tls_require_client_cert = false;
  int queue_capacity = 256;
  int workers = 2;
  int cpu_threads = 0;  // 0 = every core
  // How long an idle worker polls for the next call before it sleeps (docs/FLAGS.md); unset:
  // kGpuWorkerSpin with a GPU backend, zero with the CPU backend.
  std::optional<absl::Duration> worker_spin;
  absl::Duration drain_timeout = absl::Seconds(30);
  // The longest a stream-ordered call waits for its ready word (docs/SERVICE.md "Stream-ordered
  // calls and prepared calls").
  absl::Duration signal_timeout = absl::Seconds(60);
  int64_t max_message_bytes = 512ll << 20;
  // Host memory of calls (inline outputs, aligned copies, index snapshots): all calls, and the
  // calls of one client (docs/SERVICE.md "Trust model").
  int64_t call_memory_bytes = 4ll << 30;
  int64_t call_memory_bytes_per_client = 1ll << 30;
  std::string ready_file;  // written with the bound addresses once serving
  std::string log_level = "info";
  // GPU backends (docs/FLAGS.md).
  int64_t pool_bytes = 8ll << 30;       // device memory pool reserved per device
  int64_t staging_bytes = 256ll << 20;  // pinned host staging for inline tensors (all devices)
  bool graphs = true;                   // capture and replay launch sequences as graphs
  std::vector<std::string> devices;     // UUIDs or ordinals to serve; empty = every visible GPU
  int streams_per_device = 4;
  // A blocking call's synchronise that waits this long marks the device stalled; 0: off.
  absl::Duration device_stall_timeout = absl::Minutes(5);
};

// "8GiB", "512MiB", "1.5GiB", "64KB", "1048576": bytes (binary Ki/Mi/Gi/Ti, decimal K/M/G/T with
// or without a trailing B). INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<int64_t> ParseByteSize(const std::string& flag, const std::string& text);

// Reads the absl flags (after absl::ParseCommandLine) into a config and checks it;
// INVALID_ARGUMENT naming the flag.
absl::StatusOr<DaemonConfig> ConfigFromFlags();

// Checks a config (ranges, TLS file combinations, backend names).
absl::Status CheckConfig(const DaemonConfig& config);

}  // namespace attnd::server
