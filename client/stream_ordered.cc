#include "client/stream_ordered.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/channel.h"
#include "client/polled_unary.h"
#include "common/cpu_relax.h"

namespace attnd::client {

v1::Signal ToProto(const Signal& s) {
  v1::Signal out;
  out.mutable_slice()->set_region(s.region);
  out.mutable_slice()->set_offset(s.offset);
  out.set_value(s.value);
  return out;
}

template <class Params>
absl::StatusOr<uint64_t> Enqueue(Client* client, const Params& p,
                                 const std::optional<Signal>& ready,
                                 const std::optional<Signal>& done, const CallOptions& options) {
  using Traits = OpTraits<Params>;
  if (!ready && !done) {
    return absl::InvalidArgumentError("Enqueue: a stream-ordered call needs ready and/or done");
  }
  typename Traits::Request request;
  if (absl::Status s = BuildRequest(p, &client->regions(), options.inline_only, &request);
      !s.ok()) {
    return s;
  }
  if (ready) *request.mutable_ready() = ToProto(*ready);
  if (done) *request.mutable_done() = ToProto(*done);
  typename Traits::Response response;
  grpc::ClientContext ctx;
  SetTimeout(&ctx, options.timeout);
  if (options.request_id != 0) ctx.AddMetadata("x-request-id", absl::StrCat(options.request_id));
  grpc::Status s = Traits::Unary(client->stub(), &ctx, request, &response);
  if (!s.ok()) return FromGrpcStatus(s, Traits::kRpc);
  return response.stats().request_id();
}

template <class Params>
absl::StatusOr<uint64_t> PrepareCall(Client* client, const Params& p, const std::string& lease_id,
                                     absl::Duration timeout) {
  using Traits = OpTraits<Params>;
  v1::PrepareCallRequest request;
  request.set_lease_id(lease_id);
  typename Traits::Request* op = internal::PreparedField<typename Traits::Request>(&request);
  if (op == nullptr) return absl::InternalError("PrepareCall: no field for this op");
  if (absl::Status s = BuildRequest(p, &client->regions(), /*inline_only=*/false, op); !s.ok()) {
    return s;
  }
  return internal::PrepareCallRpc(client, request, timeout);
}

namespace internal {

absl::StatusOr<uint64_t> PrepareCallRpc(Client* client, const v1::PrepareCallRequest& request,
                                        absl::Duration timeout) {
  v1::PrepareCallResponse response;
  grpc::ClientContext ctx;
  SetTimeout(&ctx, timeout);
  grpc::Status s = client->stub()->PrepareCall(&ctx, request, &response);
  if (!s.ok()) return FromGrpcStatus(s, "PrepareCall");
  return response.call_id();
}

}  // namespace internal

absl::StatusOr<v1::CallStats> RunPrepared(Client* client, uint64_t call_id,
                                          const std::optional<Signal>& ready,
                                          const std::optional<Signal>& done,
                                          absl::Duration timeout) {
  v1::RunPreparedRequest request;
  request.set_call_id(call_id);
  if (ready) *request.mutable_ready() = ToProto(*ready);
  if (done) *request.mutable_done() = ToProto(*done);
  v1::RunPreparedResponse response;
  grpc::ClientContext ctx;
  SetTimeout(&ctx, timeout);
  grpc::Status s = client->wait_spin() > absl::ZeroDuration()
                       ? PolledUnary(
                             [&](grpc::CompletionQueue* cq) {
                               return client->stub()->PrepareAsyncRunPrepared(&ctx, request, cq);
                             },
                             &response, client->wait_spin())
                       : client->stub()->RunPrepared(&ctx, request, &response);
  if (!s.ok()) return FromGrpcStatus(s, "RunPrepared");
  return response.stats();
}

absl::Status ReleaseCall(Client* client, uint64_t call_id, absl::Duration timeout) {
  v1::ReleaseCallRequest request;
  request.set_call_id(call_id);
  v1::ReleaseCallResponse response;
  grpc::ClientContext ctx;
  SetTimeout(&ctx, timeout);
  grpc::Status s = client->stub()->ReleaseCall(&ctx, request, &response);
  return s.ok() ? absl::OkStatus() : FromGrpcStatus(s, "ReleaseCall");
}

uint64_t LoadSignal(const uint64_t* word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }

void StoreSignal(uint64_t* word, uint64_t v) { __atomic_store_n(word, v, __ATOMIC_RELEASE); }

absl::StatusOr<uint64_t> WaitSignal(const uint64_t* word, uint64_t value, absl::Duration timeout,
                                    absl::Duration spin) {
  return internal::WaitSignalUnless(word, value, timeout, spin, nullptr);
}

namespace internal {

absl::StatusOr<uint64_t> WaitSignalUnless(const uint64_t* word, uint64_t value,
                                          absl::Duration timeout, absl::Duration spin,
                                          const std::function<absl::Status()>& check) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  const absl::Time spin_until = start + std::min(spin, timeout);
  bool spinning = spin > absl::ZeroDuration();
  for (uint64_t i = 1;; ++i) {
    const uint64_t v = LoadSignal(word);
    if ((v & ~kSignalFailureBit) >= value) {
      if (v & kSignalFailureBit) {
        return absl::AbortedError(absl::StrCat("the call failed: done = ", v & ~kSignalFailureBit,
                                               " | failure bit (2^62)"));
      }
      return v;
    }
    if (spinning) {
      attnd::CpuRelax();
      if (i % 64 != 0) continue;
      spinning = absl::Now() < spin_until;
      continue;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("signal word is ", v, ", not ", value,
                                                      " after ", absl::FormatDuration(timeout)));
    }
    if (check) {
      if (absl::Status c = check(); !c.ok()) return c;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace internal

#define ATTND_CLIENT_STREAM_ORDERED(ParamsT)                                                       \
  template absl::StatusOr<uint64_t> Enqueue(Client*, const ParamsT&, const std::optional<Signal>&, \
                                            const std::optional<Signal>&, const CallOptions&);     \
  template absl::StatusOr<uint64_t> PrepareCall(Client*, const ParamsT&, const std::string&,       \
                                                absl::Duration);
ATTND_CLIENT_FOR_EACH_PARAMS(ATTND_CLIENT_STREAM_ORDERED)
#undef ATTND_CLIENT_STREAM_ORDERED

}  // namespace attnd::client
