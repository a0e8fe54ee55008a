// Fuzz target: one op request, as a Session message carrying it (its oneof names the op), through
// the ops layer: tensor resolution (inline bytes, host regions "h" and "g", device region "d"),
// scalars, output placement and Validate; a call that is accepted and small is run on the CPU and
// its outputs finished and counted. Findings: sanitizer reports, a status no request may
// produce.
#include <cstddef>
#include <cstdint>

#include "fuzz/env.h"

namespace attnd::fuzz {
namespace {

void OneRequest(const uint8_t* data, size_t size) {
  FuzzEnv& env = FuzzEnv::Get();
  v1::SessionRequest m;
  if (!m.ParseFromArray(data, static_cast<int>(size))) return;
  server::ops::OpId id;
  const google::protobuf::Message* request;
  std::unique_ptr<google::protobuf::Message> response;
  if (!OpOf(m, &id, &request, &response)) return;
  server::engine::CallMemoryBudget budget({.total_bytes = 4 << 20, .per_client_bytes = 2 << 20});
  server::engine::CallMemory memory(&budget, "fuzz");
  server::ops::PrepareOptions options;
  options.registry = &env.op_registry();
  options.max_inline_bytes = kMaxInlineBytes;
  options.memory = &memory;
  auto call = env.ops().Find(id)->Prepare(*request, response.get(), options);
  if (!call.ok()) {
    CheckRequestStatus(call.status(), "prepare");
    return;
  }
  (void)(*call)->LaunchKey();
  if (SmallEnoughToRun(**call)) RunPrepared(**call);
}

}  // namespace
}  // namespace attnd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attnd::fuzz::OneRequest(data, size);
  return 0;
}
