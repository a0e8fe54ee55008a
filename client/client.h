// The C++ client of attnd (attnd.v1.Attention): connect, inspect (GetInfo, health, regions),
// and call the operators with kernels Params structs whose tensors are host views. Tensors that
// lie in a HostRegion created through this client travel zero-copy (op_codec.h has the rules).
//   ConnectOptions o;  o.target = "unix:/run/attnd/attnd.sock";
//   ATTND_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Client::Connect(o));
//   kernels::sparse_mla::Params p = ...;            // q, kv, indices, out, lse: host views
//   ATTND_ASSIGN_OR_RETURN(CallResult r, c->SparseMla(p));  // p.out / p.lse now hold the result
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnd/v1/attention.grpc.pb.h"
#include "client/channel.h"
#include "client/op_codec.h"
#include "client/region_table.h"

namespace attnd::client {

inline constexpr absl::Duration kDefaultAdminTimeout = absl::Seconds(30);

// grpc.health.v1 serving status.
enum class HealthStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };
const char* HealthStatusName(HealthStatus s);  // "SERVING", ...

// Thread-safe: one Client may be used by many threads at once (gRPC channels are).
class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ConnectOptions& options);
  // `wait_spin`: ConnectOptions::wait_spin.
  explicit Client(std::shared_ptr<grpc::Channel> channel,
                  absl::Duration wait_spin = absl::ZeroDuration());
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  absl::StatusOr<v1::GetInfoResponse> GetInfo(absl::Duration timeout = kDefaultAdminTimeout);
  // grpc.health.v1.Health/Check for `service` ("" = the whole server).
  absl::StatusOr<HealthStatus> Health(const std::string& service = "",
                                      absl::Duration timeout = kDefaultAdminTimeout);
  absl::StatusOr<v1::ListRegionsResponse> ListRegions(
      absl::Duration timeout = kDefaultAdminTimeout);
  absl::Status RegisterHostRegion(const v1::RegisterHostRegionRequest& request,
                                  absl::Duration timeout = kDefaultAdminTimeout);
  // The raw RPC; DeviceRegion (device_region.h) registers through it and adds the range to
  // regions().
  absl::Status RegisterDeviceRegion(const v1::RegisterDeviceRegionRequest& request,
                                    absl::Duration timeout = kDefaultAdminTimeout);
  // Empty name: every region of `lease_id` (or every unleased one). Returns the removed names.
  absl::StatusOr<std::vector<std::string>> UnregisterRegion(
      const std::string& name, const std::string& lease_id = "",
      absl::Duration timeout = kDefaultAdminTimeout);

  // One unary RPC per operator. The params' output buffers receive the results (op_codec.h);
  // errors carry the server's code and message ("SparseMla: q: dim 2 is 575, want 512 or 576").
  absl::StatusOr<CallResult> IndexerLogits(const kernels::indexer_logits::Params& p,
                                           const CallOptions& options = {});
  absl::StatusOr<CallResult> IndexerLogitsPaged(const kernels::indexer_logits_paged::Params& p,
                                                const CallOptions& options = {});
  absl::StatusOr<CallResult> TopK(const kernels::topk::Params& p, const CallOptions& options = {});
  absl::StatusOr<CallResult> SparseMla(const kernels::sparse_mla::Params& p,
                                       const CallOptions& options = {});
  absl::StatusOr<CallResult> MlaDecode(const kernels::mla_decode::Params& p,
                                       const CallOptions& options = {});
  absl::StatusOr<CallResult> MlaPrefill(const kernels::mla_prefill::Params& p,
                                        const CallOptions& options = {});
  absl::StatusOr<CallResult> DsaAttention(const kernels::dsa::Params& p,
                                          const CallOptions& options = {});
  // The same for any Params type with an OpTraits (generic code: attnctl).
  template <class Params>
  absl::StatusOr<CallResult> Call(const Params& p, const CallOptions& options = {});

  // Host regions registered through this client (HostRegion adds and removes itself).
  RegionTable& regions() { return regions_; }
  const RegionTable& regions() const { return regions_; }
  v1::Attention::Stub* stub() { return stub_.get(); }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  absl::Duration wait_spin() const { return wait_spin_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  const absl::Duration wait_spin_;
  std::unique_ptr<v1::Attention::Stub> stub_;
  RegionTable regions_;
};

// Sets a deadline on `ctx` when `timeout` is finite.
void SetTimeout(grpc::ClientContext* ctx, absl::Duration timeout);

}  // namespace attnd::client
