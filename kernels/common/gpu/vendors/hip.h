// HIP side of the gpu:: vendor layer (included only through kernels/common/gpu/vendor.h): the
// runtime wrappers, and ATTND_LAUNCH_BOUNDS with CUDA's meaning (docs/HIP.md).
#pragma once

#include <hip/hip_runtime.h>

#include <cstring>
#include <string>

namespace attnd::gpu {

using Stream = hipStream_t;
using Event = hipEvent_t;
using Error = hipError_t;
using IpcMemHandle = hipIpcMemHandle_t;
using IpcEventHandle = hipIpcEventHandle_t;
using Graph = hipGraph_t;
using GraphExec = hipGraphExec_t;
using DeviceProp = hipDeviceProp_t;

inline constexpr Error kSuccess = hipSuccess;
inline constexpr Error kErrorInvalidValue = hipErrorInvalidValue;
inline constexpr const char* kVendorName = "hip";

inline const char* ErrorString(Error e) { return hipGetErrorString(e); }
inline Error GetLastError() { return hipGetLastError(); }
inline Error GetDeviceCount(int* n) { return hipGetDeviceCount(n); }
inline Error SetDevice(int d) { return hipSetDevice(d); }
inline Error GetDevice(int* d) { return hipGetDevice(d); }
inline Error Malloc(void** p, size_t bytes) { return hipMalloc(p, bytes); }
inline Error Free(void* p) { return hipFree(p); }
inline Error MallocHost(void** p, size_t bytes) { return hipHostMalloc(p, bytes, 0); }
inline Error FreeHost(void* p) { return hipHostFree(p); }
inline Error HostRegister(void* p, size_t bytes) {
  return hipHostRegister(p, bytes, hipHostRegisterDefault);
}
inline Error HostUnregister(void* p) { return hipHostUnregister(p); }
inline Error MemcpyH2DAsync(void* dst, const void* src, size_t n, Stream s) {
  return hipMemcpyAsync(dst, src, n, hipMemcpyHostToDevice, s);
}
inline Error MemcpyD2HAsync(void* dst, const void* src, size_t n, Stream s) {
  return hipMemcpyAsync(dst, src, n, hipMemcpyDeviceToHost, s);
}
inline Error MemcpyD2DAsync(void* dst, const void* src, size_t n, Stream s) {
  return hipMemcpyAsync(dst, src, n, hipMemcpyDeviceToDevice, s);
}
inline Error MemsetAsync(void* p, int value, size_t n, Stream s) {
  return hipMemsetAsync(p, value, n, s);
}
inline Error StreamCreate(Stream* s) { return hipStreamCreateWithFlags(s, hipStreamNonBlocking); }
inline Error StreamDestroy(Stream s) { return hipStreamDestroy(s); }
inline Error StreamSynchronize(Stream s) { return hipStreamSynchronize(s); }
// fn(data) on a runtime thread once the stream's earlier work is done (vendors/cuda.h).
inline Error LaunchHostFunc(Stream s, void (*fn)(void*), void* data) {
  return hipLaunchHostFunc(s, fn, data);
}
inline Error StreamWaitEvent(Stream s, Event e) { return hipStreamWaitEvent(s, e, 0); }
inline Error EventCreate(Event* e) { return hipEventCreate(e); }
inline Error EventCreateInterprocess(Event* e) {
  return hipEventCreateWithFlags(e, hipEventDisableTiming | hipEventInterprocess);
}
inline Error EventDestroy(Event e) { return hipEventDestroy(e); }
inline Error EventRecord(Event e, Stream s) { return hipEventRecord(e, s); }
inline Error EventSynchronize(Event e) { return hipEventSynchronize(e); }
inline Error EventElapsedMs(float* ms, Event a, Event b) { return hipEventElapsedTime(ms, a, b); }
inline Error IpcOpenMemHandle(void** p, IpcMemHandle h) {
  return hipIpcOpenMemHandle(p, h, hipIpcMemLazyEnablePeerAccess);
}
inline Error IpcCloseMemHandle(void* p) { return hipIpcCloseMemHandle(p); }
inline Error IpcGetMemHandle(IpcMemHandle* h, void* p) { return hipIpcGetMemHandle(h, p); }
inline Error IpcOpenEventHandle(Event* e, IpcEventHandle h) { return hipIpcOpenEventHandle(e, h); }
inline Error IpcGetEventHandle(IpcEventHandle* h, Event e) { return hipIpcGetEventHandle(h, e); }
inline Error MemGetInfo(size_t* free_bytes, size_t* total) {
  return hipMemGetInfo(free_bytes, total);
}
// Launches `kernel` (a __global__ function's address) with its arguments' addresses in `args`.
inline Error LaunchKernel(const void* kernel, dim3 grid, dim3 block, void** args, size_t smem,
                          Stream s) {
  return hipLaunchKernel(kernel, grid, block, args, smem, s);
}

// ---- Device facts (daemon runtime) ----
inline Error GetDeviceProperties(DeviceProp* p, int d) { return hipGetDeviceProperties(p, d); }
inline Error GetDeviceUuid(int d, unsigned char out[16]) {
  hipUUID u;
  const Error e = hipDeviceGetUuid(&u, d);
  if (e == hipSuccess) std::memcpy(out, u.bytes, 16);
  return e;
}
inline std::string ArchName(const DeviceProp& p) {
  std::string arch = p.gcnArchName;
  const size_t colon = arch.find(':');  // "gfx90a:sramecc+:xnack-" -> "gfx90a"
  return colon == std::string::npos ? arch : arch.substr(0, colon);
}
inline int MultiprocessorCount(const DeviceProp& p) { return p.multiProcessorCount; }
// MPS is NVIDIA's: HIP processes' queues share the GPU without a server, so never.
inline Error DeviceUsesMps(int /*d*/, bool* on) {
  *on = false;
  return hipSuccess;
}
inline bool IsDeviceLost(Error e) {
  switch (e) {
    case hipErrorIllegalAddress:
    case hipErrorLaunchFailure:
    case hipErrorECCNotCorrectable:
    case hipErrorNoDevice:
    case hipErrorAssert:
    case hipErrorContextIsDestroyed: return true;
    default: return false;
  }
}

// ---- Host memory visible to every device ----
inline Error HostAllocPortable(void** p, size_t bytes) {
  return hipHostMalloc(p, bytes, hipHostMallocPortable);
}
inline Error HostRegisterPortable(void* p, size_t bytes) {
  return hipHostRegister(p, bytes, hipHostRegisterPortable);
}

// ---- Pointers ----
inline Error PointerDevice(const void* p, int* device) {
  hipPointerAttribute_t a;
  const Error e = hipPointerGetAttributes(&a, p);
  if (e != hipSuccess) return e;
  if (a.memoryType != hipMemoryTypeDevice) return hipErrorInvalidValue;
  *device = a.device;
  return hipSuccess;
}
inline Error MemGetAddressRange(const void* p, void** base, size_t* size) {
  hipDeviceptr_t b = nullptr;
  const Error e = hipMemGetAddressRange(&b, size, const_cast<void*>(p));
  if (e == hipSuccess) *base = b;
  return e;
}

// ---- Graphs ----
inline Error StreamBeginCapture(Stream s) {
  return hipStreamBeginCapture(s, hipStreamCaptureModeThreadLocal);
}
inline Error StreamEndCapture(Stream s, Graph* g) { return hipStreamEndCapture(s, g); }
inline Error GraphInstantiate(GraphExec* e, Graph g) {
  return hipGraphInstantiate(e, g, nullptr, nullptr, 0);
}
inline Error GraphExecUpdate(GraphExec e, Graph g) {
  hipGraphNode_t node = nullptr;
  hipGraphExecUpdateResult result = hipGraphExecUpdateSuccess;
  return hipGraphExecUpdate(e, g, &node, &result);
}
inline Error GraphLaunch(GraphExec e, Stream s) { return hipGraphLaunch(e, s); }
inline Error GraphExecDestroy(GraphExec e) { return hipGraphExecDestroy(e); }
inline Error GraphDestroy(Graph g) { return hipGraphDestroy(g); }

// ---- Launch bounds ----
// Facts of the CDNA target being compiled: four SIMDs (EUs) per CU; 160 KiB of LDS per CU on
// gfx950 (MI355X), 64 KiB on gfx90a and gfx942. The host pass sees 64 KiB, the smallest.
inline constexpr int kSimdsPerCu = 4;
__host__ __device__ constexpr int LdsBytesPerCu() {
#if defined(__gfx950__)
  return 160 * 1024;
#else
  return 64 * 1024;
#endif
}

// CUDA's "at least `min_blocks` resident blocks of `max_threads` threads" as the minimum waves
// per SIMD that amdgpu_waves_per_eu takes, counting no more blocks than the LDS holds at
// `static_smem_bytes` each (0: the kernel declares none). CUDA's figure only bounds registers;
// the AMDGPU backend also weighs the LDS and fails (-Wpass-failed) on a target it cannot meet.
__host__ __device__ constexpr int MinWavesPerSimd(int max_threads, int min_blocks,
                                                  int static_smem_bytes, int wave_size) {
  const int lds_blocks = static_smem_bytes > 0 ? LdsBytesPerCu() / static_smem_bytes : min_blocks;
  const int blocks = lds_blocks >= min_blocks ? min_blocks : (lds_blocks > 0 ? lds_blocks : 1);
  const int waves = blocks * ((max_threads + wave_size - 1) / wave_size);
  return (waves + kSimdsPerCu - 1) / kSimdsPerCu;
}

}  // namespace attnd::gpu

// Kernel attribute with CUDA's __launch_bounds__(max_threads, min_blocks) meaning on AMD; the
// CUDA side is in vendors/cuda.h. HIP's own two-argument __launch_bounds__ passes its second
// argument to amdgpu_waves_per_eu unchanged: a minimum of waves per SIMD, not of blocks per CU.
#define ATTND_LAUNCH_BOUNDS(max_threads, min_blocks, static_smem_bytes)                \
  __attribute__((amdgpu_flat_work_group_size(1, (max_threads)),                        \
                 amdgpu_waves_per_eu(::attnd::gpu::MinWavesPerSimd(                    \
                     (max_threads), (min_blocks), static_cast<int>(static_smem_bytes), \
                     ::attnd::gpu::WarpSize()))))
