// The Hopper sparse MLA kernel for the FP8 KV cache (d_qk 576; its own file: the instances
// compile in parallel).
#if defined(ATTND_GPU_CUDA)  // CUDA-only (sm_90a wgmma); compiles to nothing for HIP
#include "kernels/sparse_mla/gpu/wgmma.cuh"

namespace attnd::kernels::sparse_mla::gpu {

ATTND_SPARSE_MLA_WGMMA_FP8_INSTANCE()

}  // namespace attnd::kernels::sparse_mla::gpu

#endif  // defined(ATTND_GPU_CUDA)
