// Thread-block clusters (sm_90) for every GPU kernel: the CTA's rank and the cluster's size, a
// barrier over the whole cluster, and the address of a shared-memory object in another CTA of
// the cluster (generic, or shared::cluster for st.async and remote mbarriers). Portable CUDA/HIP:
// below sm_90 (and on HIP) a cluster is one CTA: rank 0 of 1, the barrier is the block's and
// the mappings are the identity; launchers never ask for more there.
//   ClusterSync();  const uint32_t* remote = MapToRank(my_hist, peer);
#pragma once

#include <stdint.h>

#include "kernels/common/gpu/vendor.h"

namespace attnd::gpu {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ATTND_GPU_CLUSTERS 1
#else
#define ATTND_GPU_CLUSTERS 0
#endif

__device__ __forceinline__ uint32_t ClusterCtaRank() {
#if ATTND_GPU_CLUSTERS
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
#else
  return 0;
#endif
}

__device__ __forceinline__ uint32_t ClusterNumCtas() {
#if ATTND_GPU_CLUSTERS
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
#else
  return 1;
#endif
}

// Barrier over every thread of every CTA of the cluster (warps converged), ordering shared-memory
// (and DSMEM) accesses before it with those after it: release, then acquire. Every thread must
// call it; it is also a barrier for the CTA's own threads.
__device__ __forceinline__ void ClusterSync() {
#if ATTND_GPU_CLUSTERS
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
#else
  __syncthreads();
#endif
}

// The generic address of the same shared-memory object in the cluster's CTA `rank` (T may be
// const).
template <class T>
__device__ __forceinline__ T* MapToRank(T* p, uint32_t rank) {
#if ATTND_GPU_CLUSTERS
  uint64_t out;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(reinterpret_cast<uint64_t>(p)), "r"(rank));
  return reinterpret_cast<T*>(out);
#else
  static_cast<void>(rank);
  return p;
#endif
}

// The shared::cluster address of this CTA's shared-memory address `addr` (a 32-bit shared::cta
// address) in CTA `rank`: what st.async and remote mbarrier operations take.
__device__ __forceinline__ uint32_t MapShared(uint32_t addr, uint32_t rank) {
#if ATTND_GPU_CLUSTERS
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
#else
  static_cast<void>(rank);
  return addr;
#endif
}

#undef ATTND_GPU_CLUSTERS

}  // namespace attnd::gpu
