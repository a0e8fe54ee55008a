"""Stream-ordered calls and prepared calls (docs/SERVICE.md "Stream-ordered calls and prepared
calls"): an op call that names a `ready` and/or `done` signal word is answered at once
("enqueued"); the daemon runs it once the word at `ready` is >= its value and then stores `done`
(value, or value | FAILURE_BIT when the call failed or never ran). The words live in a host
region of the caller's; on a GPU the caller's own stream can write and wait on them
(cuda_signals.py).

    word_in, word_out = SignalWord(region), SignalWord(region)     # 8-byte words in a HostRegion
    client.enqueue("sparse_mla", ready=word_in.signal(1), done=word_out.signal(1),
                   q=q, kv=kv, indices=idx, sm_scale=0.07, out=out_view, lse=lse_view)
    ...produce the inputs...; word_in.set(1)
    word_out.wait(1, timeout=5)                                     # AttndError on the failure bit
    call_id = client.prepare_call("sparse_mla", q=q, kv=kv, ...)     # every tensor in a region
    client.run_prepared(call_id)                                    # blocking: its CallStats
    client.run_prepared(call_id, ready=word_in.signal(2), done=word_out.signal(2))
    client.release_call(call_id)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from . import ops as _ops
from . import rings as _rings
from . import torch_support as _torch_support
from ._proto import pb
from .errors import AttndError, ErrorDetails

if TYPE_CHECKING:
    from .regions import HostRegion

# Set in a `done` word when its call failed or never ran: done == value | FAILURE_BIT. Bit 62, so
# that a GPU stream waiting for done >= value (a cyclic compare) also ends on a failed call's word
# (docs/SERVICE.md "Failure bit"). Signal values must be below it: the daemon refuses a ready or
# done value >= 2^62 (INVALID_ARGUMENT).
FAILURE_BIT = 1 << 62


@dataclass(frozen=True)
class Signal:
    """A signal of one call: the u64 word at `offset` bytes into region `region`, and `value`."""

    region: str
    offset: int
    value: int

    def to_pb(self) -> pb.Signal:
        return pb.Signal(
            slice=pb.RegionSlice(region=self.region, offset=self.offset), value=self.value
        )


class SignalWord:
    """The caller's side of a signal word: 8 bytes (8-byte aligned) of a HostRegion, zeroed."""

    def __init__(self, region: HostRegion, offset: int | None = None) -> None:
        self.region = region
        view = region.array("u8", 8, offset=offset, align=8)
        self.offset = int(view.__array_interface__["data"][0] - region.address)
        self._word = view.view(np.uint64)  # one aligned 8-byte load/store per access
        self._word[0] = 0

    def signal(self, value: int) -> Signal:
        """A Signal naming this word with `value` (for ready= / done=)."""
        return Signal(self.region.name, self.offset, int(value))

    def set(self, value: int) -> None:
        """Stores `value` (the daemon may read it at once)."""
        self._word[0] = np.uint64(value)

    def get(self) -> int:
        return int(self._word[0])

    def wait(
        self,
        value: int,
        timeout: float | None = None,
        poll: float = 50e-6,
        spin: float = 0.0,
        check: Callable[[], None] | None = None,
    ) -> int:
        """Waits until the word's value (FAILURE_BIT aside) is >= `value`: the word. AttndError
        ABORTED when it carries FAILURE_BIT then (a call at `value` or later failed), or
        DEADLINE_EXCEEDED when `timeout` seconds pass first. An earlier call's failure (the bit
        with a lower value) does not end the wait, unlike a GPU stream's wait on the word
        (docs/SERVICE.md "Failure bit"). It looks without sleeping for the first `spin` seconds
        (a core busy), then every `poll` seconds; `check` (called between sleeps) may end the
        wait by raising."""
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        spin_until = start + spin if deadline is None else min(start + spin, deadline)
        word = self._word
        while True:
            got = int(word[0])
            if got & ~FAILURE_BIT >= value:
                if got & FAILURE_BIT:
                    raise AttndError(
                        grpc.StatusCode.ABORTED,
                        f"signal word {self.region.name}+{self.offset}: the call failed "
                        f"(done = {got & ~FAILURE_BIT} | FAILURE_BIT)",
                    )
                return got
            now = time.monotonic()
            if now < spin_until:
                continue
            if deadline is not None and now >= deadline:
                raise AttndError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"signal word {self.region.name}+{self.offset}: {got} < {value} after "
                    f"{timeout} s",
                )
            if check is not None:
                check()
            time.sleep(poll)


@dataclass(frozen=True)
class CallFailure:
    """A Session's stream-ordered call that failed after its "enqueued" reply."""

    request_id: int  # the client's (the SessionCall's request_id)
    server_request_id: int
    op: str
    code: grpc.StatusCode
    message: str
    error_details: ErrorDetails = field(default_factory=ErrorDetails)  # the google.rpc causes


