// Listener helpers of the daemon: --listen address parsing, unix socket preparation (stale
// socket removal, mode 0660), TLS / mTLS credentials for TCP listeners.
//   ATTND_ASSIGN_OR_RETURN(ListenAddress a, ParseListenAddress("unix:/tmp/attnd.sock"));
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "server/main/config.h"

namespace attnd::server {

struct ListenAddress {
  std::string address;    // as given to grpc::ServerBuilder::AddListeningPort
  bool is_unix = false;   // unix: (filesystem) socket
  std::string unix_path;  // its path
};

// "unix:/path", "unix:///path", "unix-abstract:name", "host:port", "[v6]:port".
absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& address);

// Removes a stale socket file at `path` (nothing listening there); FAILED_PRECONDITION when a
// live server answers on it or the path is not a socket.
absl::Status PrepareUnixSocket(const std::string& path);

// The address with its port replaced by the bound one ("127.0.0.1:0" -> "127.0.0.1:43123").
std::string WithPort(const std::string& address, int port);

// Credentials for TCP listeners: TLS (and mTLS with --tls-ca) when --tls-cert is given, else
// insecure. INVALID_ARGUMENT when a PEM file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(const DaemonConfig& config);

}  // namespace attnd::server
