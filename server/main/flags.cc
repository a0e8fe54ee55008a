// attnd's command-line flags (absl flags). Every flag is documented in docs/FLAGS.md.
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/main/config.h"

ABSL_FLAG(std::string, listen, "unix:/tmp/attnd.sock",
          "Comma-separated gRPC listen addresses: unix:/path (socket file mode 0660) and/or "
          "host:port for TCP (port 0 picks a free port; the bound one is logged and written to "
          "--ready-file). Example: unix:/run/attnd/attnd.sock,0.0.0.0:50051");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "host:port of the Prometheus /metrics endpoint (port 0 picks a free port); empty "
          "disables it.");
ABSL_FLAG(bool, allow_client_shm, false,
          "Allow clients to register shared-memory regions (POSIX shm host regions and GPU IPC "
          "device regions). Off by default: RegisterHostRegion answers FAILED_PRECONDITION.");
ABSL_FLAG(std::string, backend, "auto",
          "Compute backend: auto | cpu | cuda | hip. auto picks a GPU backend when one is built "
          "and a device is present, else cpu.");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain for TLS on TCP listeners.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls-cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle to verify client certificates (mutual TLS) on TCP listeners.");
ABSL_FLAG(bool, tls_require_client_cert, false,
          "With --tls-ca: refuse TCP clients without a valid certificate (mTLS).");
ABSL_FLAG(int, queue_capacity, 256,
          "Operator calls that may wait for a worker; beyond it calls fail RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, workers, 2, "Scheduler worker threads (calls running at once).");
ABSL_FLAG(int, cpu_threads, 0, "Threads of the CPU backend's pool; 0 = every core.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM/SIGINT: how long in-flight calls may take to finish before they are "
          "cancelled (health reports NOT_SERVING meanwhile); then attnd exits 0.");
ABSL_FLAG(int64_t, max_message_bytes, 512ll << 20,
          "Largest gRPC message received or sent (inline tensors count; region tensors do "
          "not). At most 2147483647.");
ABSL_FLAG(std::string, ready_file, "",
          "When set, written (atomically) once attnd serves: one line per bound address, "
          "'grpc <address>' and 'metrics <host:port>'.");
ABSL_FLAG(std::string, log_level, "info", "Minimum log level: debug | info | warning | error.");

namespace attnd::server {

absl::Status CheckConfig(const DaemonConfig& c) {
  if (c.listen.empty()) return absl::InvalidArgumentError("--listen: no address");
  for (const std::string& a : c.listen) {
    if (a.empty()) return absl::InvalidArgumentError("--listen: empty address");
  }
  if (c.backend != "auto" && c.backend != "cpu" && c.backend != "cuda" && c.backend != "hip") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend=", c.backend, ": want auto, cpu, cuda or hip"));
  }
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!c.tls_ca.empty() && c.tls_cert.empty()) {
    return absl::InvalidArgumentError("--tls-ca needs --tls-cert and --tls-key");
  }
  if (c.tls_require_client_cert && c.tls_ca.empty()) {
    return absl::InvalidArgumentError("--tls-require-client-cert needs --tls-ca");
  }
  if (c.queue_capacity < 1) return absl::InvalidArgumentError("--queue-capacity must be >= 1");
  if (c.workers < 1 || c.workers > 1024) {
    return absl::InvalidArgumentError("--workers must be in 1..1024");
  }
  if (c.cpu_threads < 0 || c.cpu_threads > 4096) {
    return absl::InvalidArgumentError("--cpu-threads must be in 0..4096");
  }
  if (c.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain-timeout must be >= 0");
  }
  if (c.max_message_bytes < 1024 || c.max_message_bytes > 2147483647ll) {
    return absl::InvalidArgumentError("--max-message-bytes must be in 1024..2147483647");
  }
  return absl::OkStatus();
}

std::vector<std::string> NormalizeFlagArgs(int argc, char** argv) {
  std::vector<std::string> out;
  bool flags_done = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (i == 0 || flags_done || arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      out.push_back(std::move(arg));
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      out.push_back(std::move(arg));
      continue;
    }
    const size_t eq = arg.find('=');
    std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (name.compare(0, 3, "no-") == 0) name = "no" + name.substr(3);
    for (char& c : name) {
      if (c == '-') c = '_';
    }
    out.push_back(absl::StrCat("--", name, eq == std::string::npos ? "" : arg.substr(eq)));
  }
  return out;
}

absl::StatusOr<DaemonConfig> ConfigFromFlags() {
  DaemonConfig c;
  c.listen.clear();
  for (absl::string_view a :
       absl::StrSplit(absl::GetFlag(FLAGS_listen), ',', absl::SkipWhitespace())) {
    c.listen.emplace_back(absl::StripAsciiWhitespace(a));
  }
  c.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  c.allow_client_shm = absl::GetFlag(FLAGS_allow_client_shm);
  c.backend = absl::GetFlag(FLAGS_backend);
  c.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  c.tls_key = absl::GetFlag(FLAGS_tls_key);
  c.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  c.tls_require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  c.queue_capacity = absl::GetFlag(FLAGS_queue_capacity);
  c.workers = absl::GetFlag(FLAGS_workers);
  c.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  c.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  c.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  c.ready_file = absl::GetFlag(FLAGS_ready_file);
  c.log_level = absl::GetFlag(FLAGS_log_level);
  if (absl::Status s = CheckConfig(c); !s.ok()) return s;
  return c;
}

}  // namespace attnd::server
