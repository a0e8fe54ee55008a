// Instances of the tensor-core MLA decode kernel for the per-tensor FP8 cache, d_qk = 576 (16, 32
// and 64 rows per CTA), HIGH.
#if defined(ATTND_GPU_CUDA)
#include "kernels/mla_decode/gpu/mma.cuh"

namespace attnd::kernels::mla_decode::gpu {

ATTND_MLA_DECODE_MMA_FP8_INSTANCE(, 1, 576, true)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(, 2, 576, true)
ATTND_MLA_DECODE_MMA_FP8_INSTANCE(, 4, 576, true)

}  // namespace attnd::kernels::mla_decode::gpu
#endif  // ATTND_GPU_CUDA
