// attnctl: the command-line client of attnd. Subcommands info, health, regions, presets,
// run <op> and bench <op>; every flag is documented in --help and docs/ATTNCTL.md.
//   attnctl --target=unix:/run/attnd/attnd.sock run dsa_attention --preset=decode --regions
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/attnctl/commands.h"
#include "common/default_socket.h"
#include "common/flag_args.h"

ABSL_FLAG(std::string, target, attnd::DefaultClientTarget(),
          "The daemon: unix:/path (a unix socket) or host:port (TCP). Default: "
          "unix:/run/attnd/attnd.sock when that socket exists, else the socket an attnd of this "
          "user listens on by default.");
ABSL_FLAG(bool, tls, false,
          "Use TLS on TCP (implied by --tls-ca, --tls-cert, --tls-key); without --tls-ca the "
          "server is verified against the system roots.");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle that verifies the server's certificate.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate chain, for mutual TLS (with --tls-key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert.");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name expected in the server certificate instead of the target's host (e.g. when "
          "connecting to an IP address).");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(10),
          "How long to wait for the connection before failing (exit code 3).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(120),
          "Deadline of each call (RPC or Session call); 'inf' for none.");
ABSL_FLAG(bool, json, false,
          "Print one JSON document on stdout instead of text (errors too: "
          "{\"error\":...,\"code\":...}).");
ABSL_FLAG(std::string, preset, "tiny",
          "Shape preset of run/bench (attnctl presets lists them per op): tiny, decode, "
          "prefill, deepseek, glm, ... ");
ABSL_FLAG(std::string, set, "",
          "Override preset dims, comma-separated NAME=VALUE (e.g. T=32,K=1024; attnctl presets "
          "shows each op's dims).");
ABSL_FLAG(std::string, precision, "",
          "run/bench of sparse_mla, mla_decode, mla_prefill, dsa_attention: the precision of out, "
          "fast (P rounded to bf16 before P·V, the default) or high (P as bf16 hi + lo); of "
          "indexer_logits, indexer_logits_paged: high (exact fp8 products summed in f32, the "
          "default) or fast (FP8 tensor-core accumulation, the fp8 wgmma kernel on Hopper); "
          "docs/ACCURACY.md.");
ABSL_FLAG(std::string, index_precision, "",
          "run/bench of dsa_attention: the precision of its indexer step, high (exact fp8 "
          "products summed in f32, the default) or fast (FP8 tensor-core accumulation); "
          "--precision stays the attention output's; docs/ACCURACY.md.");
ABSL_FLAG(bool, batch_invariant, false,
          "run/bench of sparse_mla, mla_decode, dsa_attention: each token's (mla_decode: each "
          "request's) out and lse bitwise the same whatever else is in the batch (a split plan "
          "from its own length; slower); docs/KERNELS.md \"Batch invariance\".");
ABSL_FLAG(bool, regions, false,
          "run/bench: place inputs and outputs in a POSIX shared-memory host region registered "
          "with the daemon (zero copy; needs attnd --allow-client-shm) instead of inline bytes. "
          "The region is tied to the lease of a Session held open while attnctl runs.");
ABSL_FLAG(bool, session, false,
          "run/bench: send calls on one Session stream (lease + pipelining) instead of unary "
          "RPCs.");
ABSL_FLAG(absl::Duration, wait_spin, absl::ZeroDuration(),
          "run/bench/ping: how long a waiting caller polls for its reply before it sleeps "
          "(client::ConnectOptions::wait_spin for unary calls, SessionOptions::wait_spin on a "
          "Session; 0..10ms; keeps a core busy meanwhile).");
ABSL_FLAG(bool, stream_ordered, false,
          "bench: stream-ordered calls (needs --regions, --concurrency=1): the caller only "
          "enqueues; reports its CPU and wall per call, then waits for the last done word.");
ABSL_FLAG(bool, prepared, false,
          "bench: prepare the call once and run it by id (needs --regions, unary); with "
          "--stream_ordered the run carries only its signals.");
ABSL_FLAG(bool, ring, false,
          "bench (with --stream_ordered --prepared): submit every run through a shared-memory "
          "submission ring (OpenRing once) instead of a RunPrepared RPC.");
ABSL_FLAG(bool, ring_wait, false,
          "bench (with --ring): wait for each call's done word before the next (polling it for "
          "--wait_spin first): a blocking call through the ring, no RPC per call. Its compute "
          "is the p50 of blocking RunPrepared calls made first (at least 20).");
ABSL_FLAG(int64_t, requests, 100, "bench, ping: measured requests (after the warm-up).");
ABSL_FLAG(int, concurrency, 1, "bench: calls in flight at once (one thread each).");
ABSL_FLAG(int64_t, warmup, 5, "bench, ping: unmeasured calls first.");
ABSL_FLAG(bool, verify, true,
          "bench: check the first warm-up reply against the local CPU run (exit 1 on mismatch).");
ABSL_FLAG(bool, samples, false,
          "bench/ping with --json: add every call's round trip (and for bench the server's "
          "compute and total) as arrays: round_trip_us_samples, compute_us_samples, "
          "total_us_samples; for merging runs.");
ABSL_FLAG(uint64_t, seed, 0, "Random seed of the inputs; 0 picks one (printed).");
ABSL_FLAG(int, local_threads, 0, "Threads of the local CPU reference run; 0 = every core.");
ABSL_FLAG(bool, progress, true, "bench: progress line on stderr.");
ABSL_FLAG(std::string, health_service, "",
          "health: the grpc.health.v1 service name to check (empty: the whole server).");
ABSL_FLAG(std::string, client_name, "attnctl", "Session client name (the daemon logs it).");

