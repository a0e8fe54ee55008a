#include "fuzz/env.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <sys/mman.h>

#include "google/protobuf/io/coded_stream.h"
#include "server/common/log.h"

namespace attnd::fuzz {
namespace {

using server::ops::OpId;

[[noreturn]] void Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "fuzz: %s: %s\n", what, s.ToString().c_str());
  std::abort();
}

void MustOk(const absl::Status& s, const char* what) {
  if (!s.ok()) Fail(what, s);
}

// The environment is never destroyed, so its shm objects' names go at exit (a normal end of a
// fuzzing run; a crash leaves them, with the finding).
void UnlinkShmObjects() {
  const FuzzEnv& env = FuzzEnv::Get();
  for (int i = 0; i < FuzzEnv::kShmObjects; ++i) shm_unlink(env.shm_key(i).c_str());
}

}  // namespace

FuzzEnv& FuzzEnv::Get() {
  static FuzzEnv* env = new FuzzEnv();
  return *env;
}

FuzzEnv::FuzzEnv() {
  // Refusals are the common case here: only errors are worth a line.
  server::SetMinLogLevel(server::LogLevel::kError);
  const int64_t sizes[kShmObjects] = {256 << 10, 4096, 5000};
  for (int i = 0; i < kShmObjects; ++i) {
    shm_[i] = std::make_unique<testing::ScopedShm>(sizes[i]);
    if (!shm_[i]->ok()) MustOk(absl::InternalError("cannot create a shm object"), "setup");
    // Non-zero, so that an op reading a region sees data.
    pristine_[i].resize(sizes[i]);
    for (int64_t b = 0; b < sizes[i]; ++b) pristine_[i][b] = static_cast<char>(b * 37 + 11);
  }
  ResetShm();
  std::atexit(UnlinkShmObjects);
  opener_ = std::make_shared<server::testing::FakeDeviceOpener>(kDeviceBytes);
  op_registry_ = NewRegistry();
  server::regions::HostRegionSpec h;
  h.name = "h";
  h.key = shm_key(0);
  h.byte_size = 256 << 10;
  MustOk(op_registry_->RegisterHost(h), "register h");
  h.name = "g";
  h.offset = 4099;
  h.byte_size = 1000;
  MustOk(op_registry_->RegisterHost(h), "register g");
  server::regions::DeviceRegionSpec d;
  d.name = "d";
  d.raw_handle = std::string(server::regions::kDeviceHandleBytes, 'd');
  d.byte_size = kDeviceBytes;
  MustOk(op_registry_->RegisterDevice(d), "register d");
}

std::unique_ptr<server::regions::RegionRegistry> FuzzEnv::NewRegistry() const {
  server::regions::RegionRegistry::Options o;
  o.allow_client_shm = true;
  o.device_opener = opener_;
  o.max_regions = 16;
  return std::make_unique<server::regions::RegionRegistry>(std::move(o));
}

int FuzzEnv::ShmIndex(const std::string& key) const {
  for (int i = 0; i < kShmObjects; ++i) {
    if (key == shm_key(i)) return i;
  }
  return -1;
}

void FuzzEnv::ResetShm() {
  for (int i = 0; i < kShmObjects; ++i) {
    std::memcpy(shm_[i]->data(), pristine_[i].data(), pristine_[i].size());
  }
}

uint64_t FuzzEnv::PristineWord(int i, uint64_t offset) const {
  uint64_t w = 0;
  if (offset <= pristine_[i].size() && pristine_[i].size() - offset >= sizeof(w)) {
    std::memcpy(&w, pristine_[i].data() + offset, sizeof(w));
  }
  return w;
}

std::string FuzzEnv::MapKey(const std::string& key) const {
  if (key.size() == 2 && key[0] == '@' && key[1] >= '0' && key[1] < '0' + kShmObjects) {
    return shm_key(key[1] - '0');
  }
  return key;
}

std::vector<v1::SessionRequest> ReadRequests(const uint8_t* data, size_t size) {
  std::vector<v1::SessionRequest> out;
  google::protobuf::io::CodedInputStream in(data, static_cast<int>(size));
  while (static_cast<int>(out.size()) < kMaxMessages) {
    uint32_t length;
    if (!in.ReadVarint32(&length)) break;
    const auto limit = in.PushLimit(static_cast<int>(length));
    v1::SessionRequest m;
    const bool parsed = m.ParseFromCodedStream(&in) && in.ConsumedEntireMessage();
    in.PopLimit(limit);
    if (!parsed) break;
    out.push_back(std::move(m));
  }
  return out;
}