def set_signals(request: Any, ready: Signal | None, done: Signal | None) -> None:
    if ready is not None:
        request.ready.CopyFrom(ready.to_pb())
    if done is not None:
        request.done.CopyFrom(done.to_pb())


def build_stream_ordered(
    codec: Any, op: str, ready: Signal | None, done: Signal | None, arguments: dict[str, Any]
) -> tuple[_ops.OpSpec, Any]:
    """(spec, request) of a stream-ordered op call; outputs must be placed in regions."""
    if ready is None and done is None:
        raise ValueError("a stream-ordered call needs ready= and/or done=")
    spec = _ops.spec(op)
    if ready is not None:
        # The caller's stream orders the inputs (it writes `ready` after producing them): CUDA
        # tensors are referenced without a device synchronise.
        with _torch_support.ordered_by_ready():
            request, _ = _ops.build_request(spec, codec, arguments)
    else:
        request, _ = _ops.build_request(spec, codec, arguments)
    set_signals(request, ready, done)
    return spec, request


def prepare_request(codec: Any, op: str, lease_id: str, arguments: dict[str, Any]) -> Any:
    spec = _ops.spec(op)
    request, _ = _ops.build_request(spec, codec, arguments)
    message = pb.PrepareCallRequest(lease_id=lease_id)
    getattr(message, spec.session_field).CopyFrom(request)
    return message


def run_request(call_id: int, ready: Signal | None, done: Signal | None) -> pb.RunPreparedRequest:
    request = pb.RunPreparedRequest(call_id=call_id)
    set_signals(request, ready, done)
    return request


class StreamOrderedClient(_rings.RingCallerFactory):
    """Client methods (mixed into Client): unary stream-ordered and prepared calls. Unary
    stream-ordered calls are ordered per connection (this Client's channel)."""

    _codec: Any
    _stub: Any
    _timeout: Callable[[float | None], float | None]

    def enqueue(
        self,
        op: str,
        ready: Signal | None = None,
        done: Signal | None = None,
        timeout: float | None = None,
        **arguments: Any,
    ) -> int:
        """Queues a stream-ordered op call; returns the daemon's request id once enqueued. Its
        outputs must be region views; `timeout` also bounds the wait for `ready`."""
        spec, request = build_stream_ordered(self._codec, op, ready, done, arguments)
        try:
            response = getattr(self._stub, spec.rpc)(request, timeout=self._timeout(timeout))
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None
        return int(response.stats.request_id)

    def prepare_call(
        self, op: str, lease_id: str = "", timeout: float | None = None, **arguments: Any
    ) -> int:
        """Prepares an op call whose tensors all lie in regions; returns its call id."""
        request = prepare_request(self._codec, op, lease_id, arguments)
        try:
            return int(self._stub.PrepareCall(request, timeout=self._timeout(timeout)).call_id)
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None

    def run_prepared(
        self,
        call_id: int,
        ready: Signal | None = None,
        done: Signal | None = None,
        timeout: float | None = None,
    ) -> pb.CallStats:
        """Runs a prepared call: blocking without signals (its CallStats), else enqueued
        (CallStats with enqueued and request_id only)."""
        try:
            return self._stub.RunPrepared(
                run_request(call_id, ready, done), timeout=self._timeout(timeout)
            ).stats
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None

    def release_call(self, call_id: int, timeout: float | None = None) -> None:
        try:
            self._stub.ReleaseCall(
                pb.ReleaseCallRequest(call_id=call_id), timeout=self._timeout(timeout)
            )
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None

    def open_ring(
        self,
        region: HostRegion,
        offset: int = 0,
        entries: int = 256,
        signals: HostRegion | str | None = None,
        lease_id: str = "",
        timeout: float | None = None,
    ) -> _rings.SubmissionRing:
        """Opens a submission ring of `entries` slots (a power of two up to 4096) at `offset`
        (a multiple of 64) in `region`; its entries' ready and done words lie in `signals`
        (None: `region`), or in the registered region of that name (a str: typically a device
        region, whose words the caller's stream writes and waits on; SubmissionRing.call then
        refuses, as this process cannot poll them). Entries run on this connection's ordered
        queue (rings.py)."""
        request = _rings.open_request(region, offset, entries, signals, lease_id)
        try:
            response = self._stub.OpenRing(request, timeout=self._timeout(timeout))
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None
        return _rings.SubmissionRing(self, response.ring_id, region, offset, entries, signals)

    def close_ring(self, ring_id: int, timeout: float | None = None) -> None:
        try:
            self._stub.CloseRing(
                pb.CloseRingRequest(ring_id=ring_id), timeout=self._timeout(timeout)
            )
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None
