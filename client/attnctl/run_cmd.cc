// attnctl run <op>: one call with random inputs of a preset, checked against the local CPU run.
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/attnctl/commands.h"
#include "client/attnctl/json.h"
#include "client/attnctl/report.h"

namespace attnd::attnctl {

int RunCommand(const CtlOptions& o, const std::string& op_arg) {
  const std::string op = CanonicalOpName(op_arg);
  if (op.empty()) {
    return Fail(o, absl::InvalidArgumentError(absl::StrCat("unknown op '", op_arg, "'")),
                kExitUsage);
  }
  absl::StatusOr<std::unique_ptr<OpCase>> made = MakeOpCase(op, o.preset, o.set, o.seed);
  if (!made.ok()) return Fail(o, made.status(), kExitUsage);
  OpCase& c = **made;
  if (o.precision.has_value()) {
    if (absl::Status s = c.SetPrecision(*o.precision); !s.ok()) return Fail(o, s, kExitUsage);
  }
  if (o.index_precision.has_value()) {
    if (absl::Status s = c.SetIndexPrecision(*o.index_precision); !s.ok()) {
      return Fail(o, s, kExitUsage);
    }
  }
  if (o.batch_invariant) {
    if (absl::Status s = c.SetBatchInvariant(true); !s.ok()) return Fail(o, s, kExitUsage);
  }

  CallSetup setup;
  if (absl::Status s = setup.Connect(o, c.InputBytes() + c.OutputBytes() + 4096); !s.ok()) {
    return Fail(o, s, ServiceExit(s));
  }
  if (setup.region != nullptr) {
    if (absl::Status s = c.MoveInputsTo(setup.region.get()); !s.ok()) {
      return Fail(o, s, kExitLocal);
    }
  }
  absl::StatusOr<std::unique_ptr<RemoteCall>> call = c.NewRemoteCall(setup.region.get());
  if (!call.ok()) return Fail(o, call.status(), kExitLocal);
  absl::StatusOr<client::CallResult> result = (*call)->Run(setup.caller(o));
  if (!result.ok()) return Fail(o, result.status(), kExitService);

  kernels::ThreadPool pool(o.local_threads);
  if (absl::Status s = c.RunLocal(&pool); !s.ok()) {
    return Fail(o, absl::Status(s.code(), absl::StrCat("local run: ", s.message())), kExitLocal);
  }
  std::vector<Check> checks = c.Compare(**call, *result);
  const v1::CallStats& stats = result->stats;
  const uint64_t copied = stats.copied_bytes_in() + stats.copied_bytes_out();
  if (o.regions) {
    // Zero copy is part of the contract for region tensors (docs/SERVICE.md "GPU backend").
    Check zc;
    zc.name = "copied_bytes";
    zc.kind = "zero_copy";
    zc.elements = 1;
    zc.pass = copied == 0;
    zc.mismatches = zc.pass ? 0 : 1;
    if (!zc.pass) zc.detail = absl::StrCat(copied, " bytes copied with every tensor in a region");
    checks.push_back(zc);
  }
  bool pass = !checks.empty();
  for (const Check& k : checks) pass = pass && k.pass;

  const char* transport = o.regions ? "regions" : "inline";
  if (o.json) {
    JsonObject j;
    j.Add("command", "run").Add("op", op).Add("preset", o.preset).Add("shape", c.shape());
    j.Add("transport", transport).Add("api", o.session ? "session" : "unary");
    j.Add("target", o.connect.target).Add("seed", o.seed).Add("pass", pass);
    j.AddRaw("checks", ChecksJson(checks)).AddRaw("stats", StatsJson(stats));
    j.Add("round_trip_us", result->round_trip_seconds * 1e6);
    j.Add("overhead_us", (result->round_trip_seconds - stats.compute_seconds()) * 1e6);
    j.Add("copied_bytes", copied);
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("%s %s (%s) via %s, %s %s, seed %llu\n", op.c_str(), o.preset.c_str(),
                c.shape().c_str(), o.connect.target.c_str(), transport,
                o.session ? "session" : "unary", static_cast<unsigned long long>(o.seed));
    for (const Check& k : checks) {
      if (k.kind == "float" || k.kind == "float_row_set") {
        std::printf(
            "  %-13s %s  max abs err %.3g, rel L2 err %.3g (tol %.0e), %lld of %lld "
            "out of bounds%s%s\n",
            k.name.c_str(), k.pass ? "PASS" : "FAIL", k.max_abs_err, k.rel_l2_err,
            k.tolerance.rel_l2, static_cast<long long>(k.mismatches),
            static_cast<long long>(k.elements), k.detail.empty() ? "" : ": ", k.detail.c_str());
      } else {
        std::string what = k.kind == "index_set"   ? absl::StrCat(k.mismatches, " rows differ")
                           : k.kind == "zero_copy" ? absl::StrCat(copied, " bytes copied")
                                                   : "";
        if (!k.detail.empty()) absl::StrAppend(&what, what.empty() ? "" : ": ", k.detail);
        std::printf("  %-13s %s  %s\n", k.name.c_str(), k.pass ? "PASS" : "FAIL", what.c_str());
      }
    }
    std::printf("%s", StatsText(stats, result->round_trip_seconds).c_str());
    std::printf("result: %s\n", pass ? "PASS" : "FAIL");
  }
  return pass ? kExitOk : kExitCheckFailed;
}

}  // namespace attnd::attnctl
