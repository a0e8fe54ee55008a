// The CUDA backend's device-ordered stream-ordered calls (docs/SERVICE.md "Stream-ordered calls on
// a CUDA device"): per ordered queue and device a lane (one of the streams the runtime creates
// after the device's worker streams, the least shared one, kept while the queue lives). A call is
// enqueued as: cuStreamWaitValue64(ready >= value), then one cached executable graph [gate kernel
// → conditional IF node whose body is the op's captured launches → done kernel], then async copies
// of the work-count readbacks into pinned staging, then an event. The gate reads the call's
// control word (pinned, mapped host memory) and skips the body when the watchdog cancelled the
// call; done stores value, or value | 2^62 when skipped. Only the gate's and done's parameters
// change per launch (cudaGraphExecKernelNodeSetParams). CUDA only (HIP: the host-polled path).
//   auto q = backend.NewOrderedQueue();  ATTND_ASSIGN_OR_RETURN(auto c, q->Enqueue(call, r, d));
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "server/engine/ordered_device.h"

namespace attnd::server::engine::gpu_rt {

class GpuBackend;

// Per-backend state of the device path (control/state word slots, graph cache, watchdog streams).
class OrderedRuntime;

// Null (and the host path is used) when the runtime cannot be set up (no cuStreamWaitValue64 in
// the driver, no mapped pinned memory): the reason is logged once through `log`.
std::shared_ptr<OrderedRuntime> MakeOrderedRuntime(
    GpuBackend* backend, const std::function<void(const std::string&)>& log);
std::unique_ptr<DeviceOrderedQueue> NewGpuOrderedQueue(GpuBackend* backend,
                                                       std::shared_ptr<OrderedRuntime> runtime);

}  // namespace attnd::server::engine::gpu_rt
