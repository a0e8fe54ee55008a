#include "server/ops/op_handler.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "kernels/common/status_details.h"
#include "server/regions/registry.h"

namespace attnd::server::ops {
namespace {

const google::protobuf::FieldDescriptor* TensorField(const google::protobuf::Message& m,
                                                     absl::string_view name) {
  const google::protobuf::FieldDescriptor* f =
      m.GetDescriptor()->FindFieldByName(std::string(name));
  if (f == nullptr || f->is_repeated() ||
      f->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE ||
      f->message_type() != v1::Tensor::descriptor()) {
    return nullptr;
  }
  return f;
}

// Numbered alike, so CacheLayoutFromProto is a cast.
static_assert(static_cast<int>(kernels::CacheLayout::kBf16_576) == v1::CACHE_LAYOUT_BF16_576);
static_assert(static_cast<int>(kernels::CacheLayout::kBf16_512) == v1::CACHE_LAYOUT_BF16_512);
static_assert(static_cast<int>(kernels::CacheLayout::kFlashMlaFp8_656) ==
              v1::CACHE_LAYOUT_FLASHMLA_FP8_656);
static_assert(static_cast<int>(kernels::CacheLayout::kIndexerFp8Blocks) ==
              v1::CACHE_LAYOUT_INDEXER_FP8_BLOCKS);
static_assert(static_cast<int>(kernels::CacheLayout::kFp8_576PerTensor) ==
              v1::CACHE_LAYOUT_FP8_576_PER_TENSOR);
static_assert(static_cast<int>(kernels::CacheLayout::kFp8_512PerTensor) ==
              v1::CACHE_LAYOUT_FP8_512_PER_TENSOR);
static_assert(static_cast<int>(kernels::CacheLayout::kIndexerAiterShuffle16) ==
              v1::CACHE_LAYOUT_INDEXER_AITER_SHUFFLE_16);
static_assert(kernels::kMaxCacheLayout == v1::CacheLayout_MAX);

}  // namespace

const char* OpName(OpId id) {
  switch (id) {
    case OpId::kIndexerLogits: return "indexer_logits";
    case OpId::kIndexerLogitsPaged: return "indexer_logits_paged";
    case OpId::kTopK: return "topk";
    case OpId::kSparseMla: return "sparse_mla";
    case OpId::kMlaDecode: return "mla_decode";
    case OpId::kMlaPrefill: return "mla_prefill";
    case OpId::kDsaAttention: return "dsa_attention";
  }
  return "unknown";
}

const char* OpRpc(OpId id) {
  switch (id) {
    case OpId::kIndexerLogits: return "IndexerLogits";
    case OpId::kIndexerLogitsPaged: return "IndexerLogitsPaged";
    case OpId::kTopK: return "TopK";
    case OpId::kSparseMla: return "SparseMla";
    case OpId::kMlaDecode: return "MlaDecode";
    case OpId::kMlaPrefill: return "MlaPrefill";
    case OpId::kDsaAttention: return "DsaAttention";
  }
  return "Unknown";
}

const v1::Tensor* FindTensor(const google::protobuf::Message& m, absl::string_view name) {
  const google::protobuf::FieldDescriptor* f = TensorField(m, name);
  if (f == nullptr) return nullptr;
  const google::protobuf::Reflection* r = m.GetReflection();
  if (!r->HasField(m, f)) return nullptr;
  return static_cast<const v1::Tensor*>(&r->GetMessage(m, f));
}

v1::Tensor* MutableTensor(google::protobuf::Message* m, absl::string_view name) {
  const google::protobuf::FieldDescriptor* f = TensorField(*m, name);
  if (f == nullptr) return nullptr;
  return static_cast<v1::Tensor*>(m->GetReflection()->MutableMessage(m, f));
}

v1::CallStats* MutableStats(google::protobuf::Message* m) {
  const google::protobuf::FieldDescriptor* f = m->GetDescriptor()->FindFieldByName("stats");
  if (f == nullptr || f->message_type() != v1::CallStats::descriptor()) return nullptr;
  return static_cast<v1::CallStats*>(m->GetReflection()->MutableMessage(m, f));
}

absl::Status ReadCallOptions(const google::protobuf::Message& request, std::string* ready_event,
                             std::string* device_uuid) {
  const google::protobuf::Descriptor* d = request.GetDescriptor();
  const google::protobuf::Reflection* r = request.GetReflection();
  ready_event->clear();
  device_uuid->clear();
  if (const auto* f = d->FindFieldByName("ready_event");
      f != nullptr && f->type() == google::protobuf::FieldDescriptor::TYPE_BYTES &&
      !f->is_repeated()) {
    *ready_event = r->GetString(request, f);
    if (!ready_event->empty() && ready_event->size() != regions::kDeviceHandleBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("ready_event: is ", ready_event->size(), " bytes, want exactly ",
                       regions::kDeviceHandleBytes, " (an IPC event handle) or none"));
    }
  }
  if (const auto* f = d->FindFieldByName("device_uuid");
      f != nullptr && f->type() == google::protobuf::FieldDescriptor::TYPE_STRING &&
      !f->is_repeated()) {
    *device_uuid = r->GetString(request, f);
  }
  return absl::OkStatus();
}

