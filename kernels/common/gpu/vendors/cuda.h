// CUDA side of the gpu:: runtime wrappers (included only through kernels/common/gpu/runtime.h).
#pragma once

#include <cuda.h>  // driver API types only (CUresult, CUdeviceptr): never linked, see below
#include <cuda_runtime.h>

#include <cstring>
#include <string>

namespace attnd::gpu {

using Stream = cudaStream_t;
using Event = cudaEvent_t;
using Error = cudaError_t;
using IpcMemHandle = cudaIpcMemHandle_t;
using IpcEventHandle = cudaIpcEventHandle_t;
using Graph = cudaGraph_t;
using GraphExec = cudaGraphExec_t;
using DeviceProp = cudaDeviceProp;

inline constexpr Error kSuccess = cudaSuccess;
inline constexpr Error kErrorInvalidValue = cudaErrorInvalidValue;
inline constexpr const char* kVendorName = "cuda";

inline const char* ErrorString(Error e) { return cudaGetErrorString(e); }
inline Error GetLastError() { return cudaGetLastError(); }
inline Error GetDeviceCount(int* n) { return cudaGetDeviceCount(n); }
inline Error SetDevice(int d) { return cudaSetDevice(d); }
inline Error GetDevice(int* d) { return cudaGetDevice(d); }
inline Error Malloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
inline Error Free(void* p) { return cudaFree(p); }
inline Error MallocHost(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }
inline Error FreeHost(void* p) { return cudaFreeHost(p); }
inline Error HostRegister(void* p, size_t bytes) {
  return cudaHostRegister(p, bytes, cudaHostRegisterDefault);
}
inline Error HostUnregister(void* p) { return cudaHostUnregister(p); }
inline Error MemcpyH2DAsync(void* dst, const void* src, size_t n, Stream s) {
  return cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s);
}
inline Error MemcpyD2HAsync(void* dst, const void* src, size_t n, Stream s) {
  return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s);
}
inline Error MemcpyD2DAsync(void* dst, const void* src, size_t n, Stream s) {
  return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s);
}
inline Error MemsetAsync(void* p, int value, size_t n, Stream s) {
  return cudaMemsetAsync(p, value, n, s);
}
inline Error StreamCreate(Stream* s) { return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking); }
inline Error StreamDestroy(Stream s) { return cudaStreamDestroy(s); }
inline Error StreamSynchronize(Stream s) { return cudaStreamSynchronize(s); }
// fn(data) on a runtime thread once the stream's earlier work is done; the stream's later work
// waits for it to return. fn must not call the runtime.
inline Error LaunchHostFunc(Stream s, void (*fn)(void*), void* data) {
  return cudaLaunchHostFunc(s, fn, data);
}
inline Error StreamWaitEvent(Stream s, Event e) { return cudaStreamWaitEvent(s, e, 0); }
inline Error EventCreate(Event* e) { return cudaEventCreate(e); }
inline Error EventCreateInterprocess(Event* e) {
  return cudaEventCreateWithFlags(e, cudaEventDisableTiming | cudaEventInterprocess);
}
inline Error EventDestroy(Event e) { return cudaEventDestroy(e); }
inline Error EventRecord(Event e, Stream s) { return cudaEventRecord(e, s); }
inline Error EventSynchronize(Event e) { return cudaEventSynchronize(e); }
inline Error EventElapsedMs(float* ms, Event a, Event b) { return cudaEventElapsedTime(ms, a, b); }
inline Error IpcOpenMemHandle(void** p, IpcMemHandle h) {
  return cudaIpcOpenMemHandle(p, h, cudaIpcMemLazyEnablePeerAccess);
}
inline Error IpcCloseMemHandle(void* p) { return cudaIpcCloseMemHandle(p); }
inline Error IpcGetMemHandle(IpcMemHandle* h, void* p) { return cudaIpcGetMemHandle(h, p); }
inline Error IpcOpenEventHandle(Event* e, IpcEventHandle h) { return cudaIpcOpenEventHandle(e, h); }
inline Error IpcGetEventHandle(IpcEventHandle* h, Event e) { return cudaIpcGetEventHandle(h, e); }
inline Error MemGetInfo(size_t* free_bytes, size_t* total) {
  return cudaMemGetInfo(free_bytes, total);
}
// Launches `kernel` (a __global__ function's address) with its arguments' addresses in `args`.
inline Error LaunchKernel(const void* kernel, dim3 grid, dim3 block, void** args, size_t smem,
                          Stream s) {
  return cudaLaunchKernel(kernel, grid, block, args, smem, s);
}

