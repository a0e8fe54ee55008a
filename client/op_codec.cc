#include "client/op_codec.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"

namespace attnd::client {
namespace {

const google::protobuf::FieldDescriptor* TensorField(const google::protobuf::Message& m,
                                                     const char* name) {
  const google::protobuf::FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(name);
  if (f == nullptr || f->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE ||
      f->message_type() != v1::Tensor::descriptor() || f->is_repeated()) {
    return nullptr;
  }
  return f;
}

}  // namespace

absl::Status EncodeTensorField(const char* name, const kernels::Tensor& t, kernels::Role role,
                               const RegionTable* table, bool inline_only,
                               google::protobuf::Message* request) {
  if (!t.present()) return absl::OkStatus();
  const google::protobuf::FieldDescriptor* f = TensorField(*request, name);
  if (f == nullptr) {
    return absl::InternalError(
        absl::StrCat(request->GetDescriptor()->name(), " has no Tensor field '", name, "'"));
  }
  auto* out = static_cast<v1::Tensor*>(request->GetReflection()->MutableMessage(request, f));
  absl::StatusOr<uint64_t> span = SpanBytesOf(t, name);
  if (!span.ok()) return span.status();
  std::optional<RegionTable::Hit> hit;
  if (!inline_only && table != nullptr && t.data != nullptr) hit = table->Find(t.data, *span);
  if (hit) {
    EncodeRegion(t, hit->region, hit->offset, out);
    return absl::OkStatus();
  }
  if (role == kernels::Role::kOutput) {
    SetLayout(t, out);  // no data: the server returns it inline
    return absl::OkStatus();
  }
  return EncodeInline(t, name, out);
}

absl::Status ApplyTensorField(const char* name, const kernels::Tensor& t, kernels::Role role,
                              const google::protobuf::Message& response, CallResult* result) {
  if (role != kernels::Role::kOutput) return absl::OkStatus();
  const google::protobuf::FieldDescriptor* f = TensorField(response, name);
  if (f == nullptr) {
    return absl::InternalError(
        absl::StrCat(response.GetDescriptor()->name(), " has no Tensor field '", name, "'"));
  }
  const google::protobuf::Reflection* r = response.GetReflection();
  const bool wanted = t.present() && t.data != nullptr;
  if (!r->HasField(response, f)) {
    // An output placed in a host buffer must come back; absent ones may be omitted (optional).
    if (wanted) {
      return absl::DataLossError(absl::StrCat("reply carries no '", name, "'"));
    }
    return absl::OkStatus();
  }
  const auto& reply = static_cast<const v1::Tensor&>(r->GetMessage(response, f));
  switch (reply.data_case()) {
    case v1::Tensor::kRegion: return absl::OkStatus();  // written in place by the server
    case v1::Tensor::kInlineData:
      if (wanted) return CopyInlineInto(reply, name, t);
      {
        absl::StatusOr<HostArray> a = DecodeInline(reply, name);
        if (!a.ok()) return a.status();
        result->returned[name] = *std::move(a);
      }
      return absl::OkStatus();
    case v1::Tensor::DATA_NOT_SET: break;
  }
  // No data: an empty output (span 0) is fine, anything else is a broken reply.
  uint64_t span = 0;
  absl::StatusOr<kernels::Tensor> layout = LayoutOf(reply, name, &span);
  if (layout.ok() && span == 0) {
    if (!wanted) result->returned[name] = HostArray::CopyOf(*layout);
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrCat("reply's '", name, "' carries no data"));
}

}  // namespace attnd::client
