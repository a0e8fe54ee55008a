#include "server/ops/tensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_details.h"

namespace attnd::server::ops {
namespace {

using kernels::DType;

bool Aligned(const void* p, DType dtype) {
  const auto size = static_cast<uintptr_t>(kernels::DTypeSize(dtype));
  return size <= 1 || reinterpret_cast<uintptr_t>(p) % size == 0;
}

absl::Status Truncated(absl::string_view name, const regions::Region& region) {
  return absl::FailedPreconditionError(absl::StrCat(
      name, ": region '", region.name(), "' lost pages: its shm object '", region.description().key,
      "' was truncated while registered (unregister the region and register it again)"));
}

// Copies the elements of strided view `t` into dense `dst` (rank 1..kMaxRank; the last dimension
// contiguous or not).
void GatherDense(const kernels::Tensor& t, char* dst) {
  const int64_t size = kernels::DTypeSize(t.dtype);
  const int last = t.rank - 1;
  const int64_t row_bytes = t.shape[last] * size;
  int64_t index[kernels::kMaxRank] = {};
  const char* base = static_cast<const char*>(t.data);
  for (;;) {
    int64_t offset = 0;
    for (int i = 0; i < last; ++i) offset += index[i] * t.strides[i];
    const char* src = base + offset * size;
    if (t.strides[last] == 1 || t.shape[last] <= 1) {
      std::memcpy(dst, src, static_cast<size_t>(row_bytes));
    } else {
      for (int64_t j = 0; j < t.shape[last]; ++j) {
        std::memcpy(dst + j * size, src + j * t.strides[last] * size, static_cast<size_t>(size));
      }
    }
    dst += row_bytes;
    int i = last - 1;
    for (; i >= 0; --i) {
      if (++index[i] < t.shape[i]) break;
      index[i] = 0;
    }
    if (i < 0) return;
  }
}

}  // namespace

absl::Status ToKernelDType(absl::string_view name, int proto_dtype, DType* dtype) {
  switch (proto_dtype) {
    case v1::DTYPE_F32: *dtype = DType::kF32; return absl::OkStatus();
    case v1::DTYPE_BF16: *dtype = DType::kBF16; return absl::OkStatus();
    case v1::DTYPE_FP8_E4M3: *dtype = DType::kFp8E4M3; return absl::OkStatus();
    case v1::DTYPE_I32: *dtype = DType::kI32; return absl::OkStatus();
    case v1::DTYPE_U8: *dtype = DType::kU8; return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": dtype ", proto_dtype, " is not a valid attnd.v1.DType"));
  }
}

v1::DType ToProtoDType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return v1::DTYPE_F32;
    case DType::kBF16: return v1::DTYPE_BF16;
    case DType::kFp8E4M3: return v1::DTYPE_FP8_E4M3;
    case DType::kI32: return v1::DTYPE_I32;
    case DType::kU8: return v1::DTYPE_U8;
    case DType::kInvalid: break;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::Status MakeLayout(absl::string_view name, DType dtype, const int64_t* shape, int rank,
                        const int64_t* strides, int strides_size, kernels::Tensor* t,
                        uint64_t* span_bytes) {
  if (rank < 1 || rank > kernels::kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": rank is ", rank, ", want 1..", kernels::kMaxRank));
  }
  if (strides_size != 0 && strides_size != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", strides_size, " strides for rank ", rank));
  }
  *t = kernels::Tensor();
  t->dtype = dtype;
  t->rank = rank;
  bool empty = false;
  for (int i = 0; i < rank; ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": dim ", i, " is ", shape[i], ", want >= 0"));
    }
    t->shape[i] = shape[i];
    empty |= shape[i] == 0;
  }
  if (strides_size == 0) {
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; --i) {
      t->strides[i] = stride;
      if (shape[i] > 0 && __builtin_mul_overflow(stride, shape[i], &stride)) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": size overflows int64"));
      }
    }
  } else {
    for (int i = 0; i < rank; ++i) {
      if (strides[i] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": stride of dim ", i, " is ", strides[i], ", want >= 0"));
      }
      t->strides[i] = strides[i];
    }
  }
  if (empty) {
    *span_bytes = 0;
    return absl::OkStatus();
  }
  int64_t span = 1;
  for (int i = 0; i < rank; ++i) {
    int64_t term;
    if (__builtin_mul_overflow(shape[i] - 1, t->strides[i], &term) ||
        __builtin_add_overflow(span, term, &span)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": span overflows int64"));
    }
  }
  int64_t bytes;
  if (__builtin_mul_overflow(span, kernels::DTypeSize(dtype), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": byte size overflows int64"));
  }
  *span_bytes = static_cast<uint64_t>(bytes);
  return absl::OkStatus();
}

