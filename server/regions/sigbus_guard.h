// Client shared memory can shrink under the daemon: after a client ftruncates a registered shm
// object, every access to the pages past its new end raises SIGBUS, which would kill the process.
// The guard knows the address ranges of the daemon's host mappings. Its SIGBUS handler, for a
// fault inside one of them, maps anonymous zero pages over the rest of that mapping (every later
// page of a mapping lies past the object's new end as well), counts the fault on the range and
// returns: the faulting access (a kernel reading an input, writing an output, a snapshot copy)
// completes on zero pages, and the call that used the region fails afterwards with a clean error
// (docs/SERVICE.md "Trust model"). A SIGBUS anywhere else keeps its previous action.
//   absl::StatusOr<GuardedRange> range = GuardedRange::Add(base, length);  // per mapping
//   ...
//   if (range->faulted()) ...;  // the mapping lost pages: its object was truncated
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace attnd::server::regions {

// Most ranges guarded at once (one per host region mapping). The handler scans them, so they live
// in a fixed table that a signal handler can read without locks.
inline constexpr size_t kMaxGuardedRanges = 1 << 16;

// Installs the SIGBUS handler (once per process; later calls return the first result). Signal
// handlers are process-wide, so this is the one process-wide state of the registry layer.
// Thread-safe.
absl::Status InstallSigbusGuard();

// One guarded address range. Movable; removes itself from the guard when destroyed (before the
// memory is unmapped).
class GuardedRange {
 public:
  GuardedRange() = default;
  ~GuardedRange() { Reset(); }
  GuardedRange(GuardedRange&& other) noexcept : slot_(other.slot_) { other.slot_ = -1; }
  GuardedRange& operator=(GuardedRange&& other) noexcept;
  GuardedRange(const GuardedRange&) = delete;
  GuardedRange& operator=(const GuardedRange&) = delete;

  // Guards [base, base + length) (rounded out to whole pages), installing the handler first.
  // RESOURCE_EXHAUSTED when kMaxGuardedRanges ranges are guarded already. Thread-safe.
  static absl::StatusOr<GuardedRange> Add(void* base, size_t length);

  // Whether an access to the range has faulted (it now has zero pages where the object's pages
  // were). Thread-safe, lock-free.
  bool faulted() const;
  // Stops guarding (the range's memory must not be accessed any more). Idempotent.
  void Reset();

 private:
  explicit GuardedRange(int slot) : slot_(slot) {}
  int slot_ = -1;
};

}  // namespace attnd::server::regions
