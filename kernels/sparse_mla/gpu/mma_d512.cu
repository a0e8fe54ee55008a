// Instances of the tensor-core sparse MLA kernel for d_qk = 512 (16, 32 and 64 heads per CTA).
#if defined(ATTND_GPU_CUDA)  // CUDA-only (mma.sync); compiles to nothing for HIP
#include "kernels/sparse_mla/gpu/mma.cuh"

namespace attnd::kernels::sparse_mla::gpu {

ATTND_SPARSE_MLA_MMA_INSTANCE(, 1, 512)
ATTND_SPARSE_MLA_MMA_INSTANCE(, 2, 512)
ATTND_SPARSE_MLA_MMA_INSTANCE(, 4, 512)

}  // namespace attnd::kernels::sparse_mla::gpu

#endif  // defined(ATTND_GPU_CUDA)
