// The checks of the current device that GPU implementations' Supports() share (refusing through
// kernels/common/supports.h): a device is current, it runs the bf16 mma.sync kernels, and a kernel
// instance's shared memory and residency fit on it. Host only; include from .cu files.
//   ::attnd::gpu::DeviceFacts d;
//   if (!CurrentDevice(&d, why) || !RunsMmaSync(d, why)) return false;
//   if (!FitsDevice(shape.smem_bytes, shape.ctas_per_sm, d, why)) return false;
#pragma once

#include <string>

#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/supports.h"

namespace attnd::kernels {

// The current device's facts in *d; false with "no GPU device" when there is none.
inline bool CurrentDevice(::attnd::gpu::DeviceFacts* d, std::string* why) {
  return ::attnd::gpu::CurrentDeviceFacts(d) || Refuse(why, "no GPU device");
}

// Whether d runs bf16 mma.sync (CUDA, compute capability >= 8.0); else false with the reason.
inline bool RunsMmaSync(const ::attnd::gpu::DeviceFacts& d, std::string* why) {
#if defined(ATTND_GPU_CUDA)
  if (d.cc_major >= 8) return true;
  return Refuse(why, "needs compute capability >= 8.0 (bf16 mma.sync), device has ", d.cc_major,
                ".", d.cc_minor);
#else
  static_cast<void>(d);
  return Refuse(why, "the mma.sync kernel is CUDA-only");
#endif
}

// Whether a kernel instance using `smem_bytes` of dynamic shared memory per CTA, `ctas_per_sm`
// of which are resident per SM (the occupancy API's answer), can run on d.
inline bool FitsDevice(int smem_bytes, int ctas_per_sm, const ::attnd::gpu::DeviceFacts& d,
                       std::string* why) {
  if (smem_bytes > d.smem_optin) {
    return Refuse(why, "needs ", smem_bytes, " bytes of shared memory per block, device allows ",
                  d.smem_optin);
  }
  if (ctas_per_sm < 1) return Refuse(why, "the kernel cannot be resident on this device");
  return true;
}

}  // namespace attnd::kernels
