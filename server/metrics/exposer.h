// The /metrics HTTP endpoint (prometheus-cpp's civetweb Exposer) on --metrics-listen.
//   ATTND_ASSIGN_OR_RETURN(auto endpoint, MetricsEndpoint::Start("127.0.0.1:0", registry));
//   endpoint->port();  // the bound port
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace attnd::server::metrics {

class MetricsEndpoint {
 public:
  // Connections served at once, and how long one may take to deliver its request (and each
  // read or write): slow clients cannot block scrapes (docs/SERVICE.md "Trust model").
  static constexpr int kThreads = 32;
  static constexpr int kRequestTimeoutMs = 1000;

  // Serves `registry` at http://<listen>/metrics. `listen` is host:port (port 0 = any free
  // port). UNAVAILABLE when the address cannot be bound. Not thread-safe (call from main).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Registry> registry);

  int port() const { return port_; }
  const std::string& address() const { return address_; }  // host:bound_port

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  int port_ = 0;
  std::string address_;
};

}  // namespace attnd::server::metrics
