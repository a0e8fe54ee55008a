// A unary RPC whose caller polls for the reply before it sleeps (ConnectOptions::wait_spin).
// A blocking gRPC call sleeps in the kernel until its reply arrives; on hosts where waking a
// sleeping thread is slow (virtual machines: an idle vCPU is halted and woken by an interrupt)
// that wake-up is a large part of a small call's round trip (docs/BENCHMARKS.md). Here the call
// goes through the generated asynchronous API on a completion queue of its own, which the caller
// polls without blocking until the reply comes or `spin` has passed, then waits blocking.
//   grpc::Status s = PolledUnary(
//       [&](grpc::CompletionQueue* cq) { return stub->PrepareAsyncGetInfo(&ctx, request, cq); },
//       &response, absl::Microseconds(500));
#pragma once

#include <chrono>

#include "absl/time/time.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/support/async_unary_call.h"
#include "grpcpp/support/status.h"

namespace attnd::client {

// `prepare(cq)` returns the call's std::unique_ptr<grpc::ClientAsyncResponseReader<Response>>
// (a stub's PrepareAsync<Rpc>), not yet started. The ClientContext it was given must outlive
// this call; `out` receives the reply.
template <class Response, class Prepare>
grpc::Status PolledUnary(Prepare prepare, Response* out, absl::Duration spin) {
  grpc::CompletionQueue cq;
  grpc::Status status;
  {
    auto rpc = prepare(&cq);
    rpc->StartCall();
    void* const kDone = &status;
    rpc->Finish(out, &status, kDone);
    void* tag = nullptr;
    bool ok = false;
    bool got = false;
    const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin);
    // A deadline already passed: each AsyncNext polls the queue's sockets once, without
    // sleeping, and returns.
    while (!got && std::chrono::steady_clock::now() < until) {
      got = cq.AsyncNext(&tag, &ok, std::chrono::system_clock::time_point()) ==
            grpc::CompletionQueue::GOT_EVENT;
    }
    if (!got) got = cq.Next(&tag, &ok);
    // Finish's tag is the only one on this queue: it always completes (ok is always true for
    // a client-side Finish); the status says how the call ended.
    if (!got) status = grpc::Status(grpc::StatusCode::INTERNAL, "completion queue shut down");
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

}  // namespace attnd::client