absl::Status PrecisionFromProto(int value, kernels::Precision* out, kernels::Precision unspecified,
                                absl::string_view field) {
  switch (value) {
    case v1::PRECISION_UNSPECIFIED: *out = unspecified; return absl::OkStatus();
    case v1::PRECISION_FAST: *out = kernels::Precision::kFast; return absl::OkStatus();
    case v1::PRECISION_HIGH: *out = kernels::Precision::kHigh; return absl::OkStatus();
    default: break;
  }
  return kernels::InvalidField(
      field, absl::StrCat(field, ": is ", value,
                          ", want PRECISION_FAST (1), PRECISION_HIGH (2) or unspecified (0)"));
}

v1::Precision PrecisionToProto(kernels::Precision p) {
  return p == kernels::Precision::kHigh ? v1::PRECISION_HIGH : v1::PRECISION_FAST;
}

void AppendScalarKey(const google::protobuf::Message& request, std::string* key) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = request.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(request, &fields);  // set fields, by number
  for (const FieldDescriptor* f : fields) {
    if (f->is_repeated()) continue;  // op requests have no repeated scalars
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) continue;  // tensors: by layout
    if (f->name() == "ready_event" || f->name() == "device_uuid") continue;
    absl::StrAppend(key, "|#", f->number(), "=");
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: absl::StrAppend(key, r->GetInt32(request, f)); break;
      case FieldDescriptor::CPPTYPE_INT64: absl::StrAppend(key, r->GetInt64(request, f)); break;
      case FieldDescriptor::CPPTYPE_UINT32: absl::StrAppend(key, r->GetUInt32(request, f)); break;
      case FieldDescriptor::CPPTYPE_UINT64: absl::StrAppend(key, r->GetUInt64(request, f)); break;
      case FieldDescriptor::CPPTYPE_BOOL: absl::StrAppend(key, r->GetBool(request, f)); break;
      case FieldDescriptor::CPPTYPE_ENUM: absl::StrAppend(key, r->GetEnumValue(request, f)); break;
      case FieldDescriptor::CPPTYPE_FLOAT: {
        const float v = r->GetFloat(request, f);
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof(bits));
        absl::StrAppend(key, "f", bits);
        break;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        const double v = r->GetDouble(request, f);
        uint64_t bits;
        std::memcpy(&bits, &v, sizeof(bits));
        absl::StrAppend(key, "d", bits);
        break;
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        const std::string v = r->GetString(request, f);
        absl::StrAppend(key, v.size(), ":", v);
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE: break;
    }
  }
}

void AppendTensorKey(absl::string_view name, const kernels::Tensor& t, std::string* key) {
  absl::StrAppend(key, "|", name, ":", static_cast<int>(t.dtype), "[");
  for (int i = 0; i < t.rank; ++i) absl::StrAppend(key, i ? "," : "", t.shape[i]);
  absl::StrAppend(key, "/");
  for (int i = 0; i < t.rank; ++i) absl::StrAppend(key, i ? "," : "", t.strides[i]);
  absl::StrAppend(key, "]");
}

OpTable::OpTable() {
  handlers_[static_cast<int>(OpId::kIndexerLogits)] = MakeIndexerLogitsHandler();
  handlers_[static_cast<int>(OpId::kIndexerLogitsPaged)] = MakeIndexerLogitsPagedHandler();
  handlers_[static_cast<int>(OpId::kTopK)] = MakeTopKHandler();
  handlers_[static_cast<int>(OpId::kSparseMla)] = MakeSparseMlaHandler();
  handlers_[static_cast<int>(OpId::kMlaDecode)] = MakeMlaDecodeHandler();
  handlers_[static_cast<int>(OpId::kMlaPrefill)] = MakeMlaPrefillHandler();
  handlers_[static_cast<int>(OpId::kDsaAttention)] = MakeDsaAttentionHandler();
}

}  // namespace attnd::server::ops
