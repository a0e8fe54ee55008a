// The Hopper sparse MLA kernel for d_qk = 512 (its own file: the instances compile in parallel).
#if defined(ATTND_GPU_CUDA)  // CUDA-only (sm_90a wgmma); compiles to nothing for HIP
#include "kernels/sparse_mla/gpu/wgmma.cuh"

namespace attnd::kernels::sparse_mla::gpu {

ATTND_SPARSE_MLA_WGMMA_INSTANCE(, 512)

}  // namespace attnd::kernels::sparse_mla::gpu

#endif  // defined(ATTND_GPU_CUDA)
