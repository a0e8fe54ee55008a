// The GPU kernel benchmark framework (attn_gpu_bench): each operator registers cases (op, preset,
// implementation, FLOP/byte counts, a capture-safe launch); the runner captures 10 launches in a
// graph, warms up, times >= 50 replays with events (median per launch), warm and cold (a 512 MiB
// write between replays, outside the timing), and prints one JSON line per measurement (with the
// precision that ran, for the ops that have the option).
//   ATTND_REGISTER_GPU_BENCH(sparse_mla, MakeSparseMlaCases);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/common/dtype.h"
#include "kernels/common/gpu/runtime.h"
#include "kernels/common/precision.h"
#include "kernels/common/registry.h"

namespace attnd::bench {

// Device buffers owned by one benchmark case; freed when the case is done.
class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  // Uninitialised device memory (256-B aligned).
  absl::StatusOr<void*> Alloc(int64_t bytes);
  // Device memory filled with random values of `dtype`: N(0, scale)-like floats (bf16, f32,
  // fp8) or uniform integers in [lo, hi] (i32). Never zeros (they run faster on this card).
  absl::StatusOr<void*> Random(kernels::DType dtype, int64_t elements, float scale, uint64_t seed);
  absl::StatusOr<void*> RandomInt(int64_t elements, int32_t lo, int32_t hi, uint64_t seed);
  // Copies host bytes to new device memory.
  absl::StatusOr<void*> Upload(const void* host, int64_t bytes);
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<void*> buffers_;
  int64_t bytes_ = 0;
};

enum class PeakKind { kBf16, kFp8, kMemory };

struct GpuBenchCase {
  std::string op;      // e.g. "sparse_mla"
  std::string preset;  // e.g. "deepseek_prefill_t4096_h128_d576_k2048"
  std::string impl;    // implementation name
  // Params::precision of the attention ops and indexer_logits ("fast" / "high",
  // kernels/common/precision.h); empty for the other ops. Part of the case's name:
  // "op/preset/impl/precision".
  std::string precision;
  kernels::WorkCount work;
  PeakKind peak = PeakKind::kBf16;  // which compute ceiling pct_peak_flops refers to
  // One launch of the op on `stream`: capture-safe (no allocation, no synchronisation).
  std::function<absl::Status(gpu::Stream stream)> launch;
  std::shared_ptr<DeviceArena> arena;  // keeps the buffers alive
};

// Builds the cases of one operator (buffers allocated and filled); `filter` is the substring
// the user asked for, so factories may skip building presets that will not run.
using GpuBenchFactory =
    std::function<absl::StatusOr<std::vector<GpuBenchCase>>(const std::string& filter)>;

bool RegisterGpuBench(const std::string& op, GpuBenchFactory factory);

// Whether a case "op/preset/impl" may be wanted by --filter (a substring of the full name): the
// filter is empty or found in the name or in the name with a precision suffix ("/fast", "/high").
inline bool MayMatch(const std::string& name, const std::string& filter) {
  if (filter.empty() || name.find(filter) != std::string::npos) return true;
  for (const char* suffix : {"/fast", "/high"}) {
    if ((name + suffix).find(filter) != std::string::npos) return true;
  }
  return false;
}

// Both precisions of the ops that have the option, FAST first.
inline constexpr kernels::Precision kBenchPrecisions[] = {kernels::Precision::kFast,
                                                          kernels::Precision::kHigh};
const std::vector<std::pair<std::string, GpuBenchFactory>>& GpuBenches();

// Runs `kernel_impl` of an op's implementation list by name with the device stream as context
// (a helper for factories): finds impl `name` for the CUDA/HIP backend.
template <class Params>
const kernels::Impl<Params>* FindImpl(const std::vector<kernels::Impl<Params>>& impls,
                                      const std::string& name) {
  for (const auto& impl : impls) {
    if (impl.name == name) return &impl;
  }
  return nullptr;
}

// A case's workspace: what the implementation asks for on its Params, from the case's arena
// (none when it asks for none).
struct Workspace {
  void* ptr = nullptr;
  int64_t bytes = 0;
};

template <class Params>
absl::StatusOr<Workspace> WorkspaceFor(const kernels::Impl<Params>& impl, const Params& p,
                                       DeviceArena& arena) {
  Workspace w;
  w.bytes = impl.workspace ? impl.workspace(p) : 0;
  if (w.bytes > 0) {
    absl::StatusOr<void*> ptr = arena.Alloc(w.bytes);
    if (!ptr.ok()) return ptr.status();
    w.ptr = *ptr;
  }
  return w;
}

// One run of `impl` on p on the bench's stream with workspace w: the body of a case's launch.
template <class Params>
absl::Status RunImpl(const kernels::Impl<Params>& impl, const Params& p, const Workspace& w,
                     gpu::Stream stream) {
  kernels::ExecContext ctx;
  ctx.backend = impl.backend;
  ctx.stream = stream;
  ctx.workspace = w.ptr;
  ctx.workspace_bytes = w.bytes;
  return impl.run(p, ctx);
}

}  // namespace attnd::bench

#define ATTND_REGISTER_GPU_BENCH(op, factory) \
  static const bool attnd_gpu_bench_##op = ::attnd::bench::RegisterGpuBench(#op, factory)
