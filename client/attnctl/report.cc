#include "client/attnctl/report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/attnctl/json.h"

namespace attnd::attnctl {

absl::Status CallSetup::Connect(const CtlOptions& o, uint64_t region_bytes) {
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(o.connect);
  if (!c.ok()) return c.status();
  client = *std::move(c);
  // A region is always tied to a Session's lease, even for unary calls: if this process dies
  // (Ctrl-C, a kill), the stream breaks and the daemon drops the region with the lease.
  if (o.session || o.regions) {
    client::SessionOptions so;
    so.client_name = o.client_name;
    so.wait_spin = o.wait_spin;
    absl::StatusOr<std::unique_ptr<client::Session>> s = client::Session::Open(client.get(), so);
    if (!s.ok()) return s.status();
    session = *std::move(s);
  }
  if (o.regions) {
    client::HostRegionOptions ro;
    ro.bytes = region_bytes;
    ro.key_prefix = "/attnctl";
    if (session != nullptr) ro.lease_id = session->lease_id();
    absl::StatusOr<std::unique_ptr<client::HostRegion>> r =
        client::HostRegion::Create(client.get(), ro);
    if (!r.ok()) return r.status();
    region = *std::move(r);
  }
  return absl::OkStatus();
}

Caller CallSetup::caller(const CtlOptions& o) const {
  Caller c;
  c.client = client.get();
  c.session = o.session ? session.get() : nullptr;
  c.options.timeout = o.timeout;
  return c;
}

std::string StatsJson(const v1::CallStats& s) {
  JsonObject j;
  j.Add("request_id", s.request_id()).Add("impl", s.impl());
  if (s.precision() != v1::PRECISION_UNSPECIFIED) j.Add("precision", PrecisionText(s.precision()));
  if (s.index_precision() != v1::PRECISION_UNSPECIFIED) {
    j.Add("index_precision", PrecisionText(s.index_precision()));
  }
  if (s.batch_invariant()) j.AddRaw("batch_invariant", "true");
  j.Add("queue_us", s.queue_seconds() * 1e6).Add("compute_us", s.compute_seconds() * 1e6);
  j.Add("total_us", s.total_seconds() * 1e6).Add("flops", s.flops());
  j.Add("logical_bytes", s.logical_bytes());
  j.Add("gflops_per_second", s.achieved_flops_per_second() / 1e9);
  j.Add("gbytes_per_second", s.achieved_bytes_per_second() / 1e9);
  j.Add("copied_bytes_in", s.copied_bytes_in()).Add("copied_bytes_out", s.copied_bytes_out());
  return j.str();
}

std::string ChecksJson(const std::vector<Check>& checks) {
  std::vector<std::string> items;
  for (const Check& c : checks) {
    JsonObject j;
    j.Add("name", c.name).Add("kind", c.kind).Add("pass", c.pass);
    j.Add("elements", c.elements).Add("mismatches", c.mismatches);
    if (c.kind == "float" || c.kind == "float_row_set") {
      j.Add("max_abs_err", c.max_abs_err).Add("rel_l2_err", c.rel_l2_err);
      JsonObject t;
      t.Add("rel_l2", c.tolerance.rel_l2).Add("atol", c.tolerance.atol);
      t.Add("rtol", c.tolerance.rtol);
      j.AddRaw("tolerance", t.str());
    }
    j.Add("detail", c.detail);
    items.push_back(j.str());
  }
  return JsonArray(items);
}

std::string FormatSeconds(double seconds) {
  if (seconds < 1e-3) return absl::StrFormat("%.1f µs", seconds * 1e6);
  if (seconds < 1.0) return absl::StrFormat("%.2f ms", seconds * 1e3);
  return absl::StrFormat("%.2f s", seconds);
}

std::string FormatBytes(double bytes) {
  if (bytes < 1024) return absl::StrFormat("%.0f B", bytes);
  if (bytes < 1024.0 * 1024) return absl::StrFormat("%.1f KiB", bytes / 1024);
  if (bytes < 1024.0 * 1024 * 1024) return absl::StrFormat("%.2f MiB", bytes / (1024.0 * 1024));
  return absl::StrFormat("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
}

std::string PrecisionText(v1::Precision p) {
  switch (p) {
    case v1::PRECISION_FAST: return "fast";
    case v1::PRECISION_HIGH: return "high";
    default: return "";
  }
}

std::string StatsText(const v1::CallStats& s, double round_trip_seconds) {
  std::string precision = PrecisionText(s.precision());
  if (s.index_precision() != v1::PRECISION_UNSPECIFIED) {
    absl::StrAppend(&precision, precision.empty() ? "" : ", ", "indexer ",
                    PrecisionText(s.index_precision()));
  }
  if (s.batch_invariant()) precision += precision.empty() ? "batch-invariant" : ", batch-invariant";
  return absl::StrFormat(
      "server: impl %s%s, queue %s, compute %s, total %s; %.2f GFLOP/s, %.2f GB/s; "
      "copied in %s, out %s (request %d)\n"
      "client: round trip %s; service overhead (round trip - compute) %s\n",
      s.impl(), precision.empty() ? "" : " (" + precision + ")", FormatSeconds(s.queue_seconds()),
      FormatSeconds(s.compute_seconds()), FormatSeconds(s.total_seconds()),
      s.achieved_flops_per_second() / 1e9, s.achieved_bytes_per_second() / 1e9,
      FormatBytes(s.copied_bytes_in()), FormatBytes(s.copied_bytes_out()), s.request_id(),
      FormatSeconds(round_trip_seconds), FormatSeconds(round_trip_seconds - s.compute_seconds()));
}

}  // namespace attnd::attnctl
