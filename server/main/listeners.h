// Listener helpers of the daemon: --listen address parsing, the default socket and its directory,
// unix socket preparation (stale socket removal, squatted paths refused), the daemon's own unix
// socket listener, the open-file limit, TLS / mTLS credentials for TCP listeners.
//   ATTND_ASSIGN_OR_RETURN(ListenAddress a, ParseListenAddress("unix:/run/attnd/attnd.sock"));
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "server/grpc/peers.h"
#include "server/main/config.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace attnd::server {

struct ListenAddress {
  std::string address;    // as given to grpc::ServerBuilder::AddListeningPort
  bool is_unix = false;   // unix: (filesystem) socket
  std::string unix_path;  // its path
};

// "unix:/path", "unix:///path", "unix-abstract:name", "host:port", "[v6]:port".
absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& address);

// Creates the directory `dir` of the default socket (common/default_socket.h; its parent must
// exist) with `mode`, or checks the one that exists: a real directory (not a symlink), owned by
// this process's effective uid and not writable by others. FAILED_PRECONDITION naming the path,
// its owner or mode otherwise.
absl::Status PrepareSocketDirectory(const std::string& dir, mode_t mode);

// Removes a stale socket file at `path` (nothing listening there, owned by this process's
// effective uid); FAILED_PRECONDITION when a live server answers on it, the path is not a socket,
// or it belongs to another user (a squatted path is refused, never taken over).
absl::Status PrepareUnixSocket(const std::string& path);

// Raises the soft limit of open files to the hard limit (each connection holds a descriptor).
// Returns the limit now in force.
rlim_t RaiseOpenFileLimit();

// A unix socket listener of the daemon's own. gRPC 1.51's listener stops accepting for good after
// accept4 fails once with EMFILE (a client holding ~1,000 idle connections at a 1,024-descriptor
// limit locked everyone out), so attnd accepts on its unix sockets itself: a thread accepts each
// connection, records its peer credentials (SO_PEERCRED) in `peers` and hands it to the gRPC
// server (grpc::AddInsecureChannelFromFd). When descriptors run out (EMFILE, ENFILE, ENOBUFS,
// ENOMEM) it logs and tries again after a pause, so it accepts again as soon as connections close.
//   ATTND_ASSIGN_OR_RETURN(auto listener, UnixListener::Bind("/run/attnd/attnd.sock", &peers));
//   listener->Start(server);  // after BuildAndStart
//   listener->Stop();         // stops accepting (the socket file stays until unlinked)
class UnixListener {
 public:
  // Creates the socket at `path` (prepared with PrepareUnixSocket), file mode 0660, listening.
  // UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(const std::string& path,
                                                            grpc_front::UnixPeers* peers);
  ~UnixListener();  // Stop()
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Starts accepting into `server` (started, outliving the listener's Stop). Call once.
  void Start(grpc::Server* server);
  // Stops accepting and closes the listening socket; idempotent. Connections already handed to
  // gRPC are gRPC's.
  void Stop();
  const std::string& path() const { return path_; }

 private:
  UnixListener(std::string path, int fd, int wake_fd, grpc_front::UnixPeers* peers)
      : path_(std::move(path)), fd_(fd), wake_fd_(wake_fd), peers_(peers) {}
  void AcceptLoop(grpc::Server* server);

  const std::string path_;
  int fd_ = -1;       // the listening socket
  int wake_fd_ = -1;  // an eventfd that Stop() signals
  grpc_front::UnixPeers* const peers_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The address with its port replaced by the bound one ("127.0.0.1:0" -> "127.0.0.1:43123").
std::string WithPort(const std::string& address, int port);

// Credentials for TCP listeners: TLS (and mTLS with --tls-ca) when --tls-cert is given, else
// insecure. INVALID_ARGUMENT when a PEM file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(const DaemonConfig& config);

}  // namespace attnd::server
