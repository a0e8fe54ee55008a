"""Session: one bidirectional stream to attnd holding a lease (regions registered through the
session die with it, however it ends) and carrying pipelined calls: submit() returns at once,
replies come back out of order and are matched by request id.

    with client.session("decoder-rank0") as s:
        region = s.create_host_region("kv", 64 << 20)          # tied to s.lease_id
        calls = [s.submit("sparse_mla", q=q, kv=kv, indices=i, sm_scale=0.07) for i in idx]
        outs = [c.result().out for c in calls]
        slow = s.submit("mla_prefill", ..., timeout=0.5)       # a per-call deadline, server-side
        slow.cancel()                                          # SessionCancel (queued or running)
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Literal, Self, TypeVar, overload

import grpc

from . import ops as _ops
from . import rings as _rings
from . import stream_ordered as _so
from ._proto import pb
from .errors import AttndError, parse_status_details, status_code
from .regions import HostRegion, ShmObject

if TYPE_CHECKING:
    from .client import Client

_END = object()
_T = TypeVar("_T")


class SessionCall(Generic[_T]):
    """A call in a session: result(timeout) -> its payload (OpResult for ops), cancel()."""

    def __init__(
        self, session: Session, request_id: int, decode: Callable[[pb.SessionResponse], _T]
    ) -> None:
        self.request_id = request_id
        self._session = session
        self._decode = decode
        self._event = threading.Event()
        self._response: pb.SessionResponse | None = None
        self._error: BaseException | None = None

    def _set(
        self, response: pb.SessionResponse | None = None, error: BaseException | None = None
    ) -> None:
        self._response, self._error = response, error
        self._event.set()

    def done(self) -> bool:
        """Whether the reply (or the stream's end) has arrived."""
        return self._event.is_set()

    def result(self, timeout: float | None = None) -> _T:
        """The call's payload; AttndError when it failed, TimeoutError after `timeout` s."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"session call {self.request_id}: no reply after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._response is not None  # _set gave a response or an error
        if self._response.code != 0:
            raise AttndError(
                status_code(self._response.code),
                self._response.message,
                parse_status_details(self._response.status_details),
            )
        return self._decode(self._response)

    def exception(self, timeout: float | None = None) -> AttndError | None:
        """The AttndError the call ended with, or None once it succeeded."""
        try:
            self.result(timeout)
        except AttndError as e:
            return e
        return None

    def cancel(self) -> None:
        """Asks the daemon to cancel this call, queued or running (its reply then carries
        CANCELLED unless it already finished)."""
        if not self.done():
            self._session._send(
                pb.SessionRequest(cancel=pb.SessionCancel(target_request_id=self.request_id)),
                expect_reply=False,
            )


class Session(_ops.OpCalls[_ops.OpResult], _rings.RingCallerFactory):
    def __init__(
        self,
        client: Client,
        client_name: str = "",
        timeout: float | None = None,
        open_timeout: float = 60.0,
    ) -> None:
        self.client = client
        self._ids = itertools.count(1)
        self._requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending: dict[int, SessionCall[Any]] = {}
        self._closed = False
        self._regions: dict[str, HostRegion] = {}
        # Stream-ordered calls that failed after their "enqueued" reply (stream_ordered).
        self.failures: queue.SimpleQueue[_so.CallFailure] = queue.SimpleQueue()
        self.on_failure: Callable[[_so.CallFailure], None] | None = None
        self._stream = client._stub.Session(self._request_iterator(), timeout=timeout)
        self._reader = threading.Thread(target=self._read, name="attnd-session", daemon=True)
        self._reader.start()
        opened = self._send(pb.SessionRequest(open=pb.SessionOpen(client_name=client_name)))
        self.lease_id = opened.result(open_timeout).opened.lease_id

    # ---- stream plumbing ----

    def _request_iterator(self) -> Iterator[pb.SessionRequest]:
        while True:
            item = self._requests.get()
            if item is _END:
                return
            yield item

    @overload
    def _send(self, request: pb.SessionRequest) -> SessionCall[pb.SessionResponse]: ...

    @overload
    def _send(
        self, request: pb.SessionRequest, decode: Callable[[pb.SessionResponse], _T]
    ) -> SessionCall[_T]: ...

    @overload
    def _send(
        self,
        request: pb.SessionRequest,
        decode: Callable[[pb.SessionResponse], Any] = ...,
        *,
        expect_reply: Literal[False],
    ) -> None: ...

    def _send(
        self,
        request: pb.SessionRequest,
        decode: Callable[[pb.SessionResponse], Any] = lambda r: r,
        expect_reply: bool = True,
    ) -> SessionCall[Any] | None:
        call = None
        with self._lock:
            if self._closed:
                raise AttndError(grpc.StatusCode.FAILED_PRECONDITION, "session is closed")
            request.request_id = next(self._ids)
            if expect_reply:
                call = SessionCall(self, request.request_id, decode)
                self._pending[request.request_id] = call
            self._requests.put(request)
        return call

    def _read(self) -> None:
        error = AttndError(grpc.StatusCode.UNAVAILABLE, "session stream ended")
        try:
            for response in self._stream:
                if response.HasField("call_failed"):
                    self._call_failed(response)
                    continue
                with self._lock:
                    call = self._pending.pop(response.request_id, None)
                if call is not None:
                    call._set(response=response)
        except grpc.RpcError as e:
            error = AttndError.from_rpc_error(e)
        with self._lock:
            pending, self._pending = self._pending, {}
            self._closed = True
        for call in pending.values():
            call._set(error=error)

    def close(self, timeout: float = 60.0) -> None:
        """Half-closes the stream, waits for pending replies (the daemon then ends the stream
        and the lease: every region of this session is removed), and unmaps its host regions."""
        with self._lock:
            already = self._closed
            self._closed = True
        if not already:
            self._requests.put(_END)
        self._reader.join(timeout)
        if self._reader.is_alive():
            self._stream.cancel()
            self._reader.join(timeout)
        self._drop_regions()

    def abort(self) -> None:
        """Cancels the stream at once (in-flight calls fail; the lease ends)."""
        with self._lock:
            self._closed = True
        self._stream.cancel()
        self._reader.join(30)
        self._drop_regions()

    def _drop_regions(self) -> None:
        for region in list(self._regions.values()):
            self.client._forget_region(region)
            region.close(unregister=False)
        self._regions.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- regions (tied to the lease) ----

    def register_host_region(
        self, name: str, key: str, byte_size: int, offset: int = 0, timeout: float = 60.0
    ) -> None:
        """As Client.register_host_region, under this session's lease."""
        request = pb.SessionRequest(
            register_host_region=pb.RegisterHostRegionRequest(
                name=name, key=key, offset=offset, byte_size=byte_size
            )
        )
        self._send(request).result(timeout)

    def register_device_region(
        self,
        name: str,
        raw_handle: bytes,
        device_uuid: str,
        byte_size: int,
        offset: int = 0,
        timeout: float = 60.0,
    ) -> None:
        """As Client.register_device_region, under this session's lease."""
        request = pb.SessionRequest(
            register_device_region=pb.RegisterDeviceRegionRequest(
                name=name,
                raw_handle=raw_handle,
                device_uuid=device_uuid,
                offset=offset,
                byte_size=byte_size,
            )
        )
        self._send(request).result(timeout)

    def unregister_region(self, name: str = "", timeout: float = 60.0) -> list[str]:
        """Unregisters `name` (empty: every region of this lease); waits for in-flight use."""
        request = pb.SessionRequest(unregister_region=pb.UnregisterRegionRequest(name=name))
        removed = list(self._send(request).result(timeout).unregister_region.removed)
        for n in removed:
            region = self._regions.pop(n, None)
            if region is not None:
                self.client._forget_region(region)
                region.registered = False
        return removed

    def submit_unregister(self, name: str = "") -> SessionCall[list[str]]:
        """Pipelined unregister: returns the SessionCall at once."""
        request = pb.SessionRequest(unregister_region=pb.UnregisterRegionRequest(name=name))
        return self._send(request, decode=lambda r: list(r.unregister_region.removed))

    def submit_register_host_region(
        self, name: str, key: str, byte_size: int, offset: int = 0
    ) -> SessionCall[pb.SessionResponse]:
        """Pipelined register: returns the SessionCall at once."""
        return self._send(
            pb.SessionRequest(
                register_host_region=pb.RegisterHostRegionRequest(
                    name=name, key=key, offset=offset, byte_size=byte_size
                )
            )
        )

    def create_host_region(
        self, name: str, byte_size: int, key: str | None = None, unlink_early: bool = True
    ) -> HostRegion:
        """As Client.create_host_region, registered under this session's lease."""
        shm = ShmObject(byte_size, key)
        try:
            self.register_host_region(name, shm.key, byte_size)
        except BaseException:
            shm.close()
            raise
        if unlink_early:
            shm.unlink()
        region = HostRegion(self, name, shm, lease_id=self.lease_id)
        self._regions[name] = region
        self.client._add_region(region)
        return region

    def _release_region(self, region: HostRegion) -> None:
        self._regions.pop(region.name, None)
        self.client._forget_region(region)
        if not self._closed:
            try:
                self.unregister_region(region.name)
            except AttndError as e:
                if e.code != grpc.StatusCode.NOT_FOUND:
                    raise

    def device_uuids(self) -> list[str]:
        return self.client.device_uuids()

    # ---- ops ----

    def submit(
        self, op: str, timeout: float | None = None, **arguments: Any
    ) -> SessionCall[_ops.OpResult]:
        """Starts an op call on the stream; `timeout` (seconds) is enforced by the daemon."""
        spec = _ops.spec(op)
        request, sinks = _ops.build_request(spec, self.client._codec, arguments)
        message = pb.SessionRequest(timeout_seconds=timeout or 0)
        getattr(message, spec.session_field).CopyFrom(request)
        return self._send(
            message,
            decode=lambda r: _ops.decode_response(spec, getattr(r, spec.session_field), sinks),
        )

    def call(self, op: str, timeout: float | None = None, **arguments: Any) -> _ops.OpResult:
        """Runs an op call on the stream and returns its OpResult (AttndError on failure)."""
        return self.submit(op, timeout=timeout, **arguments).result()

    # ---- stream-ordered and prepared calls (stream_ordered) ----

    def _call_failed(self, response: pb.SessionResponse) -> None:
        failure = _so.CallFailure(
            request_id=response.request_id,
            server_request_id=response.call_failed.server_request_id,
            op=response.call_failed.op,
            code=status_code(response.code),
            message=response.message,
            error_details=parse_status_details(response.status_details),
        )
        self.failures.put(failure)
        if self.on_failure is not None:
            self.on_failure(failure)

    def enqueue(
        self,
        op: str,
        ready: _so.Signal | None = None,
        done: _so.Signal | None = None,
        timeout: float | None = None,
        **arguments: Any,
    ) -> SessionCall[int]:
        """Queues a stream-ordered op call behind this session's earlier ones; the SessionCall
        gives the daemon's request id once enqueued. A later failure comes to `failures` (and
        `on_failure`) with the same request_id, and its done word gets the failure bit."""
        spec, request = _so.build_stream_ordered(self.client._codec, op, ready, done, arguments)
        message = pb.SessionRequest(timeout_seconds=timeout or 0)
        getattr(message, spec.session_field).CopyFrom(request)
        return self._send(
            message,
            decode=lambda r: int(getattr(r, spec.session_field).stats.request_id),
        )

    def prepare_call(self, op: str, timeout: float = 60.0, **arguments: Any) -> int:
        """Prepares an op call (every tensor in a region) under this session's lease."""
        message = pb.SessionRequest(
            prepare_call=_so.prepare_request(self.client._codec, op, "", arguments)
        )
        return int(self._send(message).result(timeout).prepare_call.call_id)

    def run_prepared(
        self,
        call_id: int,
        ready: _so.Signal | None = None,
        done: _so.Signal | None = None,
        timeout: float | None = None,
    ) -> SessionCall[pb.CallStats]:
        """Runs a prepared call on the stream (stream-ordered when a signal is given)."""
        message = pb.SessionRequest(
            timeout_seconds=timeout or 0, run_prepared=_so.run_request(call_id, ready, done)
        )
        return self._send(message, decode=lambda r: r.run_prepared.stats)

    def release_call(self, call_id: int, timeout: float = 60.0) -> None:
        message = pb.SessionRequest(release_call=pb.ReleaseCallRequest(call_id=call_id))
        self._send(message).result(timeout)

    def open_ring(
        self,
        region: HostRegion,
        offset: int = 0,
        entries: int = 256,
        signals: HostRegion | str | None = None,
        timeout: float = 60.0,
    ) -> _rings.SubmissionRing:
        """Opens a submission ring under this session's lease (rings.py): its entries run on
        the session's ordered queue and are cancelled with the stream. `signals` as in
        Client.open_ring."""
        request = _rings.open_request(region, offset, entries, signals, "")
        response = self._send(pb.SessionRequest(open_ring=request)).result(timeout)
        return _rings.SubmissionRing(
            self, response.open_ring.ring_id, region, offset, entries, signals
        )

    def close_ring(self, ring_id: int, timeout: float | None = 60.0) -> None:
        message = pb.SessionRequest(close_ring=pb.CloseRingRequest(ring_id=ring_id))
        self._send(message).result(timeout)
