// Device check of the wgmma PTX layer (kernels/common/gpu/wgmma.cuh) in the three forms the
// sparse MLA kernel uses, on one warpgroup (CUDA builds only; wgmma_layout.cu):
//   s = a · bᵀ       a [64, 576], b [64, 576] bf16, both K-major 128-byte swizzled slabs
//                    (m64n64k16, A and B from shared memory; the Q·Kᵀ form)
//   o[:, 0:256]   = p · v[:, 0:256]    p [64, 64] from registers, v [64, 512] N-major (RS)
//   o[:, 256:512] = p · v[:, 256:512]  p from shared memory, K-major (SS)
// Returns 0 on success, -1 when the current device is not compute capability 9.0, otherwise
// the CUDA error code. Host arrays; s is [64, 64] and o [64, 512] f32.
#pragma once

#include <cstdint>

namespace attnd::testing {

int RunWgmmaLayoutCheck(const uint16_t* a, const uint16_t* b, const uint16_t* p, const uint16_t* v,
                        float* s, float* o);

}  // namespace attnd::testing
