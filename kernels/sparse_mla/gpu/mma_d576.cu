// Instances of the tensor-core sparse MLA kernel for d_qk = 576 (16, 32 and 64 heads per CTA).
#if defined(ATTND_GPU_CUDA)  // CUDA-only (mma.sync); compiles to nothing for HIP
#include "kernels/sparse_mla/gpu/mma.cuh"

namespace attnd::kernels::sparse_mla::gpu {

ATTND_SPARSE_MLA_MMA_INSTANCE(, 1, 576)
ATTND_SPARSE_MLA_MMA_INSTANCE(, 2, 576)
ATTND_SPARSE_MLA_MMA_INSTANCE(, 4, 576)

}  // namespace attnd::kernels::sparse_mla::gpu

#endif  // defined(ATTND_GPU_CUDA)
