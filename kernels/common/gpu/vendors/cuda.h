// CUDA side of the gpu:: runtime wrappers (included only through kernels/common/gpu/runtime.h).
#pragma once

#include <cuda_runtime.h>

namespace attnd::gpu {

using Stream = cudaStream_t;
using Event = cudaEvent_t;
using Error = cudaError_t;
using IpcMemHandle = cudaIpcMemHandle_t;
using IpcEventHandle = cudaIpcEventHandle_t;
using Graph = cudaGraph_t;
using GraphExec = cudaGraphExec_t;

inline constexpr Error kSuccess = cudaSuccess;
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
inline Error MemGetInfo(size_t* free_bytes, size_t* total) { return cudaMemGetInfo(free_bytes, total); }

}  // namespace attnd::gpu
