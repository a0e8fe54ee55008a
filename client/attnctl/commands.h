// attnctl's subcommands, each taking the parsed flags and returning the process exit code
// (docs/ATTNCTL.md): 0 ok, 1 check failed (mismatch, NOT_SERVING, copied bytes with regions),
// 2 usage, 3 the daemon refused or could not be reached, 4 local failure.
//   return RunCommand(options, "sparse_mla");
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "client/attnctl/cases.h"
#include "client/channel.h"

namespace attnd::attnctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitService = 3;
inline constexpr int kExitLocal = 4;

struct CtlOptions {
  client::ConnectOptions connect;
  absl::Duration timeout = absl::Seconds(120);  // per call
  bool json = false;
  std::string preset = "tiny";
  Dims set;  // --set overrides of the preset's dims
  // --precision (attention ops' out, the indexer ops' logits); unset: the op's default (FAST for
  // attention, HIGH for indexer_logits and indexer_logits_paged).
  std::optional<kernels::Precision> precision;
  // --index_precision (dsa_attention's indexer step); unset: the op's default (HIGH).
  std::optional<kernels::Precision> index_precision;
  // --batch_invariant (sparse_mla, mla_decode, dsa_attention).
  bool batch_invariant = false;
  bool regions = false;  // tensors in a host region (zero copy) instead of inline
  bool session = false;  // calls on a Session stream instead of unary RPCs
  // --wait_spin: a Session caller polls this long for its reply before it sleeps.
  absl::Duration wait_spin = absl::ZeroDuration();
  // bench: each call stream-ordered (ready word already reached, done words in the region): the
  // caller only enqueues, and the figures are the caller's CPU and wall per enqueue.
  bool stream_ordered = false;
  // bench: the call prepared once (PrepareCall), then run by id (RunPrepared; needs --regions,
  // unary): blocking, or with --stream_ordered enqueued with its signals only.
  bool prepared = false;
  // bench (with stream_ordered and prepared): every measured run submitted through a shared
  // memory submission ring (client/submission_ring.h) instead of a RunPrepared RPC.
  bool ring = false;
  // bench (with ring): each run waits for its done word (a blocking call through the ring); the
  // compute subtracted is the p50 of blocking RunPrepared calls made before.
  bool ring_wait = false;
  int64_t requests = 100;  // bench
  int concurrency = 1;     // bench
  int64_t warmup = 5;      // bench
  bool verify = true;      // bench: check the first reply against the local run
  bool samples = false;    // bench --json: every call's round trip, compute, total
  uint64_t seed = 0;       // 0: a fresh random seed (printed)
  int local_threads = 0;   // 0: every core
  bool progress = true;    // bench: progress line on stderr
  std::string health_service;
  std::string client_name = "attnctl";
};

int InfoCommand(const CtlOptions& o);
int HealthCommand(const CtlOptions& o);
int RegionsCommand(const CtlOptions& o);
int PresetsCommand(const CtlOptions& o, const std::string& op);  // op may be empty: all
int RunCommand(const CtlOptions& o, const std::string& op);
int BenchCommand(const CtlOptions& o, const std::string& op);
// GetInfo round trips (--requests after --warmup): the transport's floor, no operator work.
int PingCommand(const CtlOptions& o);

// Prints an error (text, or {"error":..., "code":...} with --json) and returns `exit_code`.
int Fail(const CtlOptions& o, const absl::Status& s, int exit_code);
// The exit code for a failed status from the daemon or the connection.
int ServiceExit(const absl::Status& s);

}  // namespace attnd::attnctl
