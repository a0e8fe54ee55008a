// GpuImpl (kernels/common/registry.h) in GPU builds: vendor-prefixed names, the backend, and a
// launcher's error code turned into INTERNAL with the vendor's message. Needs no device.
#include <string>

#include "gtest/gtest.h"
#include "kernels/common/gpu/runtime.h"
#include "kernels/common/registry.h"

namespace attnd::kernels {
namespace {

struct FakeParams {
  int error = 0;                 // what the launcher returns
  mutable void* seen = nullptr;  // the stream it was given
};

gpu::Error FakeLaunch(const FakeParams& p, gpu::Stream stream) {
  p.seen = stream;
  return static_cast<gpu::Error>(p.error);
}

bool Always(const FakeParams&, std::string*) { return true; }

TEST(GpuImpl, NamesBackendAndLaunchErrors) {
  const Impl<FakeParams> impl = GpuImpl("fake", Always, FakeLaunch);
  EXPECT_EQ(impl.name, std::string(BackendName(kGpuBackend)) + "_fake");
  EXPECT_EQ(impl.backend, kGpuBackend);
  EXPECT_NE(kGpuBackend, Backend::kCpu);
  EXPECT_FALSE(impl.workspace);

  ExecContext ctx;
  ctx.backend = kGpuBackend;
  int token = 0;
  ctx.stream = &token;
  FakeParams ok;
  EXPECT_TRUE(impl.run(ok, ctx).ok());
  EXPECT_EQ(ok.seen, &token) << "the launcher must get ctx.stream";

  FakeParams bad;
  bad.error = 1;  // cudaErrorInvalidValue / hipErrorInvalidValue
  const absl::Status s = impl.run(bad, ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find(impl.name), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find(gpu::ErrorString(static_cast<gpu::Error>(1))), absl::string_view::npos)
      << s;
}

TEST(GpuImpl, RunFormKeepsItsRunAndWorkspace) {
  const Impl<FakeParams> impl = GpuImpl<FakeParams>(
      "steps", Always,
      [](const FakeParams&, const ExecContext&) { return absl::UnavailableError("x"); },
      [](const FakeParams&) -> int64_t { return 4096; });
  EXPECT_EQ(impl.name, std::string(BackendName(kGpuBackend)) + "_steps");
  EXPECT_EQ(impl.workspace(FakeParams{}), 4096);
  EXPECT_EQ(impl.run(FakeParams{}, ExecContext{}).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace attnd::kernels
