// Shared pieces of attnctl's run and bench commands: connecting (unary or Session, optional
// host region tied to the session's lease) and formatting CallStats and checks as text or JSON.
//   CallSetup s;  ATTND_RETURN_IF_ERROR(s.Connect(options, region_bytes));
//   ATTND_ASSIGN_OR_RETURN(auto r, call->Run(s.caller(options)));
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/attnctl/cases.h"
#include "client/attnctl/commands.h"
#include "client/attnctl/compare.h"
#include "client/host_region.h"
#include "client/session.h"

namespace attnd::attnctl {

// Members are destroyed region -> session -> client, the order the daemon needs.
struct CallSetup {
  std::unique_ptr<client::Client> client;
  std::unique_ptr<client::Session> session;
  std::unique_ptr<client::HostRegion> region;

  // Connects, opens a Session when o.session or o.regions, and with o.regions creates a host
  // region of `region_bytes` tied to the session's lease (so it dies with this process).
  absl::Status Connect(const CtlOptions& o, uint64_t region_bytes);
  Caller caller(const CtlOptions& o) const;
};

std::string StatsJson(const v1::CallStats& s);
// "fast" / "high", or empty for PRECISION_UNSPECIFIED (an op without the option).
std::string PrecisionText(v1::Precision p);
std::string ChecksJson(const std::vector<Check>& checks);
// "81.2 µs", "3.41 ms", "1.20 s".
std::string FormatSeconds(double seconds);
// "0 B", "12.0 KiB", "8.00 MiB".
std::string FormatBytes(double bytes);
// Two lines: the server's figures, and the client's round trip.
std::string StatsText(const v1::CallStats& s, double round_trip_seconds);

}  // namespace attnd::attnctl
