#include "server/grpc/health.h"

#include <string>

#include "attnd/v1/attention.grpc.pb.h"
#include "server/common/log.h"

namespace attnd::server::grpc_front {

void WatchDeviceLoss(engine::Backend* backend, grpc::HealthCheckServiceInterface* health,
                     metrics::Metrics* metrics) {
  if (metrics != nullptr) {
    for (const engine::DeviceDescription& d : backend->Devices())
      metrics->SetDeviceUp(d.uuid, true);
  }
  backend->SetDeviceLostCallback(
      [health, metrics](const std::string& device, const std::string& why) {
        Log(LogLevel::kError, "device lost: health is NOT_SERVING until attnd restarts",
            {{"device", device}, {"error", why}});
        if (metrics != nullptr) metrics->SetDeviceUp(device, false);
        if (health != nullptr) {
          health->SetServingStatus(false);
          health->SetServingStatus(v1::Attention::service_full_name(), false);
        }
      });
}

}  // namespace attnd::server::grpc_front
