// Region RPCs (after Triton's shared-memory extension): register host/device regions, unregister
// (finishing once in-flight requests using the regions end), list; each in the caller's own
// namespace (docs/SERVICE.md "Trust model").
#include "absl/strings/str_cat.h"
#include "server/common/log.h"
#include "server/grpc/service.h"
#include "server/grpc/status.h"
#include "server/grpc/unary_call.h"

namespace attnd::server::grpc_front {

absl::Status RegisterHostRegion(regions::RegionRegistry* registry, const Caller& caller,
                                const v1::RegisterHostRegionRequest& request,
                                const std::string& lease) {
  regions::HostRegionSpec spec;
  spec.owner = caller.owner;
  spec.name = request.name();
  spec.key = request.key();
  spec.offset = request.offset();
  spec.byte_size = request.byte_size();
  spec.lease = lease.empty() ? request.lease_id() : lease;
  // A root peer may name any object; anyone else only objects it owns.
  if (caller.uid != 0) spec.object_uid = caller.uid;
  absl::Status s =
      caller.local ? registry->RegisterHost(spec)
                   : absl::PermissionDeniedError(
                         "host regions can be registered only over the daemon's unix socket (the "
                         "daemon checks that the shm object belongs to the peer's uid); a TCP "
                         "caller sends tensors inline or uses device regions");
  if (s.ok()) {
    Log(LogLevel::kInfo, "host region registered",
        {{"owner", spec.owner},
         {"region", spec.name},
         {"key", spec.key},
         {"offset", spec.offset},
         {"byte_size", spec.byte_size},
         {"lease", spec.lease}});
  } else {
    Log(LogLevel::kWarning, "host region refused",
        {{"owner", spec.owner},
         {"region", spec.name},
         {"key", spec.key},
         {"offset", spec.offset},
         {"byte_size", spec.byte_size},
         {"lease", spec.lease},
         {"code", absl::StatusCodeToString(s.code())},
         {"error", s.message()}});
  }
  return s;
}

absl::Status RegisterDeviceRegion(regions::RegionRegistry* registry, const Caller& caller,
                                  const v1::RegisterDeviceRegionRequest& request,
                                  const std::string& lease) {
  regions::DeviceRegionSpec spec;
  spec.owner = caller.owner;
  spec.name = request.name();
  spec.raw_handle = request.raw_handle();
  spec.device_uuid = request.device_uuid();
  spec.offset = request.offset();
  spec.byte_size = request.byte_size();
  spec.lease = lease.empty() ? request.lease_id() : lease;
  absl::Status s = caller.anonymous && spec.lease.empty()
                       ? absl::FailedPreconditionError(
                             "an anonymous TCP caller (no client certificate) registers device "
                             "regions under a Session lease only: its unleased regions would "
                             "outlive its connection")
                       : registry->RegisterDevice(spec);
  if (s.ok()) {
    Log(LogLevel::kInfo, "device region registered",
        {{"owner", spec.owner},
         {"region", spec.name},
         {"device", spec.device_uuid},
         {"byte_size", spec.byte_size},
         {"lease", spec.lease}});
  } else {
    Log(LogLevel::kWarning, "device region refused",
        {{"owner", spec.owner},
         {"region", spec.name},
         {"device", spec.device_uuid},
         {"byte_size", spec.byte_size},
         {"lease", spec.lease},
         {"code", absl::StatusCodeToString(s.code())},
         {"error", s.message()}});
  }
  return s;
}

grpc::ServerUnaryReactor* AttentionService::RegisterHostRegion(grpc::CallbackServerContext* ctx,
                                                               const Raw* request, Raw* reply) {
  auto* call = new UnaryCall<v1::RegisterHostRegionRequest, v1::RegisterRegionResponse>(
      "RegisterHostRegion", request, reply);
  if (call->parsed()) {
    call->Reply(grpc_front::RegisterHostRegion(deps_.registry, IdentifyCaller(deps_.peers, *ctx),
                                               call->request(), ""));
  }
  return call;
}

grpc::ServerUnaryReactor* AttentionService::RegisterDeviceRegion(grpc::CallbackServerContext* ctx,
                                                                 const Raw* request, Raw* reply) {
  auto* call = new UnaryCall<v1::RegisterDeviceRegionRequest, v1::RegisterRegionResponse>(
      "RegisterDeviceRegion", request, reply);
  if (call->parsed()) {
    call->Reply(grpc_front::RegisterDeviceRegion(deps_.registry, IdentifyCaller(deps_.peers, *ctx),
                                                 call->request(), ""));
  }
  return call;
}

grpc::ServerUnaryReactor* AttentionService::UnregisterRegion(grpc::CallbackServerContext* ctx,
                                                             const Raw* raw_request, Raw* reply) {
  auto* call = new UnaryCall<v1::UnregisterRegionRequest, v1::UnregisterRegionResponse>(
      "UnregisterRegion", raw_request, reply);
  if (!call->parsed()) return call;
  const v1::UnregisterRegionRequest* request = &call->request();
  // Finishes when the regions' in-flight requests end (never blocks this thread).
  const std::string owner = IdentifyCaller(deps_.peers, *ctx).owner;
  const std::vector<std::string> going = RegionsNamed(owner, request->name(), request->lease_id());
  absl::Status s = deps_.registry->UnregisterAsync(
      owner, request->name(), request->lease_id(),
      [this, call, owner](std::vector<std::string> removed) {
        RegionsReleased(owner, removed);  // not a name registered again meanwhile
        for (std::string& name : removed) call->response()->add_removed(std::move(name));
        call->Reply(absl::OkStatus());
      });
  // The names are free again now: what names them goes (a ring's pins first, so that the
  // unregistration can complete).
  if (s.ok()) RegionsRemoved(owner, going);
  if (s.ok()) {
    Log(LogLevel::kInfo, "unregistering region",
        {{"owner", owner}, {"region", request->name()}, {"lease", request->lease_id()}});
  } else {
    Log(LogLevel::kWarning, "unregister refused",
        {{"owner", owner},
         {"region", request->name()},
         {"lease", request->lease_id()},
         {"code", absl::StatusCodeToString(s.code())},
         {"error", s.message()}});
    call->Reply(s);
  }
  return call;
}

grpc::ServerUnaryReactor* AttentionService::ListRegions(grpc::CallbackServerContext* ctx,
                                                        const Raw* request, Raw* reply) {
  auto* call =
      new UnaryCall<v1::ListRegionsRequest, v1::ListRegionsResponse>("ListRegions", request, reply);
  if (!call->parsed()) return call;
  for (const regions::RegionDescription& d :
       deps_.registry->List(IdentifyCaller(deps_.peers, *ctx).owner)) {
    v1::RegionInfo* info = call->response()->add_regions();
    info->set_name(d.name);
    info->set_kind(d.kind == regions::RegionKind::kHost ? v1::RegionInfo::KIND_HOST
                                                        : v1::RegionInfo::KIND_DEVICE);
    info->set_key(d.key);
    info->set_device_uuid(d.device_uuid);
    info->set_offset(d.offset);
    info->set_byte_size(d.byte_size);
    info->set_lease_id(d.lease);
    info->set_in_flight(d.in_flight);
  }
  call->Reply(absl::OkStatus());
  return call;
}

}  // namespace attnd::server::grpc_front
