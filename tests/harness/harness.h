// The correctness harness: runs every implementation of an op that this build and machine can
// run on the same inputs, outputs poisoned with NaN before each run, and hands each result to a
// check against the fp64 reference. GPU executors plug in here (issue 4): they mirror the params'
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
#include "kernels/common/registry.h"
#include "kernels/common/thread_pool.h"
#include "tests/harness/host_tensor.h"

namespace attnd::testing {

// The thread pool CPU implementations run on in tests (2 threads: the CI machine's cores).
kernels::ThreadPool* TestPool();

// Fresh seed per call (from the test name and a counter), printed on failure via SCOPED_TRACE
// by the caller if it wishes; deterministic for a given test binary run order.
std::mt19937_64 MakeRng();

// Runs each runnable implementation of `impls` on `params`. Before each run every tensor in
// `outputs` is poisoned with NaN. After each successful run `check(impl_name)` is called; a
// failed run is a test failure naming the implementation. Returns the number of runs.
template <class Params>
int RunEachImpl(const std::vector<kernels::Impl<Params>>& impls, const Params& params,
                const std::vector<HostTensor*>& outputs,
                const std::function<void(const std::string& impl)>& check) {
  int runs = 0;
  for (const auto& impl : impls) {
    if (impl.backend != kernels::Backend::kCpu) continue;  // GPU executors: issue 4
    std::string why;
    if (impl.supports && !impl.supports(params, &why)) continue;
    for (HostTensor* out : outputs) PoisonNaN(*out);
    kernels::ExecContext ctx;
    ctx.backend = kernels::Backend::kCpu;
    ctx.pool = TestPool();
    const absl::Status status = impl.run(params, ctx);
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

}  // namespace attnd::testing
