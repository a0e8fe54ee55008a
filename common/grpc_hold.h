// Keeps gRPC initialised for the rest of the process (docs/SERVICE.md "Scheduler, deadlines and
// shutdown"). When the last gRPC server or channel of a process goes, gRPC shuts its library down
// and joins its executor thread, which may be inside a poll of up to 10 s: a daemon's destructor
// took 10 s now and then (measured), and a client closing its process's last channel is open to
// the same wait. One reference, never released, taken by the daemon before it builds its server
// and by the client before it builds a channel.
#pragma once

#include "grpc/grpc.h"

namespace attnd {

inline void HoldGrpcForProcess() {
  static const bool held = [] {
    grpc_init();
    return true;
  }();
  static_cast<void>(held);
}

}  // namespace attnd
