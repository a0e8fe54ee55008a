// Connecting to attnd: a target ("unix:/path" or "host:port"), optional TLS or mutual TLS from
// PEM files, and the channel settings every attnd call needs (no message size caps: inline
// tensors can be large; the server enforces its own --max-message-bytes).
//   ConnectOptions o;  o.target = "unix:/run/attnd/attnd.sock";
//   ATTND_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> ch, CreateChannel(o));
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/default_socket.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/status.h"

namespace attnd::client {

struct ConnectOptions {
  // "unix:/path" (also unix:///path) or "host:port" (TCP); by default the system daemon's socket
  // when there is one, else this user's (common/default_socket.h).
  std::string target = DefaultClientTarget();
  // TLS (TCP only): on when `tls` or any of the files below is given. tls_ca verifies the
  // server (empty: the system roots); tls_cert + tls_key are this client's certificate (mTLS).
  bool tls = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // Name to expect in the server certificate instead of the target's host (tests, IPs).
  std::string tls_server_name;
  // Connect eagerly and fail with UNAVAILABLE when not connected within this; zero: lazily.
  absl::Duration connect_timeout = absl::Seconds(10);
  // How long a blocking call (the operators' unary RPCs, GetInfo, RunPrepared) polls for its
  // reply on the calling thread before it sleeps (client/polled_unary.h). Polling saves the
  // wake-up of a sleeping caller, at the cost of a busy core while it waits; zero (the
  // default) never polls. Session calls have their own (SessionOptions::wait_spin).
  absl::Duration wait_spin = absl::ZeroDuration();
};

// Builds the channel and, with a connect_timeout, waits until it is connected. INVALID_ARGUMENT
// for an unreadable PEM file or an incomplete cert/key pair, UNAVAILABLE when not connected in
// time (the message names the target).
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(const ConnectOptions& options);

// grpc::Status -> absl::Status with the same code and message ("<what>: <message>"), and the
// google.rpc.Status details trailer as a payload (ErrorDetailsOf in error_details.h reads it).
absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& what = "");

}  // namespace attnd::client
