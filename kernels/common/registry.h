// Implementations of an operator and the dispatch over them. Each op keeps an ordered list of
// Impl<Params> (fastest first); dispatch runs the first whose backend matches the context and
// whose Supports() accepts the call, else answers UNIMPLEMENTED naming every refusal.
//   const auto& impls = sparse_mla::Implementations();
//   ATTND_RETURN_IF_ERROR(Dispatch(impls, params, ctx));
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/common/thread_pool.h"

namespace attnd::kernels {

enum class Backend { kCpu, kCuda, kHip };

inline const char* BackendName(Backend b) {
  switch (b) {
    case Backend::kCpu: return "cpu";
    case Backend::kCuda: return "cuda";
    case Backend::kHip: return "hip";
  }
  return "unknown";
}

// Where and how an implementation runs. The caller owns everything it points to.
struct ExecContext {
  Backend backend = Backend::kCpu;
  ThreadPool* pool = nullptr;  // CPU: worker threads (null = run on the calling thread)
  void* stream = nullptr;      // GPU: cudaStream_t / hipStream_t
  int device = 0;              // GPU: device ordinal in this process
  // GPU: caller-owned scratch of at least Impl::workspace(p) bytes (from the device pool), so
  // launchers never allocate and stay capture-safe. Null when the implementation needs none.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  // The call's stop request (its deadline passed, its client cancelled or left, the daemon's
  // drain timed out), or null: never stops. The CPU implementations poll it between work items
  // (one relaxed load each) and return early; what they wrote is then undefined and the op
  // answers StoppedStatus(). GPU hosts check it between launches. Owned by the caller.
  const std::atomic<bool>* stop = nullptr;
};

// Whether ctx's call was asked to stop (cheap: poll it per tile or row).
inline bool StopRequested(const ExecContext& ctx) {
  return ctx.stop != nullptr && ctx.stop->load(std::memory_order_relaxed);
}

// What an op that stopped early answers; the caller that set the stop replaces it with the
// reason (DEADLINE_EXCEEDED, CANCELLED, UNAVAILABLE).
inline absl::Status StoppedStatus() { return absl::CancelledError("stopped before the end"); }

template <class Params>
struct Impl {
  using SupportsFn = std::function<bool(const Params& p, std::string* why)>;
  using RunFn = std::function<absl::Status(const Params& p, const ExecContext& ctx)>;
  using WorkspaceFn = std::function<int64_t(const Params& p)>;

  Impl() = default;
  Impl(std::string name_, Backend backend_, SupportsFn supports_, RunFn run_,
       WorkspaceFn workspace_ = nullptr)
      : name(std::move(name_)),
        backend(backend_),
        supports(std::move(supports_)),
        run(std::move(run_)),
        workspace(std::move(workspace_)) {}