absl::Status CheckSlice(absl::string_view name, absl::string_view region, uint64_t offset,
                        uint64_t span_bytes, uint64_t region_size) {
  uint64_t end;
  if (__builtin_add_overflow(offset, span_bytes, &end)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": offset ", offset, " + ", span_bytes,
                                                   " bytes overflows 64 bits (region '", region,
                                                   "')"));
  }
  if (end > region_size) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": bytes [", offset, ", ", end,
                                                   ") are past the end of region '", region, "' (",
                                                   region_size, " bytes)"));
  }
  return absl::OkStatus();
}

CallTensors::CallTensors(const regions::RegionRegistry* registry, uint64_t max_inline_bytes,
                         engine::CallMemory* memory)
    : registry_(registry), max_inline_bytes_(max_inline_bytes), memory_(memory) {}

absl::Status CallTensors::CheckRegions() const {
  for (const regions::RegionPin& pin : pins_) {
    if (pin->kind() == regions::RegionKind::kHost && pin->truncated()) {
      return Truncated("call", *pin.get());
    }
  }
  return absl::OkStatus();
}

absl::Status CallTensors::Snapshot(absl::string_view name, const regions::Region& region,
                                   kernels::Tensor* t, engine::TensorUse* use) {
  const uint64_t bytes =
      static_cast<uint64_t>(t->numel()) * static_cast<uint64_t>(kernels::DTypeSize(t->dtype));
  if (memory_ != nullptr) {
    if (absl::Status s =
            memory_->Reserve(bytes, absl::StrCat(name, ": snapshot of an index tensor"));
        !s.ok()) {
      return s;
    }
  }
  void* p = nullptr;
  if (bytes > 0) {
    p = Allocate(bytes);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(name, ": cannot copy ", bytes, " bytes"));
    }
    GatherDense(*t, static_cast<char*>(p));
  }
  // The copy itself may have met the object's new end (zero pages, sigbus_guard.h).
  if (region.truncated()) return Truncated(name, region);
  t->data = p;
  int64_t stride = 1;
  for (int i = t->rank - 1; i >= 0; --i) {
    t->strides[i] = stride;
    stride *= std::max<int64_t>(t->shape[i], 1);
  }
  use->residence = engine::Residence::kInline;
  use->host = p;
  use->span_bytes = bytes;
  use->pinned = false;
  snapshot_bytes_ += bytes;
  return absl::OkStatus();
}

void* CallTensors::Allocate(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (p != nullptr) buffers_.emplace_back(p);
  return p;
}

void CallTensors::AddUse(absl::string_view name, kernels::Role role, engine::Residence residence,
                         void* host, uint64_t span_bytes, bool zero_fill) {
  engine::TensorUse use;
  use.name = std::string(name);
  use.role = role;
  use.residence = residence;
  use.host = host;
  use.span_bytes = span_bytes;
  use.zero_fill = zero_fill;
  uses_.push_back(std::move(use));
}

