// Uses the installed attnd client library the way an application would: a Client on a lazy
// channel (no daemon needed), a TopK request built from a kernels::topk::Params view, and the
// package version. Prints "attnd <version>: TopK request ..." and exits 0, or says what is wrong.
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "all_client_headers.h"  // generated: every installed client/*.h
#include "attnd/v1/attention.pb.h"
#include "attnd/version.h"
#include "client/client.h"
#include "client/op_codec.h"
#include "kernels/topk/params.h"

namespace {

int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "attnd_consumer: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  if (std::strcmp(attnd::kVersion, ATTND_PACKAGE_VERSION) != 0) {
    std::fprintf(stderr, "attnd_consumer: attnd/version.h says %s, the package %s\n",
                 attnd::kVersion, ATTND_PACKAGE_VERSION);
    return 1;
  }
  attnd::client::ConnectOptions options;
  options.target = "unix:/nonexistent/attnd.sock";
  options.connect_timeout = absl::ZeroDuration();  // lazy: nothing is dialled here
  absl::StatusOr<std::unique_ptr<attnd::client::Client>> client =
      attnd::client::Client::Connect(options);
  if (!client.ok()) return Fail("Connect", client.status());

  constexpr int64_t kRows = 2, kCols = 8;
  std::vector<float> logits(kRows * kCols);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 5);
  attnd::kernels::topk::Params p;
  p.logits = attnd::kernels::MakeTensor(logits.data(), attnd::kernels::DType::kF32, {kRows, kCols});
  p.k = 4;
  attnd::v1::TopKRequest request;
  absl::Status st =
      attnd::client::BuildRequest(p, &(*client)->regions(), /*inline_only=*/false, &request);
  if (!st.ok()) return Fail("BuildRequest", st);
  const size_t want_bytes = logits.size() * sizeof(float);
  if (request.k() != 4 || request.logits().inline_data().size() != want_bytes) {
    std::fprintf(
        stderr, "attnd_consumer: request has k %lld and %zu logits bytes, want 4 and %zu\n",
        static_cast<long long>(request.k()), request.logits().inline_data().size(), want_bytes);
    return 1;
  }
  std::printf("attnd %s: TopK request of %zu bytes (k %lld, logits %lld x %lld inline)\n",
              attnd::kVersion, request.ByteSizeLong(), static_cast<long long>(request.k()),
              static_cast<long long>(request.logits().shape(0)),
              static_cast<long long>(request.logits().shape(1)));
  return 0;
}
