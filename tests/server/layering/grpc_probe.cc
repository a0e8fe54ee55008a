// A program that uses the engine and gRPC. tests/server/CMakeLists.txt links it twice: against
// attn_engine alone (engine_grpc_probe), where the link must fail on the gRPC symbols because
// the engine's link interface has no gRPC, and with gRPC::grpc++ added
// (engine_grpc_probe_control), where it must link and run. check_engine_layer.cmake checks both.
#include <memory>

#include "grpcpp/grpcpp.h"
#include "server/engine/graph_cache.h"

int main() {
  namespace engine = attnd::server::engine;
  const char* name = engine::GraphResultName(engine::GraphResult::kHit);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(
      "unix:/nonexistent/attnd-layering-probe.sock", grpc::InsecureChannelCredentials());
  return name != nullptr && channel != nullptr ? 0 : 1;
}
