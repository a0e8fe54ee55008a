// The attnd.v1.Attention gRPC service (callback API). Reactors never block: op calls go to the
// engine's scheduler through CallRunner and Finish from its completion; region unregistration
// finishes when the region's in-flight requests end. Methods are defined one file per RPC family:
// info_service.cc, region_service.cc, op_service.cc, session_service.cc.
//   AttentionService service(deps);
//   builder.RegisterService(&service);
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "attnd/v1/attention.grpc.pb.h"
#include "server/engine/backend.h"
#include "server/engine/scheduler.h"
#include "server/ops/call_runner.h"
#include "server/ops/op_handler.h"
#include "server/regions/registry.h"

namespace attnd::server::grpc_front {

struct ServiceLimits {
  uint64_t max_message_bytes = 0;
  int queue_capacity = 0;
  int workers = 0;
  int cpu_threads = 0;
  bool allow_client_shm = false;
  uint64_t pool_bytes_per_device = 0;  // GPU backends
  bool graphs = false;
  int streams_per_device = 0;
};

// Everything the service uses; borrowed, must outlive the service (and the grpc::Server).
struct ServiceDeps {
  std::string version;
  const engine::Backend* backend = nullptr;
  const ops::OpTable* ops = nullptr;
  ops::CallRunner* runner = nullptr;
  regions::RegionRegistry* registry = nullptr;
  ServiceLimits limits;
};

class AttentionService final : public v1::Attention::CallbackService {
 public:
  explicit AttentionService(ServiceDeps deps);

  // info_service.cc
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* ctx,
                                    const v1::GetInfoRequest* request,
                                    v1::GetInfoResponse* response) override;

  // region_service.cc
  grpc::ServerUnaryReactor* RegisterHostRegion(grpc::CallbackServerContext* ctx,
                                               const v1::RegisterHostRegionRequest* request,
                                               v1::RegisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* RegisterDeviceRegion(grpc::CallbackServerContext* ctx,
                                                 const v1::RegisterDeviceRegionRequest* request,
                                                 v1::RegisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* ctx,
                                             const v1::UnregisterRegionRequest* request,
                                             v1::UnregisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* ctx,
                                        const v1::ListRegionsRequest* request,
                                        v1::ListRegionsResponse* response) override;

  // op_service.cc
  grpc::ServerUnaryReactor* IndexerLogits(grpc::CallbackServerContext* ctx,
                                          const v1::IndexerLogitsRequest* request,
                                          v1::IndexerLogitsResponse* response) override;
  grpc::ServerUnaryReactor* IndexerLogitsPaged(grpc::CallbackServerContext* ctx,
                                               const v1::IndexerLogitsPagedRequest* request,
                                               v1::IndexerLogitsPagedResponse* response) override;
  grpc::ServerUnaryReactor* TopK(grpc::CallbackServerContext* ctx, const v1::TopKRequest* request,
                                 v1::TopKResponse* response) override;
  grpc::ServerUnaryReactor* SparseMla(grpc::CallbackServerContext* ctx,
                                      const v1::SparseMlaRequest* request,
                                      v1::SparseMlaResponse* response) override;
  grpc::ServerUnaryReactor* MlaDecode(grpc::CallbackServerContext* ctx,
                                      const v1::MlaDecodeRequest* request,
                                      v1::MlaDecodeResponse* response) override;
  grpc::ServerUnaryReactor* MlaPrefill(grpc::CallbackServerContext* ctx,
                                       const v1::MlaPrefillRequest* request,
                                       v1::MlaPrefillResponse* response) override;
  grpc::ServerUnaryReactor* DsaAttention(grpc::CallbackServerContext* ctx,
                                         const v1::DsaAttentionRequest* request,
                                         v1::DsaAttentionResponse* response) override;

  // session_service.cc
  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* Session(
      grpc::CallbackServerContext* ctx) override;

  const ServiceDeps& deps() const { return deps_; }
  // Sessions open now (for logs and tests).
  int64_t open_sessions() const { return open_sessions_.load(); }
  void AddSession(int delta) { open_sessions_.fetch_add(delta); }

 private:
  grpc::ServerUnaryReactor* RunOp(ops::OpId id, grpc::CallbackServerContext* ctx,
                                  const google::protobuf::Message& request,
                                  google::protobuf::Message* response);

  const ServiceDeps deps_;
  std::atomic<int64_t> open_sessions_{0};
};

// Region RPC bodies shared by the unary RPCs and the Session stream; `lease` overrides the
// request's lease_id when not empty.
absl::Status RegisterHostRegion(regions::RegionRegistry* registry,
                                const v1::RegisterHostRegionRequest& request,
                                const std::string& lease);
absl::Status RegisterDeviceRegion(regions::RegionRegistry* registry,
                                  const v1::RegisterDeviceRegionRequest& request,
                                  const std::string& lease);

}  // namespace attnd::server::grpc_front
