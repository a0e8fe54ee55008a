// The tensor-core MLA prefill kernel for other common head dims (64/64, 128/128; 256/256 would
// spill its 128 O registers: the SIMT kernel runs it).
#if defined(ATTND_GPU_CUDA)
#include "kernels/mla_prefill/gpu/mma.cuh"

namespace attnd::kernels::mla_prefill::gpu {

ATTND_MLA_PREFILL_MMA_INSTANCE(, 64, 64)
ATTND_MLA_PREFILL_MMA_INSTANCE(, 128, 128)

}  // namespace attnd::kernels::mla_prefill::gpu
#endif  // ATTND_GPU_CUDA
