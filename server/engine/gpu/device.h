// One GPU the daemon serves (docs/SERVICE.md "GPU backend"): its description and UUID, the device
// memory pool reserved at start, a pool of streams (each with its timing events) that calls lease
// one at a time so that independent calls overlap, the graph runner and the ready-event cache.
//   ATTND_ASSIGN_OR_RETURN(auto device, GpuDevice::Create(0, options));
//   GpuDevice::StreamLease lease = device->AcquireStream();  // lease.stream(), lease.start() ...
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/common/gpu/vendor.h"
#include "server/engine/backend.h"
#include "server/engine/gpu/graph_runner.h"
#include "server/engine/gpu/ipc.h"
#include "server/engine/memory_pool.h"

namespace attnd::server::engine::gpu_rt {

class GpuDevice {
 public:
  struct Options {
    uint64_t pool_bytes = 8ull << 30;
    int streams = 4;
    bool graphs = true;
    size_t graph_capacity = 512;
    size_t event_capacity = 1024;
    std::function<void(const std::string&)> log;  // warnings (graph capture failures)
  };
  // Reads the device's properties, reserves its pool (RESOURCE_EXHAUSTED naming --pool-bytes
  // when the device cannot hold it) and creates its streams and events.
  static absl::StatusOr<std::unique_ptr<GpuDevice>> Create(int ordinal, const Options& options);
  ~GpuDevice();
  GpuDevice(const GpuDevice&) = delete;
  GpuDevice& operator=(const GpuDevice&) = delete;

  int ordinal() const { return ordinal_; }
  const std::string& uuid() const { return description_.uuid; }
  const DeviceDescription& description() const { return description_; }
  MemoryPool& pool() { return *pool_; }
  const MemoryPool& pool() const { return *pool_; }
  GraphRunner& graphs() { return *graphs_; }
  IpcEventCache& events() { return *events_; }
  // A valid device block (Arena::kAlignment bytes, never written) for zero-size tensors.
  void* empty_block() const { return empty_.data(); }

  // A stream (with its start/stop timing events) leased by one call; returned on destruction.
  class StreamLease {
   public:
    StreamLease(StreamLease&& other) noexcept;
    StreamLease(const StreamLease&) = delete;
    StreamLease& operator=(const StreamLease&) = delete;
    StreamLease& operator=(StreamLease&&) = delete;
    ~StreamLease();
    gpu::Stream stream() const;
    gpu::Event start() const;
    gpu::Event stop() const;

   private:
    friend class GpuDevice;
    StreamLease(GpuDevice* device, int index) : device_(device), index_(index) {}
    GpuDevice* device_;
    int index_;
  };
  // Blocks until a stream is free (more workers than streams wait here). Thread-safe.
  StreamLease AcquireStream() ABSL_LOCKS_EXCLUDED(mu_);

  // UNAVAILABLE once a device-lost error happened on this device (every later call on it fails
  // at once; restart the daemon), else OK. Thread-safe.
  absl::Status CheckUsable() const ABSL_LOCKS_EXCLUDED(mu_);
  void MarkLost(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Slot {
    gpu::Stream stream = nullptr;
    gpu::Event start = nullptr;
    gpu::Event stop = nullptr;
  };
  explicit GpuDevice(int ordinal) : ordinal_(ordinal) {}
  void Release(int index) ABSL_LOCKS_EXCLUDED(mu_);
  // The index of a free stream, or -1 when all are busy.
  int FreeSlot() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int ordinal_;
  DeviceDescription description_;
  std::unique_ptr<MemoryPool> pool_;
  PoolBlock empty_;
  std::unique_ptr<GraphRunner> graphs_;
  std::unique_ptr<IpcEventCache> events_;
  std::vector<Slot> slots_;  // fixed after Create

  mutable absl::Mutex mu_;
  absl::CondVar free_cv_;  // a stream was released
  std::vector<bool> busy_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> lost_{false};
  std::string lost_why_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnd::server::engine::gpu_rt
