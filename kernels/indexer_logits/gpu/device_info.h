// Facts about the current GPU that the indexer launchers and Supports predicates need (SM count,
// compute capability), from kernels/common/gpu/device_facts.h (cached per device). Host only.
//   if (CurrentDeviceCapability() < 80) return false;  const int sms = CurrentDeviceSmCount();
#pragma once

#include "kernels/common/gpu/device_facts.h"

namespace attnd::kernels::indexer_logits::gpu {

// 10·major + minor of the current CUDA device (90 on H200); 0 when unknown or on HIP.
inline int CurrentDeviceCapability() {
  ::attnd::gpu::DeviceFacts d;
  return ::attnd::gpu::CurrentDeviceFacts(&d) ? 10 * d.cc_major + d.cc_minor : 0;
}

// Streaming multiprocessors (compute units) of the current device; 1 when unknown.
inline int CurrentDeviceSmCount() {
  ::attnd::gpu::DeviceFacts d;
  return ::attnd::gpu::CurrentDeviceFacts(&d) && d.sm_count > 0 ? d.sm_count : 1;
}

}  // namespace attnd::kernels::indexer_logits::gpu
