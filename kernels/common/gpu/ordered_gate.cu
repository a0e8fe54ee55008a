#include "kernels/common/gpu/ordered_gate.h"

#if defined(ATTND_GPU_CUDA)
namespace attnd::kernels::ordered {
namespace {

__device__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The spin form's wait (ready != nullptr): until *ready >= value, then the fence; the time it
// ended (0 without a wait).
__device__ __forceinline__ unsigned long long AwaitReady(const unsigned long long* ready,
                                                         unsigned long long value,
                                                         unsigned int sleep_ns) {
  if (ready == nullptr) return 0;
  while (*reinterpret_cast<const volatile unsigned long long*>(ready) < value) {
    __nanosleep(sleep_ns);
  }
  // The producer's writes came before its ready store: the op's kernels, after this one, read
  // them.
  __threadfence_system();
  return GlobalTimer();
}

// The decision's state into the device mirror and the host's word, then the stamps.
__device__ __forceinline__ void StoreGateState(CallWords* words, uint32_t* mirror, uint32_t state,
                                               bool waited_for_ready, unsigned long long waited,
                                               unsigned long long gate_ns) {
  *reinterpret_cast<volatile uint32_t*>(mirror) = state;
  *reinterpret_cast<volatile uint32_t*>(&words->state) = state;
  if (waited_for_ready) *reinterpret_cast<volatile unsigned long long*>(&words->wait_ns) = waited;
  *reinterpret_cast<volatile unsigned long long*>(&words->gate_ns) = gate_ns;
}

// The conditional gate's decision: waits for the ready word (spin form), reads the control word,
// sets the conditional (run unless cancelled), stores the state and stamps; whether it runs.
__device__ __forceinline__ bool Decide(cudaGraphConditionalHandle handle, CallWords* words,
                                       uint32_t* mirror, const unsigned long long* ready,
                                       unsigned long long value, unsigned int sleep_ns) {
  const unsigned long long waited = AwaitReady(ready, value, sleep_ns);
  const unsigned long long gate_ns = GlobalTimer();
  // The decision first; the stamps and the host's state word (posted writes) after it.
  const uint32_t control = *reinterpret_cast<volatile uint32_t*>(&words->control);
  const bool run = control != kControlCancel;
  cudaGraphSetConditional(handle, run ? 1u : 0u);
  StoreGateState(words, mirror, run ? kStateRan : kStateSkipped, ready != nullptr, waited, gate_ns);
  return run;
}

__global__ void Gate(cudaGraphConditionalHandle handle, CallWords* words, uint32_t* mirror,
                     const unsigned long long* ready, unsigned long long value,
                     unsigned int sleep_ns) {
  (void)Decide(handle, words, mirror, ready, value, sleep_ns);
}

__global__ void GateDone(cudaGraphConditionalHandle handle, CallWords* words, uint32_t* mirror,
                         const unsigned long long* ready, unsigned long long value,
                         unsigned int sleep_ns, unsigned long long* done,
                         unsigned long long done_value) {
  if (!Decide(handle, words, mirror, ready, value, sleep_ns)) {
    // The body, and the done store in it, will not run.
    const unsigned long long done_ns = GlobalTimer();
    __threadfence_system();
    *reinterpret_cast<volatile unsigned long long*>(done) = done_value | kFailureBit;
    *reinterpret_cast<volatile unsigned long long*>(&words->done_ns) = done_ns;
  }
}

__global__ void GateEnable(const __grid_constant__ BodyNodes nodes, CallWords* words,
                           uint32_t* mirror, const unsigned long long* ready,
                           unsigned long long value, unsigned int sleep_ns) {
  const unsigned long long waited = AwaitReady(ready, value, sleep_ns);
  const unsigned long long gate_ns = GlobalTimer();
  const uint32_t control = *reinterpret_cast<volatile uint32_t*>(&words->control);
  const bool run = control != kControlCancel;
  bool updated = true;
  for (int i = 0; i < nodes.count; ++i) {
    updated = cudaGraphKernelNodeSetEnabled(nodes.node[i], run) == cudaSuccess && updated;
  }
  // The updates before anything that follows the gate (what CUDA asks before a programmatic
  // launch of a dependent; the daemon's graphs have none, and it costs one fence).
  __threadfence();
  StoreGateState(words, mirror,
                 !updated ? kStateUpdateFailed
                 : run    ? kStateRan
                          : kStateSkipped,
                 ready != nullptr, waited, gate_ns);
}

__global__ void Done(unsigned long long* done, unsigned long long value, CallWords* words,
                     const uint32_t* mirror) {
  const unsigned long long done_ns = GlobalTimer();
  const uint32_t state = *reinterpret_cast<const volatile uint32_t*>(mirror);
  // The op's writes (the conditional body ran before this node) become visible to other
  // processes and devices before `done` does.
  __threadfence_system();
  *reinterpret_cast<volatile unsigned long long*>(done) =
      state == kStateRan ? value : (value | kFailureBit);
  // The stamp (a write across the bus to the host's slot) after the store, off its path.
  *reinterpret_cast<volatile unsigned long long*>(&words->done_ns) = done_ns;
}

__global__ void Raise(unsigned long long* word, unsigned long long value) {
  atomicMax(word, value);
  __threadfence_system();
}

__global__ void StampNow(unsigned long long* at) {
  *reinterpret_cast<volatile unsigned long long*>(at) = GlobalTimer();
}

}  // namespace

const void* GateKernel() { return reinterpret_cast<const void*>(&Gate); }
const void* GateDoneKernel() { return reinterpret_cast<const void*>(&GateDone); }
const void* GateEnableKernel() { return reinterpret_cast<const void*>(&GateEnable); }
const void* DoneKernel() { return reinterpret_cast<const void*>(&Done); }

cudaError_t LaunchRaise(unsigned long long* word, unsigned long long value, cudaStream_t stream) {
  Raise<<<1, 1, 0, stream>>>(word, value);
  return cudaGetLastError();
}

cudaError_t LaunchStamp(unsigned long long* at, cudaStream_t stream) {
  StampNow<<<1, 1, 0, stream>>>(at);
  return cudaGetLastError();
}

}  // namespace attnd::kernels::ordered
#endif
