// The world a fuzz target runs in (docs/FUZZING.md): shm objects, a region registry with a fake
// device opener, the op table, and the helpers every target shares: reading a run of Session
// messages from the fuzzer's bytes, naming the op a message calls, running a prepared call when its
// work is small, and aborting on a status no request may produce.
//   static FuzzEnv& env = FuzzEnv::Get();
//   for (const v1::SessionRequest& m : ReadRequests(data, size)) ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "attnd/v1/attention.pb.h"
#include "server/ops/op_handler.h"
#include "server/regions/registry.h"
#include "tests/server/fake_device_opener.h"
#include "tests/server/shm_test_util.h"

namespace attnd::fuzz {

namespace v1 = ::attnd::v1;

// Bytes of the fake device allocation behind every device region.
inline constexpr uint64_t kDeviceBytes = 256 << 10;
// The largest work a target runs (Count's FLOPs and logical bytes); larger valid calls are
// prepared and validated but not run, so that one input stays fast.
inline constexpr double kMaxRunFlops = 1 << 22;
inline constexpr double kMaxRunBytes = 1 << 22;
// Inline outputs of one call, each and together.
inline constexpr uint64_t kMaxInlineBytes = 1 << 20;
// Session messages read from one input.
inline constexpr int kMaxMessages = 24;

// Process-wide fixtures, made on first use and never destroyed (the fuzzer exits without
// running destructors on a crash anyway). Not thread-safe to construct; the targets call Get()
// from LLVMFuzzerTestOneInput only.
class FuzzEnv {
 public:
  static FuzzEnv& Get();

  // shm objects the inputs may name as "@0", "@1", "@2" (256 KiB, 4096 and 5000 bytes).
  static constexpr int kShmObjects = 3;
  const std::string& shm_key(int i) const { return shm_[i]->key(); }
  // The object's bytes in this process's own mapping of it (what the daemon's mappings write shows
  // here), and its size.
  char* shm_data(int i) const { return shm_[i]->data(); }
  int64_t shm_size(int i) const { return shm_[i]->size(); }
  // The object whose real key is `key`, or -1.
  int ShmIndex(const std::string& key) const;
  // Every object's first contents again (a fixed non-zero pattern), and the 8 bytes of object i at
  // byte `offset` as they are then.
  void ResetShm();
  uint64_t PristineWord(int i, uint64_t offset) const;

  // The registry of the ops target: host regions "h" (all of @0) and "g" (1000 bytes of @0 at
  // byte 4099, so misaligned), device region "d" (kDeviceBytes).
  const server::regions::RegionRegistry& op_registry() const { return *op_registry_; }
  // A fresh registry (client shm allowed, the fake device opener) for one input.
  std::unique_ptr<server::regions::RegionRegistry> NewRegistry() const;
  const server::ops::OpTable& ops() const { return ops_; }

  // The real shm key for a key written as "@<digit>" in an input; any other key unchanged.
  std::string MapKey(const std::string& key) const;

 private:
  FuzzEnv();
  std::unique_ptr<testing::ScopedShm> shm_[kShmObjects];
  std::string pristine_[kShmObjects];
  std::shared_ptr<server::testing::FakeDeviceOpener> opener_;
  std::unique_ptr<server::regions::RegionRegistry> op_registry_;
  server::ops::OpTable ops_;
};

// The Session messages of an input: a run of (varint length, SessionRequest bytes) pairs; stops
// at the first that does not parse, or after kMaxMessages.
std::vector<v1::SessionRequest> ReadRequests(const uint8_t* data, size_t size);

// The op a Session message calls, its request and a fresh response of the right type in
// *response; false when the message carries no op call.
bool OpOf(const v1::SessionRequest& m, server::ops::OpId* id,
          const google::protobuf::Message** request,
          std::unique_ptr<google::protobuf::Message>* response);
// The same for the op request a PrepareCall carries.
bool PreparedOpOf(const v1::PrepareCallRequest& m, server::ops::OpId* id,
                  const google::protobuf::Message** request,
                  std::unique_ptr<google::protobuf::Message>* response);

// Aborts (a fuzzer finding) when `s` has a code no bad request may produce: INTERNAL, UNKNOWN,
// DATA_LOSS (a request is refused with INVALID_ARGUMENT, NOT_FOUND, ... or served).
void CheckRequestStatus(const absl::Status& s, const char* what);

// The registry specs of a Session's region registrations, as the daemon builds them, with the
// object key already mapped to one of the environment's objects and the lease chosen by the
// target.
server::regions::HostRegionSpec HostSpecOf(const v1::RegisterHostRegionRequest& r, std::string key,
                                           std::string lease);
server::regions::DeviceRegionSpec DeviceSpecOf(const v1::RegisterDeviceRegionRequest& r,
                                               std::string lease);

// Whether a prepared call is small enough to run here (kMaxRunFlops, kMaxRunBytes), from its own
// work count (which reads only its inputs; device-region ones are read back first).
bool SmallEnoughToRun(server::ops::PreparedCall& call);

// Runs a prepared call the way the backends do: on the CPU backend when every tensor is host
// memory, else bound in place (device regions are host memory behind the fake opener); then
// finishes its outputs and checks its regions. Aborts on a status no request may produce.
void RunPrepared(server::ops::PreparedCall& call);

}  // namespace attnd::fuzz
