#include "server/ops/op_handler.h"

#include "google/protobuf/descriptor.h"

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
