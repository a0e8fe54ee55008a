#include "server/engine/cpu_backend.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

#ifndef ATTND_CPU_ARCH_NAME
#define ATTND_CPU_ARCH_NAME "x86-64"
#endif

namespace attnd::server::engine {
namespace {

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "model name")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "cpu";
}

}  // namespace

CpuBackend::CpuBackend(kernels::ThreadPool* pool) : pool_(pool) {}

absl::Status CpuBackend::Run(absl::string_view /*op*/, const StepFn& step, StepResult* result,
                             const StopToken* stop) {
  kernels::ExecContext ctx;
  ctx.backend = kernels::Backend::kCpu;
  ctx.pool = pool_;
  if (stop != nullptr) ctx.stop = stop->flag();
  const absl::Time start = absl::Now();
  absl::Status status = step(ctx, &result->impl);
  result->compute += absl::Now() - start;
  if (stop != nullptr && stop->stopped()) return stop->status("while running");
  return status;
}

absl::Status CpuBackend::RunCall(OpCall& call, StepResult* result, const StopToken* stop) {
  if (absl::Status s = CheckHostOnlyCall(call, kUuid); !s.ok()) return s;
  result->device = kUuid;
  const std::vector<void*> data = call.HostData();
  return Run(
      call.op(),
      [&call, &data](const kernels::ExecContext& ctx, std::string* impl) {
        return call.Run(ctx, data, impl);
      },
      result, stop);
}

std::vector<DeviceDescription> CpuBackend::Devices() const {
  DeviceDescription d;
  d.name = CpuModelName();
  d.uuid = kUuid;
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) {
    d.memory_bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
  }
  d.arch = ATTND_CPU_ARCH_NAME;
  d.cores = pool_ != nullptr ? pool_->num_threads() : 1;
  return {d};
}

}  // namespace attnd::server::engine