absl::Status CallTensors::ResolveRegion(absl::string_view name, const v1::RegionSlice& slice,
                                        uint64_t span_bytes, DType dtype, void** data,
                                        engine::TensorUse* use) {
  if (registry_ == nullptr) return absl::FailedPreconditionError("no region registry");
  absl::StatusOr<regions::RegionPin> pin = registry_->Acquire(owner_, slice.region());
  if (!pin.ok()) {
    return kernels::WithPrefix(pin.status(), absl::StrCat(name, ": "));  // keeps ResourceInfo
  }
  const regions::Region* region = pin->get();
  absl::Status s =
      CheckSlice(name, slice.region(), slice.offset(), span_bytes, region->byte_size());
  if (!s.ok()) return s;
  if (region->kind() == regions::RegionKind::kHost && region->truncated()) {
    return Truncated(name, *region);
  }
  const bool on_device = region->kind() == regions::RegionKind::kDevice;
  char* base = on_device ? region->device_data() : region->data();
  if (base == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        name, ": region '", slice.region(), "' is a device region; this backend cannot open it"));
  }
  char* p = base + slice.offset();
  if (!Aligned(p, dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": region '", slice.region(), "' offset ", slice.offset(), " is not aligned to ",
        kernels::DTypeSize(dtype), " bytes (", kernels::DTypeName(dtype), ")"));
  }
  *data = p;
  use->name = std::string(name);
  use->span_bytes = span_bytes;
  if (on_device) {
    use->residence = engine::Residence::kDeviceRegion;
    use->device = p;
    use->device_ordinal = region->device_ordinal();
    use->device_uuid = region->description().device_uuid;
  } else {
    use->residence = engine::Residence::kHostRegion;
    use->host = p;
    use->pinned = region->pinned();
  }
  pins_.push_back(*std::move(pin));
  return absl::OkStatus();
}

absl::Status CallTensors::Input(absl::string_view name, const v1::Tensor* t, kernels::Tensor* out) {
  *out = kernels::Tensor();
  if (t == nullptr) return absl::OkStatus();
  DType dtype;
  if (absl::Status s = ToKernelDType(name, t->dtype(), &dtype); !s.ok()) return s;
  uint64_t span = 0;
  if (absl::Status s = MakeLayout(name, dtype, t->shape().data(), t->shape_size(),
                                  t->strides().data(), t->strides_size(), out, &span);
      !s.ok()) {
    return s;
  }
  switch (t->data_case()) {
    case v1::Tensor::kInlineData: {
      const std::string& bytes = t->inline_data();
      if (bytes.size() != span) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": inline_data is ", bytes.size(), " bytes, want ", span));
      }
      copied_in_ += span;
      if (span == 0) {
        AddUse(name, kernels::Role::kInput, engine::Residence::kInline, nullptr, 0, false);
        return absl::OkStatus();
      }
      if (Aligned(bytes.data(), dtype)) {
        // Read in place from the request (kernels never write inputs).
        out->data = const_cast<char*>(bytes.data());
      } else {
        if (memory_ != nullptr) {
          if (absl::Status s = memory_->Reserve(span, absl::StrCat(name, ": aligned copy"));
              !s.ok()) {
            return s;
          }
        }
        void* p = Allocate(span);
        if (p == nullptr) {
          return absl::ResourceExhaustedError(
              absl::StrCat(name, ": cannot stage ", span, " bytes"));
        }
        std::memcpy(p, bytes.data(), span);
        out->data = p;
      }
      AddUse(name, kernels::Role::kInput, engine::Residence::kInline, out->data, span, false);
      return absl::OkStatus();
    }
    case v1::Tensor::kRegion: {
      engine::TensorUse use;
      use.role = kernels::Role::kInput;
      absl::Status s = ResolveRegion(name, t->region(), span, dtype, &out->data, &use);
      if (!s.ok()) return s;
      if (use.residence == engine::Residence::kHostRegion && dtype == DType::kI32) {
        s = Snapshot(name, *pins_.back().get(), out, &use);
        if (!s.ok()) return s;
      }
      uses_.push_back(std::move(use));
      return absl::OkStatus();
    }
    case v1::Tensor::DATA_NOT_SET:
      if (span == 0) {
        AddUse(name, kernels::Role::kInput, engine::Residence::kInline, nullptr, 0, false);
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": no data (set inline_data or region)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(name, ": unknown data kind"));
}

