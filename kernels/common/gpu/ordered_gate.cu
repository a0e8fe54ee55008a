#include "kernels/common/gpu/ordered_gate.h"

#if defined(ATTND_GPU_CUDA)
namespace attnd::kernels::ordered {
namespace {

__global__ void Gate(cudaGraphConditionalHandle handle, CallWords* words) {
  const uint32_t control = *reinterpret_cast<volatile uint32_t*>(&words->control);
  const bool run = control != kControlCancel;
  cudaGraphSetConditional(handle, run ? 1u : 0u);
  __threadfence_system();
  *reinterpret_cast<volatile uint32_t*>(&words->state) = run ? kStateRan : kStateSkipped;
  __threadfence_system();
}

__global__ void Done(unsigned long long* done, unsigned long long value, const CallWords* words) {
  const uint32_t state = *reinterpret_cast<const volatile uint32_t*>(&words->state);
  // The op's writes (the conditional body ran before this node) become visible to other
  // processes and devices before `done` does.
  __threadfence_system();
  *reinterpret_cast<volatile unsigned long long*>(done) =
      state == kStateRan ? value : (value | kFailureBit);
  __threadfence_system();
}

__global__ void Raise(unsigned long long* word, unsigned long long value) {
  atomicMax(word, value);
  __threadfence_system();
}

}  // namespace

const void* GateKernel() { return reinterpret_cast<const void*>(&Gate); }
const void* DoneKernel() { return reinterpret_cast<const void*>(&Done); }

cudaError_t LaunchRaise(unsigned long long* word, unsigned long long value, cudaStream_t stream) {
  Raise<<<1, 1, 0, stream>>>(word, value);
  return cudaGetLastError();
}

}  // namespace attnd::kernels::ordered
#endif