// ---- Device facts (daemon runtime) ----
inline Error GetDeviceProperties(DeviceProp* p, int d) { return cudaGetDeviceProperties(p, d); }
// The 16 bytes nvidia-smi prints as GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
inline Error GetDeviceUuid(int d, unsigned char out[16]) {
  cudaDeviceProp p;
  const Error e = cudaGetDeviceProperties(&p, d);
  if (e == cudaSuccess) std::memcpy(out, p.uuid.bytes, 16);
  return e;
}
inline std::string ArchName(const DeviceProp& p) {
  return std::to_string(p.major) + "." + std::to_string(p.minor);
}
inline int MultiprocessorCount(const DeviceProp& p) { return p.multiProcessorCount; }
// Whether contexts created on device `d` are shared through an MPS server (the process is a
// client of a running nvidia-cuda-mps-control; docs/OPERATIONS.md "MPS").
inline Error DeviceUsesMps(int d, bool* on) {
  int v = 0;
  const Error e = cudaDeviceGetAttribute(&v, cudaDevAttrMpsEnabled, d);
  *on = e == cudaSuccess && v != 0;
  return e;
}
// Errors after which the device (its context in this process) is unusable: every later call
// fails too. Anything else is the one call's problem.
inline bool IsDeviceLost(Error e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorAssert:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoDevice:
    case cudaErrorContextIsDestroyed: return true;
    default: return false;
  }
}

// ---- Host memory visible to every device (staging, registered regions) ----
inline Error HostAllocPortable(void** p, size_t bytes) {
  return cudaHostAlloc(p, bytes, cudaHostAllocPortable);
}
inline Error HostRegisterPortable(void* p, size_t bytes) {
  return cudaHostRegister(p, bytes, cudaHostRegisterPortable);
}

// ---- Pointers ----
// The device ordinal of device memory `p` (an error for host or unregistered memory).
inline Error PointerDevice(const void* p, int* device) {
  cudaPointerAttributes a;
  const Error e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) return e;
  if (a.type != cudaMemoryTypeDevice) return cudaErrorInvalidValue;
  *device = a.device;
  return cudaSuccess;
}
// The driver function `name` (its CUDA 12.0 form), reached through the runtime's entry-point
// query so that attnd never links libcuda (a CUDA build still starts, on its CPU backend, without
// a driver); null, with the runtime's error cleared, when the driver does not offer it.
inline void* DriverEntryPoint(const char* name) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    static_cast<void>(cudaGetLastError());
    return nullptr;
  }
  return f;
}

// The allocation containing device pointer `p`: its base and size. The runtime has no such call;
// the driver's cuMemGetAddressRange comes through DriverEntryPoint. cudaErrorNotSupported when
// the driver does not offer it.
inline Error MemGetAddressRange(const void* p, void** base, size_t* size) {
  using Fn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static const Fn fn = reinterpret_cast<Fn>(DriverEntryPoint("cuMemGetAddressRange"));
  if (fn == nullptr) return cudaErrorNotSupported;
  CUdeviceptr b = 0;
  size_t s = 0;
  if (fn(&b, &s, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return cudaErrorInvalidValue;
  *base = reinterpret_cast<void*>(b);
  *size = s;
  return cudaSuccess;
}

// ---- Graphs (capture a stream's launches, instantiate, update, replay) ----
// Thread-local capture: other threads' runtime calls are unaffected while a stream captures.
inline Error StreamBeginCapture(Stream s) {
  return cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
}
inline Error StreamEndCapture(Stream s, Graph* g) { return cudaStreamEndCapture(s, g); }
inline Error GraphInstantiate(GraphExec* e, Graph g) { return cudaGraphInstantiate(e, g, 0); }
// Updates `e` in place to run `g` (same topology and kernels, new parameters); an error when the
// update is not possible (the caller then instantiates `g` afresh).
inline Error GraphExecUpdate(GraphExec e, Graph g) {
  cudaGraphExecUpdateResultInfo info;
  return cudaGraphExecUpdate(e, g, &info);
}
inline Error GraphLaunch(GraphExec e, Stream s) { return cudaGraphLaunch(e, s); }
inline Error GraphExecDestroy(GraphExec e) { return cudaGraphExecDestroy(e); }
inline Error GraphDestroy(Graph g) { return cudaGraphDestroy(g); }

}  // namespace attnd::gpu

// Kernel attribute: at most `max_threads` threads per block, registers bounded so that
// `min_blocks` blocks can be resident per SM. `static_smem_bytes` (the kernel's __shared__ bytes
// per block) is used on AMD only (vendors/hip.h, docs/HIP.md).
#define ATTND_LAUNCH_BOUNDS(max_threads, min_blocks, static_smem_bytes) \
  __launch_bounds__(max_threads, min_blocks)