absl::Status CallTensors::Output(absl::string_view name, const v1::Tensor* placement,
                                 const OutputSpec& spec, v1::Tensor* reply, kernels::Tensor* out) {
  *out = kernels::Tensor();
  if (placement == nullptr && !spec.produce_when_absent) return absl::OkStatus();
  DType dtype = spec.dtype;
  if (placement != nullptr && placement->dtype() != v1::DTYPE_UNSPECIFIED) {
    if (absl::Status s = ToKernelDType(name, placement->dtype(), &dtype); !s.ok()) return s;
  }
  const bool given_shape = placement != nullptr && placement->shape_size() > 0;
  const int64_t* shape = given_shape ? placement->shape().data() : spec.shape.data();
  const int rank = given_shape ? placement->shape_size() : static_cast<int>(spec.shape.size());
  const int strides_size = placement != nullptr ? placement->strides_size() : 0;
  const int64_t* strides = strides_size > 0 ? placement->strides().data() : nullptr;
  if (dtype == DType::kInvalid) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": dtype is not given"));
  }
  uint64_t span = 0;
  if (absl::Status s = MakeLayout(name, dtype, shape, rank, strides, strides_size, out, &span);
      !s.ok()) {
    return s;
  }
  reply->Clear();
  reply->set_dtype(ToProtoDType(dtype));
  for (int i = 0; i < rank; ++i) reply->add_shape(shape[i]);
  for (int i = 0; i < strides_size; ++i) reply->add_strides(strides[i]);
  if (placement != nullptr && placement->has_region()) {
    *reply->mutable_region() = placement->region();
    engine::TensorUse use;
    use.role = kernels::Role::kOutput;
    absl::Status s = ResolveRegion(name, placement->region(), span, dtype, &out->data, &use);
    if (s.ok()) uses_.push_back(std::move(use));
    return s;
  }
  if (placement != nullptr && placement->data_case() == v1::Tensor::kInlineData) {
    return absl::InvalidArgumentError(absl::StrCat(
        name,
        ": an output placement carries no inline_data (give a region, or no data to get "
        "the output inline)"));
  }
  if (span > max_inline_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": inline output of ", span, " bytes exceeds the ", max_inline_bytes_,
                     "-byte message limit (--max-message-bytes); place it in a region"));
  }
  if (span > max_inline_bytes_ - inline_out_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": inline output of ", span, " bytes takes the call's inline outputs to ",
        inline_out_bytes_ + span, " bytes, past the ", max_inline_bytes_,
        "-byte message limit of one reply (--max-message-bytes); place outputs in a region"));
  }
  // Reserved before anything is allocated; an aligned copy, when needed, takes as much again.
  if (memory_ != nullptr) {
    if (absl::Status s = memory_->Reserve(span, absl::StrCat(name, ": inline output")); !s.ok()) {
      return s;
    }
  }
  inline_out_bytes_ += span;
  std::string* data = reply->mutable_inline_data();
  data->resize(span);
  copied_out_ += span;
  if (span == 0) {
    AddUse(name, kernels::Role::kOutput, engine::Residence::kInline, nullptr, 0, true);
    return absl::OkStatus();
  }
  if (Aligned(data->data(), dtype)) {
    out->data = data->data();
  } else {
    if (memory_ != nullptr) {
      if (absl::Status s = memory_->Reserve(span, absl::StrCat(name, ": aligned copy")); !s.ok()) {
        return s;
      }
    }
    void* p = Allocate(span);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(name, ": cannot stage ", span, " bytes"));
    }
    std::memset(p, 0, span);
    staged_.push_back({p, data, span});
    out->data = p;
  }
  AddUse(name, kernels::Role::kOutput, engine::Residence::kInline, out->data, span, true);
  return absl::OkStatus();
}

void CallTensors::FinishOutputs() {
  for (const Staged& s : staged_) std::memcpy(s.to->data(), s.from, s.bytes);
  staged_.clear();
}

}  // namespace attnd::server::ops
