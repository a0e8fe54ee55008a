// The Supports rules both Hopper fp8 wgmma indexer kernels share (prefill and paged; CUDA host
// code): precision FAST only, as the fp8 wgmma accumulates in 14 significant bits
// (docs/ACCURACY.md "Indexer logits, FAST": only FAST's bound admits that), and a compute
// capability 9.0 device (sm_90a wgmma, TMA), whose facts the caller gets for its own checks.
//   ::attnd::gpu::DeviceFacts facts;
//   if (!SupportsFp8WgmmaIndexer(p.precision, &facts, why)) return false;
#pragma once

#if !defined(ATTND_GPU_CUDA)
#error "kernels/indexer_logits/gpu/wgmma_supports.h is CUDA-only"
#endif

#include <string>

#include "kernels/common/gpu/device_facts.h"
#include "kernels/common/precision.h"
#include "kernels/common/supports.h"

namespace attnd::kernels::indexer_logits::gpu {

inline bool SupportsFp8WgmmaIndexer(Precision precision, ::attnd::gpu::DeviceFacts* facts,
                                    std::string* why) {
  if (precision != Precision::kFast) {
    return Refuse(why, "runs precision fast only (fp8 tensor-core accumulation), call asks for ",
                  PrecisionName(precision));
  }
  if (!::attnd::gpu::CurrentDeviceFacts(facts)) return Refuse(why, "no usable CUDA device");
  if (facts->cc_major != 9 || facts->cc_minor != 0) {
    return Refuse(why, "needs compute capability 9.0 (sm_90a wgmma, TMA), device has ",
                  facts->cc_major, ".", facts->cc_minor);
  }
  return true;
}

}  // namespace attnd::kernels::indexer_logits::gpu