  std::string name;  // e.g. "cpu", "cuda_simt", "sm90_wgmma"
  Backend backend = Backend::kCpu;
  // True when this implementation handles `p`; otherwise false with the reason in *why.
  SupportsFn supports;
  // Runs the op. Params were validated by the op's Validate().
  RunFn run;
  // Bytes of device scratch run() needs for `p` (split-K partials, counters); null means none.
  WorkspaceFn workspace;
  // Dispatch's preference (null: always). For a call `supports` takes, false (the reason in
  // *why) makes dispatch pass this implementation over for the next one that supports the call;
  // it comes back to the first one passed over only when no later one does. A request that
  // names the implementation runs it whatever this says (docs/CONTRACTS.md "Dispatch").
  SupportsFn prefer;
};

// The first implementation for ctx.backend that supports p and prefers it (Impl::prefer); else
// the first that supports it; else null with the reasons in *why.
template <class Params>
const Impl<Params>* SelectImpl(const std::vector<Impl<Params>>& impls, const Params& p,
                               const ExecContext& ctx, std::string* why) {
  const Impl<Params>* passed_over = nullptr;
  for (const auto& impl : impls) {
    if (impl.backend != ctx.backend) continue;
    std::string reason;
    if (impl.supports && !impl.supports(p, &reason)) {
      absl::StrAppend(why, why->empty() ? "" : "; ", impl.name, ": ", reason);
      continue;
    }
    if (!impl.prefer || impl.prefer(p, &reason)) return &impl;
    if (passed_over == nullptr) passed_over = &impl;
  }
  if (passed_over != nullptr) return passed_over;
  if (why->empty())
    absl::StrAppend(why, "no implementation for backend ", BackendName(ctx.backend));
  return nullptr;
}

// Runs the selected implementation; *impl_name (optional) receives its name.
template <class Params>
absl::Status Dispatch(const std::vector<Impl<Params>>& impls, const Params& p,
                      const ExecContext& ctx, std::string* impl_name = nullptr) {
  std::string why;
  const Impl<Params>* impl = SelectImpl(impls, p, ctx, &why);
  if (impl == nullptr) return absl::UnimplementedError(why);
  if (impl_name != nullptr) *impl_name = impl->name;
  return impl->run(p, ctx);
}

// Entries of an implementation list that exist only in GPU builds (CUDA or HIP) or only in CUDA
// builds; each expands to its argument and a comma, or to nothing:
//   new std::vector<Impl<Params>>{ATTND_IF_CUDA(GpuImpl("mma", ...))  //
//                                 ATTND_IF_GPU(GpuImpl("simt", ...))  //
//                                 CpuImpl(RunCpu)};
#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
#define ATTND_IF_GPU(...) __VA_ARGS__,
#else
#define ATTND_IF_GPU(...)
#endif
#if defined(ATTND_GPU_CUDA)
#define ATTND_IF_CUDA(...) __VA_ARGS__,
#else
#define ATTND_IF_CUDA(...)
#endif

// The CPU implementation that ends every op's list: it supports every validated call. A call
// whose ctx.stop is set (before, or while `run` polls it between work items) answers
// StoppedStatus().
template <class Params>
Impl<Params> CpuImpl(absl::Status (*run)(const Params&, const ExecContext&)) {
  return Impl<Params>(
      "cpu", Backend::kCpu, [](const Params&, std::string*) { return true; },
      [run](const Params& p, const ExecContext& ctx) {
        if (StopRequested(ctx)) return StoppedStatus();
        absl::Status s = run(p, ctx);
        if (s.ok() && StopRequested(ctx)) return StoppedStatus();
        return s;
      });
}

// Every op's Run: validate(p), then Dispatch over its implementations.
template <class Params>
absl::Status ValidateAndDispatch(absl::Status (*validate)(const Params&),
                                 const std::vector<Impl<Params>>& impls, const Params& p,
                                 const ExecContext& ctx, std::string* impl_name) {
  absl::Status st = validate(p);
  if (!st.ok()) return st;
  return Dispatch(impls, p, ctx, impl_name);
}

#if defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)
// GPU implementations in the build's one GPU backend (CUDA or HIP), named "<vendor>_<kind>":
//   GpuImpl("simt", gpu::SimtSupports, gpu::LaunchSimt)   // "cuda_simt" / "hip_simt"
//   GpuImpl<Params>("mma", SupportsMma, RunMma, MmaWorkspace)       // run() returns a Status
#if defined(ATTND_GPU_CUDA)
inline constexpr Backend kGpuBackend = Backend::kCuda;
#else
inline constexpr Backend kGpuBackend = Backend::kHip;
#endif

inline std::string GpuImplName(absl::string_view kind) {
  return absl::StrCat(BackendName(kGpuBackend), "_", kind);
}

namespace gpu_internal {
// INTERNAL naming the implementation and the vendor runtime's message for a launcher's non-zero
// error code (kernels/common/gpu/launch_status.cc: only GPU builds define it).
absl::Status LaunchFailed(int code, absl::string_view impl);
}  // namespace gpu_internal

// An implementation whose run() is `run(p, ctx)` itself (it converts launch errors, e.g. with
// GPU_RETURN_IF_ERROR, and may use ctx.workspace).
template <class Params>
Impl<Params> GpuImpl(absl::string_view kind, typename Impl<Params>::SupportsFn supports,
                     typename Impl<Params>::RunFn run,
                     typename Impl<Params>::WorkspaceFn workspace = nullptr) {
  return Impl<Params>(GpuImplName(kind), kGpuBackend, std::move(supports), std::move(run),
                      std::move(workspace));
}

// An implementation whose run() is one launcher `Error launch(const Params&, Stream)` (the
// vendor's error enum and stream type, gpu::Error / gpu::Stream) on ctx.stream; a non-zero error
// becomes INTERNAL. Launchers never allocate, so there is no workspace.
template <class Params, class Error, class Stream,
          std::enable_if_t<std::is_enum_v<Error> && std::is_pointer_v<Stream>, int> = 0>
Impl<Params> GpuImpl(absl::string_view kind, typename Impl<Params>::SupportsFn supports,
                     Error (*launch)(const Params&, Stream)) {
  std::string name = GpuImplName(kind);
  auto run = [launch, name](const Params& p, const ExecContext& ctx) -> absl::Status {
    const Error e = launch(p, static_cast<Stream>(ctx.stream));
    if (static_cast<int>(e) == 0) return absl::OkStatus();
    return gpu_internal::LaunchFailed(static_cast<int>(e), name);
  };
  return Impl<Params>(std::move(name), kGpuBackend, std::move(supports), std::move(run));
}
#endif  // defined(ATTND_GPU_CUDA) || defined(ATTND_GPU_HIP)

// FLOPs of the useful matrix work and logical bytes (each input read once, each output written
// once) of one call (docs/CONTRACTS.md "Common rules").
struct WorkCount {
  double flops = 0;
  double bytes = 0;
};

}  // namespace attnd::kernels
