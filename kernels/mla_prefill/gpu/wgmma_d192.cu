// The Hopper MLA prefill kernel for the model's head dims: d_qk 192, d_v 128.
#if defined(ATTND_GPU_CUDA)
#include "kernels/mla_prefill/gpu/wgmma.cuh"

namespace attnd::kernels::mla_prefill::gpu {

ATTND_MLA_PREFILL_WGMMA_INSTANCE(, 192, 128)

}  // namespace attnd::kernels::mla_prefill::gpu
#endif  // ATTND_GPU_CUDA
