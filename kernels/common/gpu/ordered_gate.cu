#include "kernels/common/gpu/ordered_gate.h"

#include <vector>

#if defined(ATTND_GPU_CUDA)
namespace attnd::kernels::ordered {
namespace {

__device__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void Gate(cudaGraphConditionalHandle handle, CallWords* words) {
  *reinterpret_cast<volatile unsigned long long*>(&words->gate_ns) = GlobalTimer();
  const uint32_t control = *reinterpret_cast<volatile uint32_t*>(&words->control);
  const bool run = control != kControlCancel;
  cudaGraphSetConditional(handle, run ? 1u : 0u);
  __threadfence_system();
  *reinterpret_cast<volatile uint32_t*>(&words->state) = run ? kStateRan : kStateSkipped;
  __threadfence_system();
}

__global__ void Done(unsigned long long* done, unsigned long long value, CallWords* words) {
  *reinterpret_cast<volatile unsigned long long*>(&words->done_ns) = GlobalTimer();
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

__global__ void Fill(unsigned char* dst, size_t pitch, unsigned int value,
                     unsigned int element_size, size_t width, size_t height) {
  const size_t n = width * height;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    unsigned char* p = dst + (i / width) * pitch + (i % width) * element_size;
    if (element_size == 1) {
      *p = static_cast<unsigned char>(value);
    } else if (element_size == 2) {
      *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(value);
    } else {
      *reinterpret_cast<unsigned int*>(p) = value;
    }
  }
}

__global__ void StampNow(unsigned long long* at) {
  *reinterpret_cast<volatile unsigned long long*>(at) = GlobalTimer();
}

}  // namespace

const void* GateKernel() { return reinterpret_cast<const void*>(&Gate); }
const void* DoneKernel() { return reinterpret_cast<const void*>(&Done); }

cudaError_t LaunchRaise(unsigned long long* word, unsigned long long value, cudaStream_t stream) {
  Raise<<<1, 1, 0, stream>>>(word, value);
  return cudaGetLastError();
}

cudaError_t MemsetsToFills(cudaGraph_t graph) {
  constexpr unsigned kThreads = 256;
  size_t count = 0;
  cudaError_t e = cudaGraphGetNodes(graph, nullptr, &count);
  if (e != cudaSuccess) return e;
  std::vector<cudaGraphNode_t> nodes(count);
  if ((e = cudaGraphGetNodes(graph, nodes.data(), &count)) != cudaSuccess) return e;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if ((e = cudaGraphNodeGetType(node, &type)) != cudaSuccess) return e;
    if (type != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams m{};
    if ((e = cudaGraphMemsetNodeGetParams(node, &m)) != cudaSuccess) return e;
    if (m.elementSize != 1 && m.elementSize != 2 && m.elementSize != 4) {
      return cudaErrorNotSupported;
    }
    size_t in = 0, out = 0;
    if ((e = cudaGraphNodeGetDependencies(node, nullptr, nullptr, &in)) != cudaSuccess) return e;
    if ((e = cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &out)) != cudaSuccess) return e;
    std::vector<cudaGraphNode_t> from(in), to(out);
    if ((e = cudaGraphNodeGetDependencies(node, from.data(), nullptr, &in)) != cudaSuccess)
      return e;
    if ((e = cudaGraphNodeGetDependentNodes(node, to.data(), nullptr, &out)) != cudaSuccess) {
      return e;
    }
    unsigned char* dst = static_cast<unsigned char*>(m.dst);
    size_t pitch = m.pitch;
    unsigned int value = m.value;
    unsigned int element_size = m.elementSize;
    size_t width = m.width;
    size_t height = m.height;
    void* args[] = {&dst, &pitch, &value, &element_size, &width, &height};
    const unsigned long long n = static_cast<unsigned long long>(width) * height;
    const unsigned long long blocks = (n + kThreads - 1) / kThreads;
    cudaKernelNodeParams kp{};
    kp.func = reinterpret_cast<void*>(&Fill);
    kp.gridDim = dim3(static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 1024 ? 1024 : blocks)));
    kp.blockDim = dim3(kThreads);
    kp.kernelParams = args;
    cudaGraphNode_t fill = nullptr;
    if ((e = cudaGraphAddKernelNode(&fill, graph, from.data(), from.size(), &kp)) != cudaSuccess) {
      return e;
    }
    for (cudaGraphNode_t t : to) {
      if ((e = cudaGraphAddDependencies(graph, &fill, &t, nullptr, 1)) != cudaSuccess) return e;
    }
    if ((e = cudaGraphDestroyNode(node)) != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t LaunchStamp(unsigned long long* at, cudaStream_t stream) {
  StampNow<<<1, 1, 0, stream>>>(at);
  return cudaGetLastError();
}

}  // namespace attnd::kernels::ordered
#endif
