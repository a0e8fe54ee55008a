// A kernel launched only by GpuOrderedTest.AKernelFirstLaunchedWhileACallWaitsRuns: its first
// launch in the process comes while a device-ordered call waits on its ready word, which under
// lazy module loading would wait for that caller (docs/SERVICE.md "Stream-ordered calls on a
// CUDA device"). And copy kernels for the ops made of kernels only, one launched in clusters.
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

__global__ void ClusterCopyWords(const unsigned int* in, unsigned int* out, unsigned int n,
                                 unsigned int* ctas) {
  const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
  if (threadIdx.x == 0) atomicAdd(ctas, 1u);
}

}  // namespace

unsigned int ClusterCopyGrid(unsigned int n) { return ((n + 255) / 256 + 1) / 2 * 2; }

cudaError_t LaunchClusterCopyWords(const unsigned int* in, unsigned int* out, unsigned int n,
                                   unsigned int* ctas, cudaStream_t stream) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(ClusterCopyGrid(n), 1, 1);
  c.blockDim = dim3(256, 1, 1);
  c.stream = stream;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = 2;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  c.attrs = at;
  c.numAttrs = 1;
  return cudaLaunchKernelEx(&c, ClusterCopyWords, in, out, n, ctas);
}

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
