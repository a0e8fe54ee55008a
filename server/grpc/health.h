// Device loss turns the standard health service NOT_SERVING (docs/SERVICE.md "Standard
// services"): once the backend reports a lost device (engine::Backend::ReportDeviceLost), the
// overall status ("") and attnd.v1.Attention's answer NOT_SERVING for the rest of the process,
// attnd_device_up{device} drops to 0 and an error is logged with the device and the cause.
//   WatchDeviceLoss(backend, server->GetHealthCheckService(), metrics);   // after SERVING is set
//   ...
//   backend->SetDeviceLostCallback(nullptr);                              // before the server goes
#pragma once

#include "grpcpp/health_check_service_interface.h"
#include "server/engine/backend.h"
#include "server/metrics/metrics.h"

namespace attnd::server::grpc_front {

// Sets attnd_device_up to 1 for each of the backend's devices and installs the backend's device
// lost callback. `health` and `metrics` (may be null) must stay valid until the callback is
// removed (Backend::SetDeviceLostCallback(nullptr)). A device lost before this call counts at once.
void WatchDeviceLoss(engine::Backend* backend, grpc::HealthCheckServiceInterface* health,
                     metrics::Metrics* metrics);

}  // namespace attnd::server::grpc_front
