// Who is on the other end of a call, as far as the transport can tell: the daemon's own unix
// socket listener (server/main/listeners.h) records the peer credentials (SO_PEERCRED) of every
// connection it accepts under the descriptor that gRPC names the connection after ("fd:12");
// a TCP connection is known by its verified TLS client certificate, else by its address.
// IdentifyCaller() names the owner every region, lease and session belongs to; ClientKey() is the
// key a call's host memory is budgeted under (docs/SERVICE.md "Trust model").
//   UnixPeers peers;
//   peers.Set(fd, {uid, gid, pid});                      // the listener, at accept
//   Caller caller = IdentifyCaller(&peers, *ctx);          // caller.owner == "uid:1000"
//   std::string client = ClientKey(&peers, ctx->peer());  // "uid:1000"
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/server_context.h"

namespace attnd::server::grpc_front {

class UnixPeers {
 public:
  struct Peer {
    uid_t uid = 0;
    gid_t gid = 0;
    pid_t pid = 0;
  };
  // Records the peer of the connection on descriptor `fd` (replacing what a closed connection
  // left under the same number). Thread-safe.
  void Set(int fd, const Peer& peer) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    peers_[fd] = peer;
  }
  // The peer of the connection gRPC calls `grpc_peer` ("fd:12"), if it came from the listener.
  std::optional<Peer> Find(absl::string_view grpc_peer) const ABSL_LOCKS_EXCLUDED(mu_) {
    int fd;
    if (!absl::ConsumePrefix(&grpc_peer, "fd:") || !absl::SimpleAtoi(grpc_peer, &fd)) {
      return std::nullopt;
    }
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(fd);
    if (it == peers_.end()) return std::nullopt;
    return it->second;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<int, Peer> peers_ ABSL_GUARDED_BY(mu_);
};

// "uid:<uid>" for a connection of the daemon's unix listener (every process of one user is one
// client), else the gRPC peer itself ("ipv4:127.0.0.1:43210": one TCP connection).
inline std::string ClientKey(const UnixPeers* peers, absl::string_view grpc_peer) {
  if (peers != nullptr) {
    if (std::optional<UnixPeers::Peer> p = peers->Find(grpc_peer)) {
      return absl::StrCat("uid:", p->uid);
    }
  }
  return std::string(grpc_peer);
}

// The identity a call acts under (docs/SERVICE.md "Trust model").
struct Caller {
  // The namespace of the caller's regions and leases: "uid:<uid>" for a local (unix) peer, every
  // process of one user being one owner; "x509:<subject>" for a TCP peer with a verified client
  // certificate; "peer:<gRPC peer>" (one connection: "peer:ipv4:127.0.0.1:43210") for an
  // anonymous TCP peer. Never empty.
  std::string owner;
  // A unix peer whose credentials the kernel reported: may register host memory (objects it
  // owns, or any when uid is 0).
  bool local = false;
  uid_t uid = 0;  // valid when local
  // Known by its connection only ("peer:…"): its unleased regions would outlive the only
  // connection that can remove them, so it registers under a Session lease only.
  bool anonymous = false;
};

// The caller of the call whose context is `ctx`. A unix connection that did not come from the
// daemon's listener (no recorded credentials) is neither local nor shares an owner with anyone:
// it is known by its gRPC peer string, like an anonymous TCP connection. Thread-safe.
inline Caller IdentifyCaller(const UnixPeers* peers, const grpc::ServerContextBase& ctx) {
  const std::string grpc_peer = ctx.peer();
  Caller caller;
  if (peers != nullptr) {
    if (std::optional<UnixPeers::Peer> p = peers->Find(grpc_peer)) {
      caller.owner = absl::StrCat("uid:", p->uid);
      caller.local = true;
      caller.uid = p->uid;
      return caller;
    }
  }
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& subject : auth->FindPropertyValues("x509_subject")) {
      caller.owner = absl::StrCat("x509:", absl::string_view(subject.data(), subject.size()));
      return caller;
    }
  }
  caller.owner = absl::StrCat("peer:", grpc_peer);
  caller.anonymous = true;
  return caller;
}

}  // namespace attnd::server::grpc_front
