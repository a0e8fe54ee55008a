// One kernel no other code of gpu_runtime_test launches (gpu_ordered_fresh_kernel.cu), and a
// copy kernel for test ops made of kernels only.
//   LaunchFreshFill(p, 7, n, stream);      // p[0..n) = 7 on `stream`
//   LaunchCopyWords(in, out, n, stream);   // out[0..n) = in[0..n)
//   LaunchClusterCopyWords(in, out, n, ctas, stream);  // the same in clusters of 2 CTAs; each
//                                                      // CTA adds 1 to *ctas
#pragma once

#include <cuda_runtime.h>

namespace attnd::server::engine::gpu_rt::testing {

cudaError_t LaunchFreshFill(unsigned int* p, unsigned int value, unsigned int n,
                            cudaStream_t stream);
cudaError_t LaunchCopyWords(const unsigned int* in, unsigned int* out, unsigned int n,
                            cudaStream_t stream);
// The grid LaunchClusterCopyWords launches for n words (CTAs, an even number).
unsigned int ClusterCopyGrid(unsigned int n);
cudaError_t LaunchClusterCopyWords(const unsigned int* in, unsigned int* out, unsigned int n,
                                   unsigned int* ctas, cudaStream_t stream);

}  // namespace attnd::server::engine::gpu_rt::testing
