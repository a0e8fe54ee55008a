#include "client/channel.h"

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "client/error_details.h"
#include "common/grpc_hold.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace attnd::client {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg =
      what.empty() ? s.error_message() : absl::StrCat(what, ": ", s.error_message());
  absl::Status out(static_cast<absl::StatusCode>(s.error_code()), msg);
  // The google.rpc.Status details, for ErrorDetailsOf (error_details.h).
  if (!s.error_details().empty()) {
    out.SetPayload(kStatusDetailsPayload, absl::Cord(s.error_details()));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(const ConnectOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("target is empty");
  HoldGrpcForProcess();  // closing the last channel must not wait on gRPC's own shutdown
  const bool tls = options.tls || !options.tls_ca.empty() || !options.tls_cert.empty() ||
                   !options.tls_key.empty();
  std::shared_ptr<grpc::ChannelCredentials> creds;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  if (tls) {
    if (options.tls_cert.empty() != options.tls_key.empty()) {
      return absl::InvalidArgumentError("tls_cert and tls_key go together");
    }
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca.empty()) {
      absl::StatusOr<std::string> ca = ReadPem(options.tls_ca, "tls_ca");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *std::move(ca);
    }
    if (!options.tls_cert.empty()) {
      absl::StatusOr<std::string> cert = ReadPem(options.tls_cert, "tls_cert");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadPem(options.tls_key, "tls_key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    creds = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(options.target, creds, args);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create a channel to '", options.target, "'"));
  }
  if (options.connect_timeout > absl::ZeroDuration()) {
    const auto deadline =
        std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options.connect_timeout);
    if (!channel->WaitForConnected(deadline)) {
      return absl::UnavailableError(absl::StrCat(
          "cannot connect to '", options.target, "' within ",
          absl::FormatDuration(options.connect_timeout),
          tls ? " (TLS: check the CA, the client certificate and the server name)" : ""));
    }
  }
  return channel;
}

}  // namespace attnd::client
