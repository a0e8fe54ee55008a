// attnd's command-line flags (absl flags). Every flag is documented in docs/FLAGS.md.
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/main/config.h"

ABSL_FLAG(std::string, listen, "",
          "Comma-separated gRPC listen addresses: unix:/path (socket file mode 0660) and/or "
          "host:port for TCP (port 0 picks a free port; the bound one is logged and written to "
          "--ready-file). Example: unix:/run/attnd/attnd.sock,0.0.0.0:50051. Empty: "
          "unix:/run/attnd/attnd.sock as root, else unix:$XDG_RUNTIME_DIR/attnd/attnd.sock or "
          "unix:/tmp/attnd-<uid>/attnd.sock (the directory created 0750 by attnd).");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "host:port of the Prometheus /metrics endpoint (port 0 picks a free port); empty "
          "disables it.");
ABSL_FLAG(bool, allow_client_shm, false,
          "Allow clients to register shared-memory regions (POSIX shm host regions and GPU IPC "
          "device regions). Off by default: RegisterHostRegion answers FAILED_PRECONDITION.");
ABSL_FLAG(int, max_regions_per_client, 4096,
          "Regions (host and device) one client may have registered at once: a uid on the unix "
          "socket, a client certificate or a connection on TCP. Beyond it RegisterHostRegion and "
          "RegisterDeviceRegion answer RESOURCE_EXHAUSTED. 1..65536.");
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
ABSL_FLAG(std::string, worker_spin, "auto",
          "How long a worker that finished a call keeps polling for the next one before it "
          "sleeps (a duration, at most 10ms; 0 = never; auto = 1ms with a GPU backend, 0 with "
          "the CPU backend): a call arriving meanwhile starts without a thread wake-up, for one "
          "core kept busy that long after each call.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM/SIGINT: how long in-flight calls may take to finish before they are "
          "cancelled (health reports NOT_SERVING meanwhile); then attnd exits 0.");
ABSL_FLAG(absl::Duration, signal_timeout, absl::Seconds(60),
          "The longest a stream-ordered call (ready/done signals) waits for its ready word when "
          "its own deadline is later; then it fails DEADLINE_EXCEEDED without running and its "
          "done word gets the failure bit.");
ABSL_FLAG(int64_t, max_message_bytes, 512ll << 20,
          "Largest gRPC message received or sent (inline tensors count; region tensors do "
          "not). At most 2147483647.");
ABSL_FLAG(std::string, call_memory_bytes, "4GiB",
          "Host memory that op calls may hold at once for their inline outputs, aligned copies "
          "and index snapshots, reserved before anything is allocated; a call that does not fit "
          "gets RESOURCE_EXHAUSTED. Bytes with an optional unit: 4GiB, 512MiB.");
ABSL_FLAG(std::string, call_memory_bytes_per_client, "1GiB",
          "The same, for the calls of one client (a uid on the unix socket, a connection on "
          "TCP).");
ABSL_FLAG(std::string, ready_file, "",
          "When set, written (atomically) once attnd serves: one line per bound address, "
          "'grpc <address>' and 'metrics <host:port>'.");
ABSL_FLAG(std::string, log_level, "info", "Minimum log level: debug | info | warning | error.");
ABSL_FLAG(std::string, pool_bytes, "8GiB",
          "GPU backends: device memory reserved at start on each served device for staged "
          "tensors and kernel workspaces (a hard limit: calls that do not fit get "
          "RESOURCE_EXHAUSTED). Bytes with an optional unit: 8GiB, 512MiB, 4GB.");
ABSL_FLAG(std::string, staging_bytes, "256MiB",
          "GPU backends: pinned host memory for staging inline tensors (shared by every device). "
          "Calls that do not fit copy from pageable memory instead (slower, still correct).");
ABSL_FLAG(bool, graphs, true,
          "GPU backends: capture each op's launch sequence once per launch key and replay it "
          "(updating the executable graph when only pointers change). --graphs=false launches "
          "directly, for comparison.");
ABSL_FLAG(std::string, devices, "",
          "GPU backends: comma-separated devices to serve, by UUID (GPU-…, as nvidia-smi -L "
          "prints) or ordinal; empty = every visible GPU.");
ABSL_FLAG(int, streams_per_device, 4,
          "GPU backends: streams per device; independent calls on one device overlap up to this "
          "many (and up to --workers).");
ABSL_FLAG(absl::Duration, device_stall_timeout, absl::Minutes(5),
          "GPU backends: a blocking call whose synchronise (the daemon's own launches, no client "
          "ready event) has waited this long marks its device lost as stalled: health turns "
          "NOT_SERVING and later calls on it fail UNAVAILABLE until attnd restarts. 0 = off; at "
          "most 24h.");

