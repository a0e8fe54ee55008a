// The correctness harness: runs every implementation of an op that this build and machine can
// run on the same inputs, outputs poisoned with NaN before each run, and hands each result to a
// check against the fp64 reference. GPU executors plug in here: they mirror the params'
// tensors to the device through Params::ForEachTensor and copy the outputs back.
//   int runs = RunEachImpl(sparse_mla::Implementations(), p, [&](const std::string& impl) {
//     ExpectClose(out, ref, tol, impl);
//   });
//   EXPECT_GE(runs, 1);
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/precision.h"
#include "kernels/common/registry.h"
#include "kernels/common/thread_pool.h"
#include "tests/harness/host_tensor.h"

namespace attnd::testing {

// The thread pool CPU implementations run on in tests (2 threads: the CI machine's cores).
kernels::ThreadPool* TestPool();

// Fresh seed per call (from the test name and a counter), printed on failure via SCOPED_TRACE
// by the caller if it wishes; deterministic for a given test binary run order.
std::mt19937_64 MakeRng();

// The GPU backend this build has (kCpu when none) and whether a device is present.
kernels::Backend GpuBackend();
bool GpuAvailable();

// Device copies of a call's tensors for GPU implementations: Mirror() allocates each tensor's
// span on the device and copies the host bytes (outputs were poisoned on the host first, so the
// device copy is poisoned too); CopyBack() returns output spans to the host tensors.
class DeviceMirror {
 public:
  DeviceMirror();
  ~DeviceMirror();
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;
  // Replaces t.data with a device copy of its span.
  absl::Status Mirror(kernels::Tensor& t);
  absl::Status CopyBack(const kernels::Tensor& device, const kernels::Tensor& host);
  absl::Status Synchronize();
  // Device scratch of `bytes` (freed with the mirror), filled with 0xff so kernels that rely on
  // zeroed scratch fail visibly.
  absl::Status Allocate(int64_t bytes, void** out);
  void* stream() const { return stream_; }

 private:
  std::vector<void*> allocations_;
  void* stream_ = nullptr;
};

// Runs `impl` on the GPU with device mirrors of `params`; outputs come back to params' host
// tensors.
template <class Params>
absl::Status RunOnGpu(const kernels::Impl<Params>& impl, const Params& params) {
  std::vector<kernels::Tensor> host;
  params.ForEachTensor(
      [&](const char*, const kernels::Tensor& t, kernels::Role) { host.push_back(t); });
  Params device = params;
  DeviceMirror mirror;
  absl::Status status;
  device.ForEachTensor([&](const char*, kernels::Tensor& t, kernels::Role) {
    if (status.ok() && t.present()) status = mirror.Mirror(t);
  });
  if (!status.ok()) return status;
  kernels::ExecContext ctx;
  ctx.backend = GpuBackend();
  ctx.stream = mirror.stream();
  if (impl.workspace) {
    ctx.workspace_bytes = impl.workspace(params);
    status = mirror.Allocate(ctx.workspace_bytes, &ctx.workspace);
    if (!status.ok()) return status;
  }
  status = impl.run(device, ctx);
  if (!status.ok()) return status;
  size_t i = 0;
  device.ForEachTensor([&](const char*, kernels::Tensor& t, kernels::Role role) {
    if (status.ok() && role == kernels::Role::kOutput && t.present()) {
      status = mirror.CopyBack(t, host[i]);
    }
    ++i;
  });
  if (!status.ok()) return status;
  return mirror.Synchronize();
}

// Runs each runnable implementation of `impls` on `params`: CPU ones always, GPU ones when this
// build has a GPU backend and a device is present. Before each run every tensor in `outputs` is
// poisoned with NaN. After each successful run `check(impl_name)` is called; a failed run is a
// test failure naming the implementation. Returns the number of runs.
template <class Params>
int RunEachImpl(const std::vector<kernels::Impl<Params>>& impls, const Params& params,
                const std::vector<HostTensor*>& outputs,
                const std::function<void(const std::string& impl)>& check) {
  int runs = 0;
  for (const auto& impl : impls) {
    const bool on_cpu = impl.backend == kernels::Backend::kCpu;
    if (!on_cpu && (impl.backend != GpuBackend() || !GpuAvailable())) continue;
    std::string why;
    if (impl.supports && !impl.supports(params, &why)) continue;
    for (HostTensor* out : outputs) PoisonNaN(*out);
    absl::Status status;
    if (on_cpu) {
      kernels::ExecContext ctx;
      ctx.backend = kernels::Backend::kCpu;
      ctx.pool = TestPool();
      status = impl.run(params, ctx);
    } else {
      status = RunOnGpu(impl, params);
    }
    EXPECT_TRUE(status.ok()) << impl.name << ": " << status;
    if (!status.ok()) continue;
    SCOPED_TRACE("implementation " + impl.name);
    check(impl.name);
    ++runs;
  }
  return runs;
}

// ‖got − ref‖₂ / ‖ref‖₂ over finite reference values (NaN in `got` counts as failure), plus
// per-element bound |got − ref| ≤ atol + rtol·|ref|. Non-finite reference values must match
// exactly (same infinity; NaN nowhere). Reports the first few mismatches with their flat index.
struct Tolerance {
  double rel_l2;  // bound on the relative L2 error
  double atol;    // per-element absolute part
  double rtol;    // per-element relative part
};
void ExpectClose(const std::vector<double>& got, const std::vector<double>& ref,
                 const Tolerance& tol, const std::string& what);

// The bound on an attention op's `out` (sparse_mla, mla_decode, mla_prefill, dsa) against the
// fp64 reference in either precision (docs/ACCURACY.md):
//   kHigh: `high` (each op's ExpectClose tolerance, within |got − ref| ≤ 4e-3·|ref| + 2e-5);
//   kFast: |got − ref| ≤ 2^-8·|ref| + 2^-8·ref_abs + 1e-5 per element and
//          ‖got − ref‖ / ‖ref‖ ≤ 4e-3 + 2^-8·‖ref_abs‖ / ‖ref‖, where ref_abs = Σ_j p_j·|v_j| / l
//          is the reference's weighted |V|. Rounding each p_j to bf16 (unit roundoff 2^-9) moves
//          Σ_j p_j·v_j by at most 2^-9·Σ_j p_j·|v_j|, the final bf16 rounding of out costs at
//          most 2^-9·|out|, f32 accumulation and exp2 far less; each term is taken at 2^-8, twice
//          its bound. l is summed from the unrounded P in every implementation, so it adds no
//          term.
inline constexpr double kFastOutRel = 1.0 / 256;       // × |ref|
inline constexpr double kFastOutWeighted = 1.0 / 256;  // × ref_abs
inline constexpr double kFastOutAtol = 1e-5;
inline constexpr double kFastOutRelL2 = 4e-3;
void ExpectAttentionOut(const std::vector<double>& got, const std::vector<double>& ref,
                        const std::vector<double>& ref_abs, kernels::Precision precision,
                        const Tolerance& high, const std::string& what);

// Both precisions, for tests that run every case in each: FAST (the default) first.
inline constexpr kernels::Precision kPrecisions[] = {kernels::Precision::kFast,
                                                     kernels::Precision::kHigh};

}  // namespace attnd::testing
