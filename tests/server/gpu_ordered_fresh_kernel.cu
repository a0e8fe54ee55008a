// A kernel launched only by GpuOrderedTest.AKernelFirstLaunchedWhileACallWaitsRuns: its first
// launch in the process comes while a device-ordered call waits on its ready word, which under
// lazy module loading would wait for that caller (docs/SERVICE.md "Stream-ordered calls on a
// CUDA device"). And a copy kernel for the ops made of kernels only.
#include "tests/server/gpu_ordered_fresh_kernel.h"

namespace attnd::server::engine::gpu_rt::testing {
namespace {

__global__ void FreshFill(unsigned int* p, unsigned int value, unsigned int n) {
  const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value;
}

__global__ void CopyWords(const unsigned int* in, unsigned int* out, unsigned int n) {
  const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

}  // namespace

cudaError_t LaunchCopyWords(const unsigned int* in, unsigned int* out, unsigned int n,
                            cudaStream_t stream) {
  CopyWords<<<(n + 255) / 256, 256, 0, stream>>>(in, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchFreshFill(unsigned int* p, unsigned int value, unsigned int n,
                            cudaStream_t stream) {
  FreshFill<<<(n + 255) / 256, 256, 0, stream>>>(p, value, n);
  return cudaGetLastError();
}

}  // namespace attnd::server::engine::gpu_rt::testing
