// Instances of the low-head sparse MLA kernel for d_qk = 512 (8, 16 and 32 head slots).
#if defined(ATTND_GPU_CUDA)  // CUDA-only (mma.sync); compiles to nothing for HIP
#include "kernels/sparse_mla/gpu/mma_lowh.cuh"

namespace attnd::kernels::sparse_mla::gpu {

ATTND_SPARSE_MLA_LOWH_INSTANCE(, 8, 512)
ATTND_SPARSE_MLA_LOWH_INSTANCE(, 16, 512)
ATTND_SPARSE_MLA_LOWH_INSTANCE(, 32, 512)

}  // namespace attnd::kernels::sparse_mla::gpu

#endif  // defined(ATTND_GPU_CUDA)