bool OpOf(const v1::SessionRequest& m, OpId* id, const google::protobuf::Message** request,
          std::unique_ptr<google::protobuf::Message>* response) {
  switch (m.call_case()) {
    case v1::SessionRequest::kIndexerLogits:
      *id = OpId::kIndexerLogits;
      *request = &m.indexer_logits();
      *response = std::make_unique<v1::IndexerLogitsResponse>();
      return true;
    case v1::SessionRequest::kIndexerLogitsPaged:
      *id = OpId::kIndexerLogitsPaged;
      *request = &m.indexer_logits_paged();
      *response = std::make_unique<v1::IndexerLogitsPagedResponse>();
      return true;
    case v1::SessionRequest::kTopK:
      *id = OpId::kTopK;
      *request = &m.top_k();
      *response = std::make_unique<v1::TopKResponse>();
      return true;
    case v1::SessionRequest::kSparseMla:
      *id = OpId::kSparseMla;
      *request = &m.sparse_mla();
      *response = std::make_unique<v1::SparseMlaResponse>();
      return true;
    case v1::SessionRequest::kMlaDecode:
      *id = OpId::kMlaDecode;
      *request = &m.mla_decode();
      *response = std::make_unique<v1::MlaDecodeResponse>();
      return true;
    case v1::SessionRequest::kMlaPrefill:
      *id = OpId::kMlaPrefill;
      *request = &m.mla_prefill();
      *response = std::make_unique<v1::MlaPrefillResponse>();
      return true;
    case v1::SessionRequest::kDsaAttention:
      *id = OpId::kDsaAttention;
      *request = &m.dsa_attention();
      *response = std::make_unique<v1::DsaAttentionResponse>();
      return true;
    default: return false;
  }
}

bool PreparedOpOf(const v1::PrepareCallRequest& m, OpId* id,
                  const google::protobuf::Message** request,
                  std::unique_ptr<google::protobuf::Message>* response) {
  // The same op fields as a Session message: reuse OpOf on one that carries a copy.
  v1::SessionRequest as_session;
  switch (m.op_case()) {
    case v1::PrepareCallRequest::kIndexerLogits:
      *as_session.mutable_indexer_logits() = m.indexer_logits();
      break;
    case v1::PrepareCallRequest::kIndexerLogitsPaged:
      *as_session.mutable_indexer_logits_paged() = m.indexer_logits_paged();
      break;
    case v1::PrepareCallRequest::kTopK: *as_session.mutable_top_k() = m.top_k(); break;
    case v1::PrepareCallRequest::kSparseMla:
      *as_session.mutable_sparse_mla() = m.sparse_mla();
      break;
    case v1::PrepareCallRequest::kMlaDecode:
      *as_session.mutable_mla_decode() = m.mla_decode();
      break;
    case v1::PrepareCallRequest::kMlaPrefill:
      *as_session.mutable_mla_prefill() = m.mla_prefill();
      break;
    case v1::PrepareCallRequest::kDsaAttention:
      *as_session.mutable_dsa_attention() = m.dsa_attention();
      break;
    default: return false;
  }
  const google::protobuf::Message* inner;
  if (!OpOf(as_session, id, &inner, response)) return false;
  // *request must point into `m`, which outlives the call: the field of the same name.
  switch (*id) {
    case OpId::kIndexerLogits: *request = &m.indexer_logits(); break;
    case OpId::kIndexerLogitsPaged: *request = &m.indexer_logits_paged(); break;
    case OpId::kTopK: *request = &m.top_k(); break;
    case OpId::kSparseMla: *request = &m.sparse_mla(); break;
    case OpId::kMlaDecode: *request = &m.mla_decode(); break;
    case OpId::kMlaPrefill: *request = &m.mla_prefill(); break;
    case OpId::kDsaAttention: *request = &m.dsa_attention(); break;
  }
  return true;
}

void CheckRequestStatus(const absl::Status& s, const char* what) {
  switch (s.code()) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss: Fail(what, s);
    default: return;
  }
}

// What a GPU backend does after the op: copies the device-region bytes Count reads to their host
// readback buffers (the fake device memory is host memory).
void ReadBack(server::ops::PreparedCall& call) {
  for (const server::engine::TensorUse& use : call.call_tensors().uses()) {
    if (use.readback != nullptr) std::memcpy(use.readback, use.device, use.span_bytes);
  }
}

server::regions::HostRegionSpec HostSpecOf(const v1::RegisterHostRegionRequest& r, std::string key,
                                           std::string lease) {
  server::regions::HostRegionSpec spec;
  spec.name = r.name();
  spec.key = std::move(key);
  spec.offset = r.offset();
  spec.byte_size = r.byte_size();
  spec.lease = std::move(lease);
  return spec;
}

server::regions::DeviceRegionSpec DeviceSpecOf(const v1::RegisterDeviceRegionRequest& r,
                                               std::string lease) {
  server::regions::DeviceRegionSpec spec;
  spec.name = r.name();
  spec.raw_handle = r.raw_handle();
  spec.device_uuid = r.device_uuid();
  spec.offset = r.offset();
  spec.byte_size = r.byte_size();
  spec.lease = std::move(lease);
  return spec;
}

bool SmallEnoughToRun(server::ops::PreparedCall& call) {
  ReadBack(call);
  const kernels::WorkCount w = call.Count();
  return w.flops <= kMaxRunFlops && w.bytes <= kMaxRunBytes;
}

void RunPrepared(server::ops::PreparedCall& call) {
  kernels::ExecContext ctx;  // the CPU, on this thread
  std::string impl;
  const absl::Status s = call.Run(ctx, call.HostData(), &impl);
  // Run may still refuse what only the data shows (index tensors read at run time).
  CheckRequestStatus(s, "run");
  if (!s.ok()) return;
  call.call_tensors().FinishOutputs();
  MustOk(call.call_tensors().CheckRegions(), "regions after the run");
  ReadBack(call);
  (void)call.Count();
}

}  // namespace attnd::fuzz