namespace attnd::attnctl {
namespace {

constexpr const char* kUsage =
    "the command-line client of attnd (attnd.v1.Attention over gRPC).\n"
    "usage: attnctl [flags] <command> [op]\n"
    "  info                 version, backend, devices, ops and limits of the daemon\n"
    "  health               grpc.health.v1 status (exit 0 SERVING, 1 otherwise)\n"
    "  regions              the registered regions\n"
    "  presets [op]         the shape presets of each op and their dims\n"
    "  run <op>             one call with random inputs of --preset, checked against the local\n"
    "                       CPU implementation (exit 1 on mismatch)\n"
    "  bench <op>           latency percentiles, throughput and service overhead\n"
    "  ping                 GetInfo round-trip percentiles (the transport's floor)\n"
    "ops: indexer_logits, indexer_logits_paged, topk, sparse_mla, mla_decode, mla_prefill,\n"
    "     dsa_attention (RPC names such as SparseMla are accepted too)\n"
    "exit codes: 0 ok, 1 check failed, 2 usage, 3 daemon error or unreachable, 4 local error.\n"
    "Flags may be written with '-' or '_' (--tls-ca = --tls_ca); docs/ATTNCTL.md has them all.";

absl::Status ParseSet(const std::string& text, Dims* dims) {
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    int64_t v = 0;
    if (kv.first.empty() || !absl::SimpleAtoi(kv.second, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--set: '", item, "' is not NAME=INTEGER"));
    }
    (*dims)[kv.first] = v;
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const std::vector<std::string> positional =
      ParseFlags(argc, argv, {kUsage, "attnctl (attnd.v1)\n", "client/attnctl/"});

  CtlOptions o;
  o.connect.target = absl::GetFlag(FLAGS_target);
  o.connect.tls = absl::GetFlag(FLAGS_tls);
  o.connect.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  o.connect.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.connect.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.connect.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.connect.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  o.timeout = absl::GetFlag(FLAGS_timeout);
  o.json = absl::GetFlag(FLAGS_json);
  o.preset = absl::GetFlag(FLAGS_preset);
  o.regions = absl::GetFlag(FLAGS_regions);
  o.stream_ordered = absl::GetFlag(FLAGS_stream_ordered);
  o.prepared = absl::GetFlag(FLAGS_prepared);
  o.ring = absl::GetFlag(FLAGS_ring);
  o.ring_wait = absl::GetFlag(FLAGS_ring_wait);
  o.session = absl::GetFlag(FLAGS_session);
  o.wait_spin = absl::GetFlag(FLAGS_wait_spin);
  o.connect.wait_spin = o.wait_spin;
  if (o.wait_spin < absl::ZeroDuration() || o.wait_spin > absl::Milliseconds(10)) {
    return Fail(o, absl::InvalidArgumentError("--wait_spin must be in 0..10ms"), kExitUsage);
  }
  o.requests = absl::GetFlag(FLAGS_requests);
  o.concurrency = absl::GetFlag(FLAGS_concurrency);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.verify = absl::GetFlag(FLAGS_verify);
  o.samples = absl::GetFlag(FLAGS_samples);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.local_threads = absl::GetFlag(FLAGS_local_threads);
  o.progress = absl::GetFlag(FLAGS_progress);
  o.health_service = absl::GetFlag(FLAGS_health_service);
  o.client_name = absl::GetFlag(FLAGS_client_name);
  if (absl::Status s = ParseSet(absl::GetFlag(FLAGS_set), &o.set); !s.ok()) {
    return Fail(o, s, kExitUsage);
  }
  if (const std::string precision = absl::GetFlag(FLAGS_precision); precision == "fast") {
    o.precision = kernels::Precision::kFast;
  } else if (precision == "high") {
    o.precision = kernels::Precision::kHigh;
  } else if (!precision.empty()) {
    return Fail(o,
                absl::InvalidArgumentError(
                    absl::StrCat("--precision: '", precision, "', want fast or high")),
                kExitUsage);
  }
  if (const std::string precision = absl::GetFlag(FLAGS_index_precision); precision == "fast") {
    o.index_precision = kernels::Precision::kFast;
  } else if (precision == "high") {
    o.index_precision = kernels::Precision::kHigh;
  } else if (!precision.empty()) {
    return Fail(o,
                absl::InvalidArgumentError(
                    absl::StrCat("--index_precision: '", precision, "', want fast or high")),
                kExitUsage);
  }
  o.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
  if (o.seed == 0) {
    std::random_device rd;
    o.seed = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;
  }

  const std::vector<std::string> words(positional.begin() + 1, positional.end());
  const std::string command = words.empty() ? "" : words[0];
  const std::string op = words.size() > 1 ? words[1] : "";
  const size_t want = (command == "run" || command == "bench") ? 2
                      : command == "presets"                   ? (words.size() > 1 ? 2 : 1)
                                                               : 1;
  if (command.empty() || words.size() != want) {
    std::fprintf(stderr, "attnctl: %s\n", kUsage);
    return kExitUsage;
  }
  if (command == "info") return InfoCommand(o);
  if (command == "health") return HealthCommand(o);
  if (command == "regions") return RegionsCommand(o);
  if (command == "presets") return PresetsCommand(o, op);
  if (command == "run") return RunCommand(o, op);
  if (command == "bench") return BenchCommand(o, op);
  if (command == "ping") return PingCommand(o);
  return Fail(o, absl::InvalidArgumentError(absl::StrCat("unknown command '", command, "'")),
              kExitUsage);
}

}  // namespace
}  // namespace attnd::attnctl

int main(int argc, char** argv) { return attnd::attnctl::Main(argc, argv); }
