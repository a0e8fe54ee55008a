// HIP side of the gpu:: runtime wrappers (included only through kernels/common/gpu/runtime.h).
#pragma once

#include <hip/hip_runtime.h>

namespace attnd::gpu {

using Stream = hipStream_t;
using Event = hipEvent_t;
using Error = hipError_t;
using IpcMemHandle = hipIpcMemHandle_t;
using IpcEventHandle = hipIpcEventHandle_t;
using Graph = hipGraph_t;
using GraphExec = hipGraphExec_t;

inline constexpr Error kSuccess = hipSuccess;
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
inline Error MemGetInfo(size_t* free_bytes, size_t* total) { return hipMemGetInfo(free_bytes, total); }

}  // namespace attnd::gpu
