// Tensor resolution (docs/SERVICE.md "Tensors"): a request's attnd.v1.Tensor becomes a
// kernels::Tensor view. Inputs are read in place from a region or from the request's own bytes;
// outputs are written in place into a region or into the reply's inline_data. Every size and offset
// is checked with overflow-safe arithmetic; bytes copied are counted (zero for region tensors).
// Index tensors (i32) in a host region are snapshotted into private memory, and every host byte a
// call allocates is reserved from its CallMemory first (docs/SERVICE.md "Trust model").
//   CallTensors tensors(&registry, max_inline_bytes, &memory);
//   ATTND_RETURN_IF_ERROR(tensors.Input("q", &request.q(), &params.q));
//   ATTND_RETURN_IF_ERROR(tensors.Output("out", placement, spec, reply.mutable_out(),
//   &params.out));
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "attnd/v1/attention.pb.h"
#include "kernels/common/tensor.h"
#include "server/engine/call_memory.h"
#include "server/engine/op_call.h"
#include "server/regions/registry.h"

namespace attnd::server::ops {

// What the server assumes for an output the request leaves (partly) unspecified.
struct OutputSpec {
  bool produce_when_absent = true;  // false: an optional output, computed only when placed
  kernels::DType dtype = kernels::DType::kInvalid;
  std::vector<int64_t> shape;
};

// The kernels dtype of a proto dtype, or INVALID_ARGUMENT naming `name`.
absl::Status ToKernelDType(absl::string_view name, int proto_dtype, kernels::DType* dtype);
v1::DType ToProtoDType(kernels::DType dtype);

// Fills t's dtype/rank/shape/strides from a request layout (strides empty = dense) and returns
// the byte span from the first to one past the last addressed element. INVALID_ARGUMENT for a
// rank outside [1, kMaxRank], negative dims or strides, a strides/shape length mismatch, or a
// span that overflows int64. Data pointer left null.
absl::Status MakeLayout(absl::string_view name, kernels::DType dtype, const int64_t* shape,
                        int rank, const int64_t* strides, int strides_size, kernels::Tensor* t,
                        uint64_t* span_bytes);

// Checks that [offset, offset + span_bytes) lies inside a region of region_size bytes without
// overflowing 64 bits; INVALID_ARGUMENT naming the tensor, the region and the values.
absl::Status CheckSlice(absl::string_view name, absl::string_view region, uint64_t offset,
                        uint64_t span_bytes, uint64_t region_size);

// Owns everything the resolved tensors of one call point into: region pins, staging buffers and
// index snapshots. Not thread-safe; one per call. The request and reply messages must outlive it.
class CallTensors {
 public:
  // `registry` (not owned) resolves region slices; `max_inline_bytes` caps the inline outputs of
  // the call (each, and all together: they travel in one reply). `memory` (not owned, may be
  // null: no budget) receives a reservation for every host buffer before it is allocated:
  // inline outputs, aligned copies, index snapshots; RESOURCE_EXHAUSTED when it does not fit.
  CallTensors(const regions::RegionRegistry* registry, uint64_t max_inline_bytes,
              engine::CallMemory* memory = nullptr);
  CallTensors(const CallTensors&) = delete;
  CallTensors& operator=(const CallTensors&) = delete;

  // The owner whose regions the call may use (RegionRegistry::Acquire); set before the first
  // Input or Output. Default: the registry's unnamed namespace.
  void set_owner(std::string owner) { owner_ = std::move(owner); }

  // Resolves an input. `t` null means the field is absent (the view stays absent, rank 0). An
  // i32 input (indices, CSR indptr, cu_seqlens, block tables, lengths, windows: the data that
  // steers addressing) in a host region is copied into a private dense buffer at once: the op's
  // Validate, its kernels and its work count all read that snapshot, never the client's memory
  // again, so a client changing it meanwhile cannot make them disagree.
  absl::Status Input(absl::string_view name, const v1::Tensor* t, kernels::Tensor* out);

  // Resolves an output. `placement` null means absent in the request: with
  // spec.produce_when_absent the output is returned inline with spec's dtype and dense shape,
  // else it stays absent. A placement may leave dtype / shape empty (spec's are used), give
  // strides, and hold a region (written in place) or no data (returned inline). `reply` is the
  // reply's field for this output; it receives the layout and, for inline outputs, the data.
  absl::Status Output(absl::string_view name, const v1::Tensor* placement, const OutputSpec& spec,
                      v1::Tensor* reply, kernels::Tensor* out);

  // After the op ran: copies staged (misaligned) inline outputs into their replies.
  void FinishOutputs();

  // FAILED_PRECONDITION when a host region the call uses was truncated by its owner while the call
  // held it (an access got zero pages instead of the object's: the call's inputs or outputs are
  // not what the client meant). Call after the op ran, before its result is trusted.
  absl::Status CheckRegions() const;

  uint64_t copied_in() const { return copied_in_; }
  uint64_t copied_out() const { return copied_out_; }
  // Bytes of index tensors copied out of host regions (not request bytes: not in copied_in).
  uint64_t snapshot_bytes() const { return snapshot_bytes_; }

  // Where each resolved (present) tensor lives, in resolution order (inputs, then outputs), for
  // the backend. A device-region tensor's view points at device memory: host code never reads it.
  const std::vector<engine::TensorUse>& uses() const { return uses_; }
  std::vector<engine::TensorUse>& mutable_uses() { return uses_; }

 private:
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  struct Staged {
    const void* from;
    std::string* to;
    size_t bytes;
  };
  // Resolves a region slice into *use (residence, pointers, device) and *data.
  absl::Status ResolveRegion(absl::string_view name, const v1::RegionSlice& slice,
                             uint64_t span_bytes, kernels::DType dtype, void** data,
                             engine::TensorUse* use);
  void AddUse(absl::string_view name, kernels::Role role, engine::Residence residence, void* host,
              uint64_t span_bytes, bool zero_fill);
  // Copies the elements of `t` (in host region `region`) into a dense private buffer and points
  // `t` and `use` at it.
  absl::Status Snapshot(absl::string_view name, const regions::Region& region, kernels::Tensor* t,
                        engine::TensorUse* use);
  void* Allocate(size_t bytes);

  const regions::RegionRegistry* const registry_;
  std::string owner_;
  const uint64_t max_inline_bytes_;
  engine::CallMemory* const memory_;
  uint64_t inline_out_bytes_ = 0;
  uint64_t snapshot_bytes_ = 0;
  std::vector<regions::RegionPin> pins_;
  std::vector<std::unique_ptr<void, FreeDeleter>> buffers_;
  std::vector<Staged> staged_;
  std::vector<engine::TensorUse> uses_;
  uint64_t copied_in_ = 0;
  uint64_t copied_out_ = 0;
};

}  // namespace attnd::server::ops