namespace attnd::server {

absl::Status CheckConfig(const DaemonConfig& c) {
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
  if (c.max_regions_per_client < 1 || c.max_regions_per_client > 65536) {
    return absl::InvalidArgumentError("--max-regions-per-client must be in 1..65536");
  }
  if (c.queue_capacity < 1) return absl::InvalidArgumentError("--queue-capacity must be >= 1");
  if (c.workers < 1 || c.workers > 1024) {
    return absl::InvalidArgumentError("--workers must be in 1..1024");
  }
  if (c.cpu_threads < 0 || c.cpu_threads > 4096) {
    return absl::InvalidArgumentError("--cpu-threads must be in 0..4096");
  }
  if (c.worker_spin.has_value() &&
      (*c.worker_spin < absl::ZeroDuration() || *c.worker_spin > absl::Milliseconds(10))) {
    return absl::InvalidArgumentError("--worker-spin must be in 0..10ms");
  }
  if (c.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain-timeout must be >= 0");
  }
  if (c.signal_timeout <= absl::ZeroDuration() || c.signal_timeout > absl::Hours(24)) {
    return absl::InvalidArgumentError("--signal-timeout must be > 0 and at most 24h");
  }
  if (c.max_message_bytes < 1024 || c.max_message_bytes > 2147483647ll) {
    return absl::InvalidArgumentError("--max-message-bytes must be in 1024..2147483647");
  }
  if (c.call_memory_bytes < (1ll << 20)) {
    return absl::InvalidArgumentError("--call-memory-bytes must be >= 1MiB");
  }
  if (c.call_memory_bytes_per_client < (1ll << 20)) {
    return absl::InvalidArgumentError("--call-memory-bytes-per-client must be >= 1MiB");
  }
  if (c.pool_bytes < (1ll << 20)) return absl::InvalidArgumentError("--pool-bytes must be >= 1MiB");
  if (c.staging_bytes < 0) return absl::InvalidArgumentError("--staging-bytes must be >= 0");
  if (c.streams_per_device < 1 || c.streams_per_device > 64) {
    return absl::InvalidArgumentError("--streams-per-device must be in 1..64");
  }
  if (c.device_stall_timeout < absl::ZeroDuration() || c.device_stall_timeout > absl::Hours(24)) {
    return absl::InvalidArgumentError("--device-stall-timeout must be >= 0 and at most 24h");
  }
  for (const std::string& d : c.devices) {
    if (d.empty()) return absl::InvalidArgumentError("--devices: empty entry");
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& flag, const std::string& text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t i = 0;
  while (i < s.size() && (absl::ascii_isdigit(s[i]) || s[i] == '.')) ++i;
  double value = 0;
  if (i == 0 || !absl::SimpleAtod(s.substr(0, i), &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", text, ": want bytes, e.g. 8GiB, 512MiB, 4GB, 1048576"));
  }
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(i)));
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"b", 1},
                                                          {"kib", 1024.0},
                                                          {"mib", 1048576.0},
                                                          {"gib", 1073741824.0},
                                                          {"tib", 1099511627776.0},
                                                          {"ki", 1024.0},
                                                          {"mi", 1048576.0},
                                                          {"gi", 1073741824.0},
                                                          {"ti", 1099511627776.0},
                                                          {"kb", 1e3},
                                                          {"mb", 1e6},
                                                          {"gb", 1e9},
                                                          {"tb", 1e12},
                                                          {"k", 1e3},
                                                          {"m", 1e6},
                                                          {"g", 1e9},
                                                          {"t", 1e12}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) {
      const double bytes = value * scale;
      if (bytes > 9.0e18) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag, "=", text, ": too large (at most 8 EiB)"));
      }
      return static_cast<int64_t>(bytes);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", text, ": unknown unit '", unit,
                                                 "' (want B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"));
}

// Parses the byte-size flag `flag` (named `name` in errors) into *out.
static absl::Status ByteSizeFlag(const std::string& name, const absl::Flag<std::string>& flag,
                                 int64_t* out) {
  absl::StatusOr<int64_t> bytes = ParseByteSize(name, absl::GetFlag(flag));
  if (!bytes.ok()) return bytes.status();
  *out = *bytes;
  return absl::OkStatus();
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
  c.max_regions_per_client = absl::GetFlag(FLAGS_max_regions_per_client);
  c.backend = absl::GetFlag(FLAGS_backend);
  c.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  c.tls_key = absl::GetFlag(FLAGS_tls_key);
  c.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  c.tls_require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  c.queue_capacity = absl::GetFlag(FLAGS_queue_capacity);
  c.workers = absl::GetFlag(FLAGS_workers);
  c.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  c.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  if (const std::string spin = absl::GetFlag(FLAGS_worker_spin); spin != "auto") {
    absl::Duration d;
    if (!absl::ParseDuration(spin, &d)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--worker-spin='", spin, "': want auto or a duration (e.g. 500us, 1ms, 0)"));
    }
    c.worker_spin = d;
  }
  c.signal_timeout = absl::GetFlag(FLAGS_signal_timeout);
  c.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (absl::Status s =
          ByteSizeFlag("call-memory-bytes", FLAGS_call_memory_bytes, &c.call_memory_bytes);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          ByteSizeFlag("call-memory-bytes-per-client", FLAGS_call_memory_bytes_per_client,
                       &c.call_memory_bytes_per_client);
      !s.ok()) {
    return s;
  }
  c.ready_file = absl::GetFlag(FLAGS_ready_file);
  c.log_level = absl::GetFlag(FLAGS_log_level);
  if (absl::Status s = ByteSizeFlag("pool-bytes", FLAGS_pool_bytes, &c.pool_bytes); !s.ok()) {
    return s;
  }
  if (absl::Status s = ByteSizeFlag("staging-bytes", FLAGS_staging_bytes, &c.staging_bytes);
      !s.ok()) {
    return s;
  }
  c.graphs = absl::GetFlag(FLAGS_graphs);
  for (absl::string_view d :
       absl::StrSplit(absl::GetFlag(FLAGS_devices), ',', absl::SkipWhitespace())) {
    c.devices.emplace_back(absl::StripAsciiWhitespace(d));
  }
  c.streams_per_device = absl::GetFlag(FLAGS_streams_per_device);
  c.device_stall_timeout = absl::GetFlag(FLAGS_device_stall_timeout);
  if (absl::Status s = CheckConfig(c); !s.ok()) return s;
  return c;
}

}  // namespace attnd::server
