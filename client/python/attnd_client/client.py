"""Client: one channel to an attnd daemon (unix socket or TCP, optionally TLS / mutual TLS) with
typed op calls (ops.OpCalls), regions, health, info and sessions.

    with Client("unix:/run/attnd/attnd.sock") as client:
        client.wait_ready()
        res = client.mla_decode(q=q, kv_cache=cache, block_table=bt, cache_seqlens=lens,
                                sm_scale=0.0417)
    tls = Client("node:50051", root_certificates="ca.pem", private_key="client.key",
                 certificate_chain="client.pem")           # mTLS; paths or PEM bytes
Thread-safe: calls may be made from many threads at once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, Self, TypedDict, Unpack

import grpc

from . import health as _health
from . import ops as _ops
from ._proto import pb, pb_grpc
from .errors import AttndError
from .regions import HostRegion, ShmObject
from .stream_ordered import StreamOrderedClient
from .tensors import RegionRef, Sink, TensorCodec

if TYPE_CHECKING:
    import torch

    from .session import Session
    from .torch_support import DeviceRegionCache

# A PEM for TLS: its bytes, or the path of a file holding it.
Pem = bytes | str | os.PathLike[str]

DEFAULT_MAX_MESSAGE_BYTES = 512 << 20  # attnd's --max-message-bytes default


def _pem(value: Pem | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


class ChannelArgs(TypedDict, total=False):
    """The keyword arguments of Client and aio.AsyncClient (after `target`).

    TLS when tls=True or any PEM is given (paths or bytes): root_certificates verifies the
    server, private_key + certificate_chain is the client's identity for mTLS; server_name
    overrides the name checked in the server's certificate. max_message_bytes bounds both
    directions (attnd's --max-message-bytes default); options are extra gRPC channel arguments.
    timeout: the default seconds per call (None: no deadline)."""

    root_certificates: Pem | None
    private_key: Pem | None
    certificate_chain: Pem | None
    tls: bool
    server_name: str | None
    max_message_bytes: int
    options: Iterable[tuple[str, Any]]
    timeout: float | None


class ChannelFactory(Protocol):
    def __call__(
        self,
        target: str,
        credentials: grpc.ChannelCredentials | None,
        options: list[tuple[str, Any]],
    ) -> Any: ...


def open_channel(
    target: str, factory: ChannelFactory, args: ChannelArgs
) -> tuple[Any, float | None]:
    """The channel `factory` opens for `target` with `args`, and the default timeout."""
    opts: list[tuple[str, Any]] = [
        (
            "grpc.max_receive_message_length",
            args.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES),
        ),
        ("grpc.max_send_message_length", args.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)),
    ]
    if args.get("server_name"):
        opts.append(("grpc.ssl_target_name_override", args["server_name"]))
    opts.extend(args.get("options", ()))
    pems = [args.get(k) for k in ("root_certificates", "private_key", "certificate_chain")]
    creds = None
    if args.get("tls", False) or any(pems):
        creds = grpc.ssl_channel_credentials(*(_pem(p) for p in pems))
    return factory(target, creds, opts), args.get("timeout")


def _sync_channel(
    target: str, credentials: grpc.ChannelCredentials | None, options: list[tuple[str, Any]]
) -> grpc.Channel:
    if credentials is not None:
        return grpc.secure_channel(target, credentials, options=options)
    return grpc.insecure_channel(target, options=options)


class OpFuture:
    """A unary op call in flight: result(timeout) -> OpResult (raises AttndError), cancel()."""

    def __init__(
        self, op_spec: _ops.OpSpec, future: grpc.Future, sinks: dict[str, Sink], keep: object
    ) -> None:
        self._spec, self._future, self._sinks = op_spec, future, sinks
        self._keep = keep  # the request (and its buffers) until the call ends

    def result(self, timeout: float | None = None) -> _ops.OpResult:
        try:
            response = self._future.result(timeout=timeout)
        except grpc.FutureCancelledError:
            raise AttndError(grpc.StatusCode.CANCELLED, "cancelled by the client") from None
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None
        return _ops.decode_response(self._spec, response, self._sinks)

    def exception(self, timeout: float | None = None) -> AttndError | None:
        """The AttndError the call ended with, or None once it succeeded."""
        try:
            self.result(timeout)
        except AttndError as e:
            return e
        return None

    def cancel(self) -> bool:
        """Cancels the call; False when it already ended."""
        return self._future.cancel()

    def done(self) -> bool:
        return self._future.done()


class Client(StreamOrderedClient, _ops.OpCalls[_ops.OpResult]):
    def __init__(self, target: str, **args: Unpack[ChannelArgs]) -> None:
        """`target`: "unix:/path" or "host:port"; `args`: see ChannelArgs (TLS, message size,
        channel options, the default timeout per call)."""
        self.target = target
        self._channel, self.timeout = open_channel(target, _sync_channel, args)
        self._stub = pb_grpc.AttentionStub(self._channel)
        self._health = _health.HealthStub(self._channel)
        self._lock = threading.Lock()
        # name -> HostRegion registered through this client or its sessions
        self._regions: dict[str, HostRegion] = {}
        self._device_regions: DeviceRegionCache | None = None
        self._device_uuids: list[str] | None = None
        self._codec = TensorCodec(self._find_region, self._device_region)

    # ---- lifecycle ----

    def close(self, unregister: bool = True) -> None:
        """Closes the host regions created through this client (unregistering them when
        `unregister`), the device regions it registered, and the channel."""
        with self._lock:
            regions = list(self._regions.values())
        for region in regions:
            try:
                region.close(unregister=unregister)
            except AttndError:
                pass
        if self._device_regions is not None:
            self._device_regions.clear()  # unregisters them (best effort)
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rpc(self, method: Callable[..., Any], request: Any, timeout: float | None = None) -> Any:
        try:
            return method(request, timeout=self._timeout(timeout))
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    # ---- service ----

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Blocks until the channel connects and health reports SERVING (AttndError else)."""
        deadline = time.monotonic() + timeout
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise AttndError(
                grpc.StatusCode.UNAVAILABLE, f"{self.target}: not connected after {timeout} s"
            ) from None
        status = None
        while time.monotonic() < deadline:
            status = self.health(timeout=max(0.1, deadline - time.monotonic()))
            if status == "SERVING":
                return
            time.sleep(0.05)
        raise AttndError(grpc.StatusCode.UNAVAILABLE, f"{self.target}: health is {status}")

    def health(self, service: str = "", timeout: float | None = None) -> str:
        """grpc.health.v1 status name: "SERVING", "NOT_SERVING", ..."""
        try:
            return self._health.check(service, timeout=self._timeout(timeout))
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None

    def watch_health(self, service: str = "", timeout: float | None = None) -> _health.HealthWatch:
        """A grpc call iterating status names as they change (cancel() it to stop)."""
        return self._health.watch(service, timeout=timeout)

    def info(self, timeout: float | None = None) -> pb.GetInfoResponse:
        """attnd.v1.GetInfoResponse: version, backend, devices, ops, limits."""
        return self._rpc(self._stub.GetInfo, pb.GetInfoRequest(), timeout)

    def device_uuids(self) -> list[str]:
        """The UUIDs of the daemon's devices (GetInfo, asked once)."""
        if self._device_uuids is None:
            self._device_uuids = [d.uuid for d in self.info().devices]
        return self._device_uuids

    # ---- regions ----

    def register_host_region(
        self,
        name: str,
        key: str,
        byte_size: int,
        offset: int = 0,
        lease_id: str = "",
        timeout: float | None = None,
    ) -> None:
        """Registers the shm object `key` (bytes [offset, offset + byte_size)) as region `name`."""
        self._rpc(
            self._stub.RegisterHostRegion,
            pb.RegisterHostRegionRequest(
                name=name, key=key, offset=offset, byte_size=byte_size, lease_id=lease_id
            ),
            timeout,
        )

    def register_device_region(
        self,
        name: str,
        raw_handle: bytes,
        device_uuid: str,
        byte_size: int,
        offset: int = 0,
        lease_id: str = "",
        timeout: float | None = None,
    ) -> None:
        """Registers device memory (a CUDA IPC handle on device `device_uuid`) as region `name`."""
        self._rpc(
            self._stub.RegisterDeviceRegion,
            pb.RegisterDeviceRegionRequest(
                name=name,
                raw_handle=raw_handle,
                device_uuid=device_uuid,
                offset=offset,
                byte_size=byte_size,
                lease_id=lease_id,
            ),
            timeout,
        )

    def unregister_region(
        self, name: str = "", lease_id: str = "", timeout: float | None = None
    ) -> list[str]:
        """Unregisters `name` (empty: every region without a lease, or every region of
        `lease_id`); returns once their in-flight requests ended, with the removed names."""
        response = self._rpc(
            self._stub.UnregisterRegion,
            pb.UnregisterRegionRequest(name=name, lease_id=lease_id),
            timeout,
        )
        with self._lock:
            for removed in response.removed:
                region = self._regions.pop(removed, None)
                if region is not None:
                    region.registered = False
        return list(response.removed)

    def submit_unregister(self, name: str, timeout: float | None = None) -> grpc.Future:
        """UnregisterRegion without waiting (the device regions of dead storages go this way): a
        grpc.Future of the reply. The name is free at once, the memory unmapped once no in-flight
        request uses it; a host region's HostRegion is not told (use unregister_region)."""
        return self._stub.UnregisterRegion.future(
            pb.UnregisterRegionRequest(name=name), timeout=self._timeout(timeout)
        )

    def list_regions(self, timeout: float | None = None) -> list[pb.RegionInfo]:
        """[attnd.v1.RegionInfo] of this client's regions (every process of its uid on the unix
        socket; docs/SERVICE.md "Trust model")."""
        return list(self._rpc(self._stub.ListRegions, pb.ListRegionsRequest(), timeout).regions)

    def create_host_region(
        self,
        name: str,
        byte_size: int,
        key: str | None = None,
        unlink_early: bool = True,
        lease_id: str = "",
    ) -> HostRegion:
        """Creates a shm object of byte_size bytes, registers it as region `name` (under
        `lease_id` when given) and returns the HostRegion (see regions.py for who unlinks)."""
        shm = ShmObject(byte_size, key)
        try:
            self.register_host_region(name, shm.key, byte_size, lease_id=lease_id)
        except BaseException:
            shm.close()
            raise
        if unlink_early:
            shm.unlink()
        region = HostRegion(self, name, shm, lease_id=lease_id)
        self._add_region(region)
        return region

    def _add_region(self, region: HostRegion) -> None:
        with self._lock:
            self._regions[region.name] = region

    def _forget_region(self, region: HostRegion) -> None:
        with self._lock:
            if self._regions.get(region.name) is region:
                del self._regions[region.name]

    def _release_region(self, region: HostRegion) -> None:
        self._forget_region(region)
        try:
            self.unregister_region(region.name, lease_id=region.lease_id)
        except AttndError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:  # already gone (unregister-all, lease end)
                raise

    def _find_region(self, address: int, nbytes: int) -> tuple[str, int] | None:
        with self._lock:
            for region in self._regions.values():
                if region.contains(address, nbytes):
                    return region.name, region.address
        return None

    def device_regions(
        self, keep_alive: bool | None = None, max_regions: int | None = None
    ) -> DeviceRegionCache:
        """The cache of the device regions of this client's CUDA tensors (torch_support.
        DeviceRegionCache: storages held weakly, a dead one's region unregistered on the next
        call; keep_alive=True pins them until close()), made on first use with the options
        given (defaults keep_alive=False, max_regions=DEFAULT_MAX_REGIONS; a CUDA tensor
        argument makes it with the defaults). Later calls return it; ValueError when an option
        given differs from the one it was made with (an option left None matches any)."""
        from .torch_support import DEFAULT_MAX_REGIONS, DeviceRegionCache

        with self._lock:
            if self._device_regions is None:
                self._device_regions = DeviceRegionCache(
                    self,
                    keep_alive=bool(keep_alive),
                    max_regions=DEFAULT_MAX_REGIONS if max_regions is None else max_regions,
                )
            cache = self._device_regions
        if (keep_alive is not None and cache.keep_alive != keep_alive) or (
            max_regions is not None and cache.max_regions != max_regions
        ):
            raise ValueError(
                f"the device region cache exists with keep_alive={cache.keep_alive}, "
                f"max_regions={cache.max_regions}"
            )
        return cache

    def _device_region(self, tensor: torch.Tensor) -> RegionRef:
        with self._lock:
            cache = self._device_regions
        if cache is None:
            cache = self.device_regions()
        assert cache is not None
        return cache.ref(tensor)

    # ---- ops ----

    def submit(
        self,
        op: str,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str | bytes]] | None = None,
        **arguments: Any,
    ) -> OpFuture:
        """Starts an op call; returns an OpFuture."""
        spec = _ops.spec(op)
        request, sinks = _ops.build_request(spec, self._codec, arguments)
        method = getattr(self._stub, spec.rpc)
        future = method.future(request, timeout=self._timeout(timeout), metadata=metadata)
        return OpFuture(spec, future, sinks, request)

    def call(
        self,
        op: str,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str | bytes]] | None = None,
        **arguments: Any,
    ) -> _ops.OpResult:
        """Runs an op call and returns its OpResult (AttndError on failure)."""
        # A blocking stub call waits for the reply on this thread; a future's reply comes through
        # gRPC's polling thread and a wake-up of this one, which cost a small call 40-400 µs more
        # on a 2-core test host (docs/LATENCY.md).
        spec = _ops.spec(op)
        request, sinks = _ops.build_request(spec, self._codec, arguments)
        method = getattr(self._stub, spec.rpc)
        try:
            response = method(request, timeout=self._timeout(timeout), metadata=metadata)
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None
        return _ops.decode_response(spec, response, sinks)

    def session(self, client_name: str = "", timeout: float | None = None) -> Session:
        """Opens a Session (a lease and pipelined calls on one stream)."""
        from .session import Session

        return Session(self, client_name=client_name, timeout=timeout)
