// One operator call as a backend sees it (docs/SERVICE.md "GPU backend"): where each of its tensors
// lives (inline in the request or reply, in a host region, in a device region), and the op bound to
// whatever pointers the backend chooses. The ops layer (server/ops) implements it per op; the CPU
// backend runs it on the host pointers, a GPU backend stages host tensors into its device pool,
// binds device regions in place and launches (or replays a captured graph). No gRPC here.
//   std::vector<void*> data = ...;  // one device pointer per call.tensors()[i]
//   ATTND_RETURN_IF_ERROR(call.Select(ctx, data, &impl, &workspace_bytes));
//   ATTND_RETURN_IF_ERROR(call.Run(ctx, data, &impl));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/common/registry.h"
#include "kernels/common/tensor.h"

namespace attnd::server::engine {

enum class Residence {
  kInline,        // bytes in the request (inputs) or the reply (outputs), in this process
  kHostRegion,    // a registered POSIX shm region mapped into this process
  kDeviceRegion,  // a registered GPU IPC region: device memory, never touched by the host
};

// One present tensor of a call.
struct TensorUse {
  std::string name;  // the params name ("q", "out")
  kernels::Role role = kernels::Role::kInput;
  Residence residence = Residence::kInline;
  // kInline / kHostRegion: the tensor's first addressed byte in this process.
  void* host = nullptr;
  // kDeviceRegion: its first addressed byte in this process's mapping of the region.
  void* device = nullptr;
  int device_ordinal = -1;  // kDeviceRegion: the region's device (this process's ordinal)
  std::string device_uuid;  // kDeviceRegion: the same device by UUID
  uint64_t span_bytes = 0;  // first to one past the last addressed byte
  bool pinned = false;      // kHostRegion: registered with the GPU runtime (DMA-able)
  // Inline outputs: zeroed before the op (elements it leaves untouched come back 0).
  bool zero_fill = false;
  // kDeviceRegion tensors the op's work count reads: span_bytes of host memory the backend fills
  // with the tensor's bytes after the op (null: not needed).
  void* readback = nullptr;
};

class OpCall {
 public:
  virtual ~OpCall() = default;

  virtual absl::string_view op() const = 0;  // "sparse_mla"
  // The call's present tensors (inputs then outputs). The backend reads them; it writes only the
  // memory they describe (outputs, readback buffers).
  virtual const std::vector<TensorUse>& tensors() const = 0;
  // An optional cudaIpcEventHandle_t / hipIpcEventHandle_t (exactly 64 bytes, checked) the caller
  // recorded after producing its inputs: the backend waits for it on its stream before the op.
  virtual const std::string& ready_event() const = 0;
  // The device an inline-only call asks for (a UUID; empty: the backend chooses).
  virtual const std::string& device_uuid() const = 0;
  // Everything that determines the op's launch sequence except pointers: op, dtypes, shapes,
  // strides, presence of optional tensors, scalar options. Stable for equal calls.
  virtual std::string LaunchKey() const = 0;

  // With tensors()[i] bound to data[i] (same size as tensors()): the implementation dispatch
  // would pick in `ctx` and the workspace bytes it needs. UNIMPLEMENTED naming every refusal when
  // none fits. Reads no tensor data.
  virtual absl::Status Select(const kernels::ExecContext& ctx, const std::vector<void*>& data,
                              std::string* impl, int64_t* workspace_bytes) = 0;
  // Validates and runs the op in `ctx` with tensors()[i] bound to data[i]. On a GPU it only
  // enqueues work on ctx.stream (capture-safe: no allocation, no synchronisation).
  virtual absl::Status Run(const kernels::ExecContext& ctx, const std::vector<void*>& data,
                           std::string* impl) = 0;

  // The host pointers of the call's tensors (tensors()[i].host, or .device for device regions).
  std::vector<void*> HostData() const {
    std::vector<void*> data;
    for (const TensorUse& t : tensors()) {
      data.push_back(t.residence == Residence::kDeviceRegion ? t.device : t.host);
    }
    return data;
  }
  bool HasDeviceTensors() const {
    for (const TensorUse& t : tensors()) {
      if (t.residence == Residence::kDeviceRegion) return true;
    }
    return false;
  }
};

}  // namespace attnd::server::engine
