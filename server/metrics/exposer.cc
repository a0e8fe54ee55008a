#include "server/metrics/exposer.h"

#include <exception>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace attnd::server::metrics {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry) {
  const size_t colon = listen.rfind(':');
  int port;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen '", listen, "': want host:port"));
  }
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  // prometheus-cpp reports bind failures by throwing; this is the one place attnd catches, at
  // start-up, never on a request path.
  try {
    // civetweb gives each connection a thread until it is done with it. A client that connects
    // and sends nothing (or half a request) holds its thread until request_timeout_ms, which
    // bounds the whole request header (civetweb 1.15 read_message) as well as each read and
    // write; with kThreads threads a scrape waits only when more than kThreads - 1 such clients
    // are connected at once, and then at most about one timeout per kThreads of them. No
    // keep-alive: a scrape is one request per connection, and an idle connection holds nothing.
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", listen, "num_threads", std::to_string(kThreads), "request_timeout_ms",
        std::to_string(kRequestTimeoutMs), "enable_keep_alive", "no", "linger_timeout_ms", "0"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on '", listen, "': ", e.what()));
  }
  endpoint->registry_ = std::move(registry);
  endpoint->exposer_->RegisterCollectable(endpoint->registry_);
  const std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  endpoint->port_ = ports.empty() ? port : ports.front();
  endpoint->address_ = absl::StrCat(listen.substr(0, colon), ":", endpoint->port_);
  return endpoint;
}

}  // namespace attnd::server::metrics
