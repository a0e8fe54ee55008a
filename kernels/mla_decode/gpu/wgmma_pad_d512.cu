// The Hopper dense MLA decode kernel for d_qk = 512 at H < 64, rows padded to 64 (PaddedRows),
// both precisions (its own file: the instances compile in parallel).
#if defined(ATTND_GPU_CUDA)  // CUDA-only (sm_90a wgmma)
#include "kernels/mla_decode/gpu/wgmma.cuh"

namespace attnd::kernels::mla_decode::gpu {

ATTND_MLA_DECODE_WGMMA_INSTANCE_P(, 512, true)

}  // namespace attnd::kernels::mla_decode::gpu

#endif  // defined(ATTND_GPU_CUDA)
