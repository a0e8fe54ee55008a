// attnctl info | health | regions | presets.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/attnctl/commands.h"
#include "client/attnctl/json.h"
#include "client/attnctl/report.h"
#include "client/client.h"
#include "client/error_details.h"

namespace attnd::attnctl {

namespace {

// A CacheLayout value as attnctl prints it: its name without the CACHE_LAYOUT_ prefix, or the
// number when this attnctl does not know it.
std::string LayoutText(int value) {
  if (!v1::CacheLayout_IsValid(value)) return absl::StrCat(value);
  absl::string_view name = v1::CacheLayout_Name(static_cast<v1::CacheLayout>(value));
  absl::ConsumePrefix(&name, "CACHE_LAYOUT_");
  return std::string(name);
}

}  // namespace

int ServiceExit(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument && s.message().find("tls_") == 0
             ? kExitUsage
             : kExitService;
}

int Fail(const CtlOptions& o, const absl::Status& s, int exit_code) {
  // The daemon's google.rpc details, when it sent any (docs/SERVICE.md "Error details").
  const client::ErrorDetails d = client::ErrorDetailsOf(s);
  if (o.json) {
    JsonObject j;
    j.Add("error", std::string(s.message())).Add("code", absl::StatusCodeToString(s.code()));
    if (!d.field_violations.empty()) {
      std::vector<std::string> violations;
      for (const auto& v : d.field_violations) {
        violations.push_back(
            JsonObject().Add("field", v.field).Add("description", v.description).str());
      }
      j.AddRaw("field_violations", absl::StrCat("[", absl::StrJoin(violations, ","), "]"));
    }
    if (!d.resource_name.empty()) {
      j.Add("resource_type", d.resource_type).Add("resource_name", d.resource_name);
    }
    if (d.retry_delay.has_value()) {
      j.Add("retry_delay_seconds", absl::ToDoubleSeconds(*d.retry_delay));
    }
    std::printf("%s\n", j.str().c_str());
  } else {
    std::fprintf(stderr, "attnctl: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
                 std::string(s.message()).c_str());
    for (const auto& v : d.field_violations) {
      std::fprintf(stderr, "attnctl:   field %s\n", v.field.c_str());
    }
    if (!d.resource_name.empty()) {
      std::fprintf(stderr, "attnctl:   resource %s '%s'\n", d.resource_type.c_str(),
                   d.resource_name.c_str());
    }
    if (d.retry_delay.has_value()) {
      std::fprintf(stderr, "attnctl:   retry after %s\n",
                   absl::FormatDuration(*d.retry_delay).c_str());
    }
  }
  return exit_code;
}

int InfoCommand(const CtlOptions& o) {
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(o.connect);
  if (!c.ok()) return Fail(o, c.status(), ServiceExit(c.status()));
  absl::StatusOr<v1::GetInfoResponse> info = (*c)->GetInfo(o.timeout);
  if (!info.ok()) return Fail(o, info.status(), kExitService);
  const v1::Limits& l = info->limits();
  if (o.json) {
    std::vector<std::string> devices, ops;
    for (const v1::DeviceInfo& d : info->devices()) {
      JsonObject j;
      j.Add("name", d.name()).Add("uuid", d.uuid()).Add("memory_bytes", d.memory_bytes());
      j.Add("arch", d.arch()).Add("cores", d.cores()).Add("mps", d.mps());
      devices.push_back(j.str());
    }
    for (const v1::OpInfo& op : info->ops()) {
      std::vector<std::string> impls;
      for (const std::string& i : op.implementations()) impls.push_back(JsonQuote(i));
      JsonObject j;
      j.Add("name", op.name()).Add("rpc", op.rpc()).AddRaw("implementations", JsonArray(impls));
      j.Add("fast_paths", op.fast_paths());
      std::vector<std::string> precisions;
      for (const int pr : op.precisions()) {
        precisions.push_back(JsonQuote(PrecisionText(static_cast<v1::Precision>(pr))));
      }
      j.AddRaw("precisions", JsonArray(precisions));
      std::vector<std::string> layouts;
      for (const v1::CacheLayoutInfo& f : op.cache_layouts()) {
        std::vector<std::string> accepted, inferred;
        for (const int l : f.accepted()) accepted.push_back(JsonQuote(LayoutText(l)));
        for (const int l : f.inferred()) inferred.push_back(JsonQuote(LayoutText(l)));
        JsonObject lj;
        lj.Add("field", f.field()).Add("tensor", f.tensor());
        lj.AddRaw("accepted", JsonArray(accepted)).AddRaw("inferred", JsonArray(inferred));
        layouts.push_back(lj.str());
      }
      j.AddRaw("cache_layouts", JsonArray(layouts));
      ops.push_back(j.str());
    }
    JsonObject limits;
    limits.Add("max_message_bytes", l.max_message_bytes());
    limits.Add("queue_capacity", l.queue_capacity());
    limits.Add("workers", l.workers()).Add("cpu_threads", l.cpu_threads());
    limits.Add("allow_client_shm", l.allow_client_shm()).Add("max_rank", l.max_rank());
    limits.Add("device_handle_bytes", uint64_t{l.device_handle_bytes()});
    limits.Add("worker_spin_ns", l.worker_spin_ns());
    JsonObject j;
    j.Add("target", o.connect.target).Add("version", info->version());
    j.Add("backend", info->backend()).AddRaw("devices", JsonArray(devices));
    j.AddRaw("ops", JsonArray(ops)).AddRaw("limits", limits.str());
    std::printf("%s\n", j.str().c_str());
    return kExitOk;
  }
  std::printf("attnd %s at %s, backend %s\n", info->version().c_str(), o.connect.target.c_str(),
              info->backend().c_str());
  for (const v1::DeviceInfo& d : info->devices()) {
    // "MPS on|off" on CUDA only: the other backends have no MPS (docs/OPERATIONS.md "MPS").
    const bool cuda = info->backend() == "cuda";
    std::printf("device  %s (%s) arch %s, %d cores, %.1f GiB%s\n", d.name().c_str(),
                d.uuid().empty() ? "no uuid" : d.uuid().c_str(), d.arch().c_str(), d.cores(),
                static_cast<double>(d.memory_bytes()) / (1ull << 30),
                !cuda ? "" : (d.mps() ? ", MPS on" : ", MPS off"));
  }
  for (const v1::OpInfo& op : info->ops()) {
    std::vector<std::string> impls(op.implementations().begin(), op.implementations().end());
    std::vector<std::string> precisions;
    for (const int pr : op.precisions()) {
      precisions.push_back(PrecisionText(static_cast<v1::Precision>(pr)));
    }
    std::printf(
        "op      %-22s %-20s impls [%s]  fast paths: %s%s%s\n", op.name().c_str(), op.rpc().c_str(),
        absl::StrJoin(impls, ", ").c_str(), op.fast_paths().c_str(),
        precisions.empty() ? "" : "  precisions: ", absl::StrJoin(precisions, ", ").c_str());
    // One line per cache tensor: its layout field and the named layouts it takes; "*" marks
    // those an unspecified layout is inferred as (docs/CONTRACTS.md "Named layouts").
    for (const v1::CacheLayoutInfo& f : op.cache_layouts()) {
      std::vector<std::string> names;
      for (const int l : f.accepted()) {
        const bool inferred =
            std::find(f.inferred().begin(), f.inferred().end(), l) != f.inferred().end();
        names.push_back(LayoutText(l) + (inferred ? "*" : ""));
      }
      std::printf("        %s layouts (%s): %s  (* inferred when unspecified)\n",
                  f.tensor().c_str(), f.field().c_str(), absl::StrJoin(names, ", ").c_str());
    }
  }
  std::printf(
      "limits  max message %llu B, queue %d, workers %d, cpu threads %d, "
      "client shm %s, max rank %d, worker spin %s\n",
      static_cast<unsigned long long>(l.max_message_bytes()), l.queue_capacity(), l.workers(),
      l.cpu_threads(), l.allow_client_shm() ? "allowed" : "off", l.max_rank(),
      absl::FormatDuration(absl::Nanoseconds(l.worker_spin_ns())).c_str());
  return kExitOk;
}

int HealthCommand(const CtlOptions& o) {
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(o.connect);
  if (!c.ok()) return Fail(o, c.status(), ServiceExit(c.status()));
  absl::StatusOr<client::HealthStatus> h = (*c)->Health(o.health_service, o.timeout);
  if (!h.ok()) return Fail(o, h.status(), kExitService);
  const bool serving = *h == client::HealthStatus::kServing;
  if (o.json) {
    JsonObject j;
    j.Add("target", o.connect.target).Add("service", o.health_service);
    j.Add("status", client::HealthStatusName(*h)).Add("serving", serving);
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("%s\n", client::HealthStatusName(*h));
  }
  return serving ? kExitOk : kExitCheckFailed;
}

int RegionsCommand(const CtlOptions& o) {
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(o.connect);
  if (!c.ok()) return Fail(o, c.status(), ServiceExit(c.status()));
  absl::StatusOr<v1::ListRegionsResponse> r = (*c)->ListRegions(o.timeout);
  if (!r.ok()) return Fail(o, r.status(), kExitService);
  if (o.json) {
    std::vector<std::string> items;
    for (const v1::RegionInfo& ri : r->regions()) {
      JsonObject j;
      j.Add("name", ri.name());
      j.Add("kind", ri.kind() == v1::RegionInfo::KIND_DEVICE ? "device" : "host");
      j.Add("key", ri.key()).Add("device_uuid", ri.device_uuid()).Add("offset", ri.offset());
      j.Add("byte_size", ri.byte_size()).Add("lease_id", ri.lease_id());
      j.Add("in_flight", int64_t{ri.in_flight()});
      items.push_back(j.str());
    }
    JsonObject j;
    j.Add("target", o.connect.target).AddRaw("regions", JsonArray(items));
    std::printf("%s\n", j.str().c_str());
    return kExitOk;
  }
  if (r->regions().empty()) std::printf("no regions\n");
  for (const v1::RegionInfo& ri : r->regions()) {
    std::printf(
        "%-32s %-6s %-40s offset %llu size %llu in-flight %lld%s%s\n", ri.name().c_str(),
        ri.kind() == v1::RegionInfo::KIND_DEVICE ? "device" : "host",
        ri.kind() == v1::RegionInfo::KIND_DEVICE ? ri.device_uuid().c_str() : ri.key().c_str(),
        static_cast<unsigned long long>(ri.offset()),
        static_cast<unsigned long long>(ri.byte_size()), static_cast<long long>(ri.in_flight()),
        ri.lease_id().empty() ? "" : " lease ", ri.lease_id().c_str());
  }
  return kExitOk;
}

int PresetsCommand(const CtlOptions& o, const std::string& op) {
  std::vector<std::string> ops;
  if (op.empty()) {
    ops = OpNames();
  } else {
    const std::string name = CanonicalOpName(op);
    if (name.empty()) {
      return Fail(o, absl::InvalidArgumentError(absl::StrCat("unknown op '", op, "'")), kExitUsage);
    }
    ops.push_back(name);
  }
  std::vector<std::string> items;
  for (const std::string& name : ops) {
    for (const PresetInfo& p : Presets(name)) {
      std::vector<std::string> dims;
      for (const auto& [k, v] : p.dims) dims.push_back(absl::StrCat(k, "=", v));
      if (o.json) {
        JsonObject j;
        j.Add("op", name).Add("preset", p.name).Add("description", p.description);
        j.Add("dims", absl::StrJoin(dims, ","));
        items.push_back(j.str());
      } else {
        std::printf("%-22s %-9s %-60s %s\n", name.c_str(), p.name.c_str(), p.description.c_str(),
                    absl::StrJoin(dims, ",").c_str());
      }
    }
  }
  if (o.json) std::printf("%s\n", JsonArray(items).c_str());
  return kExitOk;
}

}  // namespace attnd::attnctl
