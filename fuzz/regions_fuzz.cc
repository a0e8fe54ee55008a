// Fuzz target: region registration. An input is a run of Session messages (env.h ReadRequests)
// applied to a fresh registry as the region RPCs apply them: register host and device regions (keys
// "@0".."@2" name the target's shm objects, lease ids "L0".."L3" the leases opened so far),
// unregister, open (a new lease), cancel (close a lease); an op message pins every listed region
// and touches its first and last byte, holding the pins (calls in flight) until a message with an
// odd request_id lets go. At the end every lease is closed and every region unregistered, and the
// registry must be empty with nothing mapped and every unregistration completed exactly once.
// Findings: sanitizer reports, statuses no request may produce, broken invariants.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/env.h"

namespace attnd::fuzz {
namespace {

using server::regions::RegionKind;
using server::regions::RegionPin;
using server::regions::RegionRegistry;

constexpr int kMaxLeases = 4;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: invariant broken: %s\n", what);
  std::abort();
}

struct Run {
  std::unique_ptr<RegionRegistry> registry = FuzzEnv::Get().NewRegistry();
  std::vector<std::string> leases;
  std::vector<RegionPin> pins;
  int unregisters = 0;  // accepted
  std::shared_ptr<int> completed = std::make_shared<int>(0);

  std::string MapLease(const std::string& id) const {
    if (id.size() == 2 && id[0] == 'L' && id[1] >= '0' && id[1] < '0' + kMaxLeases) {
      const size_t i = id[1] - '0';
      return i < leases.size() ? leases[i] : id;
    }
    return id;
  }

  void Unregister(const std::string& name, const std::string& lease) {
    std::shared_ptr<int> completed_count = completed;
    auto once = std::make_shared<bool>(false);
    const absl::Status s =
        registry->UnregisterAsync(name, lease, [completed_count, once](std::vector<std::string>) {
          Check(!*once, "an unregistration completed twice");
          *once = true;
          ++*completed_count;
        });
    CheckRequestStatus(s, "unregister");
    if (s.ok()) ++unregisters;
  }

  void Pin() {
    for (const server::regions::RegionDescription& d : registry->List()) {
      absl::StatusOr<RegionPin> pin = registry->Acquire(d.name);
      Check(pin.ok(), "a listed region cannot be acquired");
      const server::regions::Region* r = pin->get();
      Check(r->byte_size() == d.byte_size && r->byte_size() > 0, "region size");
      if (r->kind() == RegionKind::kHost) {
        volatile char* p = r->data();
        p[0] = p[0];
        p[r->byte_size() - 1] = p[r->byte_size() - 1];
      } else {
        volatile char* p = r->device_data();
        p[0] = p[0];
        p[r->byte_size() - 1] = p[r->byte_size() - 1];
      }
      pins.push_back(*std::move(pin));
    }
  }

  void Apply(const v1::SessionRequest& m) {
    const FuzzEnv& env = FuzzEnv::Get();
    switch (m.call_case()) {
      case v1::SessionRequest::kOpen:
        if (static_cast<int>(leases.size()) < kMaxLeases) leases.push_back(registry->OpenLease());
        return;
      case v1::SessionRequest::kCancel: {
        const uint64_t t = m.cancel().target_request_id();
        registry->CloseLease(leases.empty() ? std::to_string(t) : leases[t % leases.size()]);
        return;
      }
      case v1::SessionRequest::kRegisterHostRegion: {
        const v1::RegisterHostRegionRequest& r = m.register_host_region();
        CheckRequestStatus(
            registry->RegisterHost(HostSpecOf(r, env.MapKey(r.key()), MapLease(r.lease_id()))),
            "register host");
        return;
      }
      case v1::SessionRequest::kRegisterDeviceRegion: {
        const v1::RegisterDeviceRegionRequest& r = m.register_device_region();
        CheckRequestStatus(registry->RegisterDevice(DeviceSpecOf(r, MapLease(r.lease_id()))),
                           "register device");
        return;
      }
      case v1::SessionRequest::kUnregisterRegion:
        Unregister(m.unregister_region().name(), MapLease(m.unregister_region().lease_id()));
        return;
      case v1::SessionRequest::CALL_NOT_SET: return;
      default:  // an op call: pin what is there
        if (m.request_id() % 2 == 1) {
          pins.clear();
        } else {
          Pin();
        }
        return;
    }
  }

  void Finish() {
    const std::vector<server::regions::RegionDescription> listed = registry->List();
    for (size_t i = 1; i < listed.size(); ++i) {
      Check(listed[i - 1].name < listed[i].name, "List is sorted and unique");
    }
    pins.clear();
    Check(*completed == unregisters, "every accepted unregistration completed once pins dropped");
    for (const std::string& lease : leases) registry->CloseLease(lease);
    Check(registry->Unregister("", "").ok(), "unregistering every lease-less region");
    Check(registry->List().empty(), "nothing registered after closing every lease");
    for (RegionKind kind : {RegionKind::kHost, RegionKind::kDevice}) {
      int64_t count = -1, bytes = -1;
      registry->Totals(kind, &count, &bytes);
      Check(count == 0 && bytes == 0, "nothing mapped at the end");
    }
  }
};

}  // namespace
}  // namespace attnd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<attnd::v1::SessionRequest> messages = attnd::fuzz::ReadRequests(data, size);
  if (messages.empty()) return 0;
  attnd::fuzz::Run run;
  for (const attnd::v1::SessionRequest& m : messages) run.Apply(m);
  run.Finish();
  return 0;
}
