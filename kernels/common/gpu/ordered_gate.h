// The three tiny kernels of the CUDA backend's device-ordered stream-ordered calls
// (docs/SERVICE.md "Stream-ordered calls on a CUDA device"): the gate (reads the call's control
// word, sets the graph conditional that runs or skips the op, writes the call's state word), the
// done store (done = value, or value | 2^62 when the op was skipped) and the watchdog's raise
// (atomicMax of a device-region ready word). CUDA only: in a HIP build the file is empty.
//   void* gate = attnd::kernels::ordered::GateKernel();  // a kernel node's function
#pragma once

#include <cstdint>

#if defined(ATTND_GPU_CUDA)
#include <cuda_runtime.h>

namespace attnd::kernels::ordered {

// Written by the daemon's host into a call's control word (pinned, mapped host memory).
inline constexpr uint32_t kControlRun = 0;
inline constexpr uint32_t kControlCancel = 1;
// Written by the gate into a call's state word (pinned, mapped host memory); the host reads it
// once the call's completion event has passed.
inline constexpr uint32_t kStateNotGated = 0;
inline constexpr uint32_t kStateRan = 1;
inline constexpr uint32_t kStateSkipped = 2;
// The enable form's gate could not set the op's kernel nodes as it decided (a device-side node
// update failed): the op may have run, or not, whatever the control word said. The done word
// gets the failure bit and the host fails the call.
inline constexpr uint32_t kStateUpdateFailed = 3;
// The failure bit of done words, the daemon's ops::kSignalFailureBit: bit 62, so that a stream
// waiting for done >= value (a cyclic compare) also ends on a skipped call's done word
// (docs/SERVICE.md "Failure bit").
inline constexpr uint64_t kFailureBit = 1ull << 62;

// The per-call words the gate and done kernels read (one 64-byte slot per pending call). The
// *_ns stamps are %globaltimer readings (one clock for every context on the GPU) for the daemon's
// trace of device-ordered calls (docs/OPERATIONS.md "Tracing stream-ordered calls").
struct CallWords {
  uint32_t control;  // kControlRun / kControlCancel (host writes)
  uint32_t state;    // kState* (the gate writes)
  uint64_t scratch;  // the done store of a call that has no done word
  uint64_t gate_ns;  // when the gate began (the gate writes)
  uint64_t done_ns;  // just before the done store (the done kernel writes)
  uint64_t wait_ns;  // right after the ready wait ended (LaunchStamp; only when tracing)
  uint64_t pad[3];
};
static_assert(sizeof(CallWords) == 64, "one cache line per call");

// __global__ void gate(cudaGraphConditionalHandle handle, CallWords* words, uint32_t* mirror,
//                      const unsigned long long* ready, unsigned long long value,
//                      unsigned int sleep_ns): one thread.
// With `ready` (the spin form, docs/SERVICE.md "The gate's two forms"): spins (volatile loads,
// __nanosleep(sleep_ns) between them) until *ready >= value and fences. Then reads
// words->control (volatile), sets the conditional to 1 (run) unless cancelled, stores the state
// (kStateRan / kStateSkipped) into *mirror (device memory, for the done kernel) and words->state
// (for the host), and last the stamps taken before: words->wait_ns (spin form: when the word was
// seen) and words->gate_ns (before the decision).
const void* GateKernel();
// __global__ void gate_done(cudaGraphConditionalHandle handle, CallWords* words, uint32_t* mirror,
//                           const unsigned long long* ready, unsigned long long value,
//                           unsigned int sleep_ns, unsigned long long* done,
//                           unsigned long long done_value): one thread.
// The gate above for a graph whose done store sits inside the IF body, after the op
// (docs/SERVICE.md "The done store inside the body"): when it cancels, nothing of the body runs,
// so it stores done_value | kFailureBit into *done itself (after __threadfence_system) and then
// words->done_ns; when it runs the op it leaves *done to the body's done kernel.
const void* GateDoneKernel();
// The enable form of the gate (docs/SERVICE.md "Skipping a cancelled call's op"): no conditional
// node; the op's kernel nodes are device-updatable and `nodes` holds their handles.
inline constexpr int kMaxBodyNodes = 32;
struct BodyNodes {
  cudaGraphDeviceNode_t node[kMaxBodyNodes];
  int count;
};
// __global__ void gate_enable(const __grid_constant__ BodyNodes nodes, CallWords* words,
//                             uint32_t* mirror, const unsigned long long* ready,
//                             unsigned long long value, unsigned int sleep_ns): one thread.
// The gate above, but instead of setting a conditional it enables every node of `nodes` (run) or
// disables them (cancelled) for this launch of the graph and the later ones (each launch sets
// them again: no state is carried from one launch to the next). The state it stores is
// kStateUpdateFailed when a node update failed.
const void* GateEnableKernel();
// __global__ void done(unsigned long long* done, unsigned long long value, CallWords* words,
//                      const uint32_t* mirror): one thread: reads the gate's *mirror,
// __threadfence_system(), a volatile store of value (kStateRan) or value | kFailureBit (anything
// else) into *done, and then words->done_ns (taken at its start).
const void* DoneKernel();
// Enqueues one thread doing atomicMax(word, value) on `stream` (the watchdog's release of a
// device-region ready word).
cudaError_t LaunchRaise(unsigned long long* word, unsigned long long value, cudaStream_t stream);
// Enqueues one thread storing %globaltimer (ns) into *at on `stream` (traces: the daemon's and
// the decode-step benchmark's, on one clock).
cudaError_t LaunchStamp(unsigned long long* at, cudaStream_t stream);

}  // namespace attnd::kernels::ordered
#endif
