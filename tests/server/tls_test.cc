// TLS and mutual TLS on a TCP listener: certificates are made with the openssl CLI at test time
// (Debian's openssl package); a client with the CA connects, one without a client certificate
// is refused when --tls-require-client-cert is set.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "attnd/v1/attention.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/main/daemon.h"

namespace attnd::server {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string("/tmp/attnd-tls-" + std::to_string(getpid()));
    const std::string d = *dir_;
    const std::string script =
        "set -e; mkdir -p " + d + "; cd " + d +
        "; exec >/dev/null 2>&1;"
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
        "  -subj /CN=attnd-test-ca;"
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "
        "/CN=localhost;"
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > san.ext;"
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem "
        "  -days 2 -extfile san.ext;"
        "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=client;"
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem "
        "  -days 2";
    ok_ = std::system(("bash -c \"" + script + "\"").c_str()) == 0;
  }
  static void TearDownTestSuite() {
    std::system(("rm -rf " + *dir_).c_str());
    delete dir_;
  }

  std::unique_ptr<Daemon> StartDaemon(bool require_client_cert) {
    DaemonConfig config;
    config.listen = {"127.0.0.1:0"};
    config.metrics_listen = "";
    config.tls_cert = *dir_ + "/server.pem";
    config.tls_key = *dir_ + "/server.key";
    config.tls_ca = *dir_ + "/ca.pem";
    config.tls_require_client_cert = require_client_cert;
    config.backend = "cpu";
    config.log_level = "error";
    auto daemon = std::make_unique<Daemon>(config);
    const absl::Status s = daemon->Start();
    EXPECT_TRUE(s.ok()) << s;
    return daemon;
  }

  static grpc::Status GetInfo(const std::string& address,
                              std::shared_ptr<grpc::ChannelCredentials> creds) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    auto stub = v1::Attention::NewStub(grpc::CreateCustomChannel(address, creds, args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetInfoResponse info;
    return stub->GetInfo(&ctx, v1::GetInfoRequest(), &info);
  }

  static std::string* dir_;
  static bool ok_;
};

std::string* TlsTest::dir_ = nullptr;
bool TlsTest::ok_ = false;

TEST_F(TlsTest, MutualTlsAcceptsCertifiedClientsOnly) {
  ASSERT_TRUE(ok_) << "openssl could not make the test certificates";
  auto daemon = StartDaemon(/*require_client_cert=*/true);
  ASSERT_EQ(daemon->grpc_addresses().size(), 1u);
  const std::string address = daemon->grpc_addresses()[0];
  grpc::SslCredentialsOptions with_cert;
  with_cert.pem_root_certs = ReadFile(*dir_ + "/ca.pem");
  with_cert.pem_cert_chain = ReadFile(*dir_ + "/client.pem");
  with_cert.pem_private_key = ReadFile(*dir_ + "/client.key");
  const grpc::Status ok = GetInfo(address, grpc::SslCredentials(with_cert));
  EXPECT_TRUE(ok.ok()) << ok.error_message();

  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = with_cert.pem_root_certs;
  EXPECT_FALSE(GetInfo(address, grpc::SslCredentials(no_cert)).ok());
  EXPECT_FALSE(GetInfo(address, grpc::InsecureChannelCredentials()).ok());
  daemon->Shutdown();
}

TEST_F(TlsTest, TlsWithoutClientCertificates) {
  ASSERT_TRUE(ok_) << "openssl could not make the test certificates";
  auto daemon = StartDaemon(/*require_client_cert=*/false);
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = ReadFile(*dir_ + "/ca.pem");
  const grpc::Status s = GetInfo(daemon->grpc_addresses()[0], grpc::SslCredentials(no_cert));
  EXPECT_TRUE(s.ok()) << s.error_message();
  daemon->Shutdown();
}

TEST_F(TlsTest, UnreadableCertificateFailsTheStart) {
  DaemonConfig config;
  config.listen = {"127.0.0.1:0"};
  config.metrics_listen = "";
  config.tls_cert = "/nonexistent/server.pem";
  config.tls_key = "/nonexistent/server.key";
  config.log_level = "error";
  Daemon daemon(config);
  EXPECT_EQ(daemon.Start().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnd::server
