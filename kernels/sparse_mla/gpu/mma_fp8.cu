// Instances of the tensor-core sparse MLA kernel for the FP8 KV cache (d_qk 576; 16, 32 and 64
// heads per CTA).
#if defined(ATTND_GPU_CUDA)  // CUDA-only (mma.sync); compiles to nothing for HIP
#include "kernels/sparse_mla/gpu/mma.cuh"

namespace attnd::kernels::sparse_mla::gpu {

ATTND_SPARSE_MLA_MMA_FP8_INSTANCE(, 1)
ATTND_SPARSE_MLA_MMA_FP8_INSTANCE(, 2)
ATTND_SPARSE_MLA_MMA_FP8_INSTANCE(, 4)

}  // namespace attnd::kernels::sparse_mla::gpu

#endif  // defined(ATTND_GPU_CUDA)
