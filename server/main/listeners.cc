#include "server/main/listeners.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"
#include "server/common/log.h"

namespace attnd::server {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& address) {
  ListenAddress a;
  a.address = address;
  if (absl::StartsWith(address, "unix-abstract:")) return a;
  if (absl::StartsWith(address, "unix:")) {
    a.is_unix = true;
    std::string path = address.substr(5);
    if (absl::StartsWith(path, "//")) path = path.substr(2);
    if (path.empty() || path[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("--listen '", address, "': a unix socket needs an absolute path"));
    }
    if (path.size() >= sizeof(sockaddr_un::sun_path)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--listen '", address, "': socket path too long"));
    }
    a.unix_path = path;
    return a;
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen '", address, "': want unix:/path or host:port"));
  }
  return a;
}

absl::Status PrepareSocketDirectory(const std::string& dir, mode_t mode) {
  const bool created = mkdir(dir.c_str(), mode) == 0;
  if (!created && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the socket directory '", dir, "': ", strerror(errno)));
  }
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket directory '", dir, "' is not a directory (", strerror(errno),
                     "); a symlink is refused: remove it or pass --listen"));
  }
  struct stat st;
  absl::Status status;
  if (fstat(fd, &st) != 0) {
    status = absl::FailedPreconditionError(
        absl::StrCat("cannot stat the socket directory '", dir, "': ", strerror(errno)));
  } else if (st.st_uid != geteuid()) {
    status = absl::FailedPreconditionError(absl::StrCat(
        "socket directory '", dir, "' belongs to uid ", st.st_uid, ", not to attnd's uid ",
        geteuid(), ": another user may have created it first; remove it or pass --listen"));
  } else if ((st.st_mode & S_IWOTH) != 0) {
    status = absl::FailedPreconditionError(
        absl::StrFormat("socket directory '%s' is writable by every user (mode %04o): another "
                        "user could take the socket's name; chmod o-w it or pass --listen",
                        dir, st.st_mode & 07777));
  } else if (created && fchmod(fd, mode) != 0) {
    status = absl::FailedPreconditionError(
        absl::StrCat("cannot chmod the socket directory '", dir, "': ", strerror(errno)));
  }
  close(fd);
  return status;
}

absl::Status PrepareUnixSocket(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();  // nothing there
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' exists and is not a socket"));
  }
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "socket '", path, "' belongs to uid ", st.st_uid, ", not to attnd's uid ", geteuid(),
        ": refusing a socket path another user created (squatted); remove it or choose another "
        "--listen path"));
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const bool live = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  if (live) {
    return absl::FailedPreconditionError(
        absl::StrCat("another server is listening on '", path, "'"));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove stale socket '", path, "': ", strerror(errno)));
  }
  return absl::OkStatus();
}

rlim_t RaiseOpenFileLimit() {
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    struct rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) return raised.rlim_cur;
  }
  return limit.rlim_cur;
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(const std::string& path,
                                                                 grpc_front::UnixPeers* peers) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), std::min(path.size() + 1, sizeof(addr.sun_path)));
  // The socket file is created 0660 (umask), and chmod-ed again in case of a wider umask.
  const mode_t old_umask = umask(0117);
  const int bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  umask(old_umask);
  if (bound != 0 || chmod(path.c_str(), 0660) != 0 || listen(fd, SOMAXCONN) != 0) {
    const int err = bound != 0 ? bind_errno : errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on unix:", path, ": ", strerror(err)));
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("eventfd: ", strerror(err)));
  }
  return std::unique_ptr<UnixListener>(new UnixListener(path, fd, wake, peers));
}

UnixListener::~UnixListener() { Stop(); }

void UnixListener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void UnixListener::Stop() {
  if (!stop_.exchange(true)) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  fd_ = wake_fd_ = -1;
}

void UnixListener::AcceptLoop(grpc::Server* server) {
  int pause_ms = 0;  // > 0: descriptors ran out; wait this long before accepting again
  absl::Time last_warning = absl::InfinitePast();
  while (!stop_.load()) {
    // While paused only Stop() wakes the loop: the pending connection keeps the listening socket
    // readable, and polling it would spin.
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {fd_, POLLIN, 0}};
    const int ready = poll(fds, pause_ms > 0 ? 1 : 2, pause_ms > 0 ? pause_ms : -1);
    if (stop_.load()) break;
    if (ready < 0 && errno != EINTR) {
      pause_ms = 100;
      continue;
    }
    for (;;) {
      const int conn = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (conn >= 0) {
        pause_ms = 0;
        struct ucred cred = {};
        socklen_t len = sizeof(cred);
        if (peers_ != nullptr && getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
          peers_->Set(conn, {cred.uid, cred.gid, cred.pid});
        }
        grpc::AddInsecureChannelFromFd(server, conn);  // gRPC owns the descriptor now
        continue;
      }
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      // EMFILE, ENFILE, ENOBUFS, ENOMEM and anything unexpected: the connection waits in the
      // backlog; try again after a pause (10 ms, doubling up to 1 s), logging at most once a
      // second.
      pause_ms = std::clamp(pause_ms * 2, 10, 1000);
      if (absl::Now() - last_warning > absl::Seconds(1)) {
        last_warning = absl::Now();
        struct rlimit limit = {};
        getrlimit(RLIMIT_NOFILE, &limit);
        Log(LogLevel::kWarning, "cannot accept a connection; retrying",
            {{"socket", path_},
             {"error", strerror(err)},
             {"open_file_limit", static_cast<int64_t>(limit.rlim_cur)},
             {"retry_ms", pause_ms}});
      }
      break;
    }
  }
}

std::string WithPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return address;
  return absl::StrCat(address.substr(0, colon), ":", port);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(
    const DaemonConfig& config) {
  if (config.tls_cert.empty()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert = ReadFile(config.tls_cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile(config.tls_key, "--tls-key");
  if (!key.ok()) return key.status();
  grpc_ssl_client_certificate_request_type request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  std::string ca;
  if (!config.tls_ca.empty()) {
    absl::StatusOr<std::string> ca_pem = ReadFile(config.tls_ca, "--tls-ca");
    if (!ca_pem.ok()) return ca_pem.status();
    ca = *std::move(ca_pem);
    request = config.tls_require_client_cert
                  ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                  : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  grpc::SslServerCredentialsOptions options(request);
  options.pem_root_certs = ca;
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(options);
}

}  // namespace attnd::server
