"""AsyncClient: attnd over grpc.aio, with the same typed op calls as Client (ops.OpCalls: one
method per op, written once) and the same request building (ops.build_request).

    async with AsyncClient("unix:/run/attnd/attnd.sock") as client:
        await client.wait_ready()
        res = await client.sparse_mla(q=q, kv=kv, indices=idx, sm_scale=0.0417)
        results = await asyncio.gather(*(client.topk(logits=l, k=64) for l in rows))

Tensor arguments as for Client: arrays (NumPy, ml_dtypes, DLPack on the CPU, CPU torch
tensors) go inline; RegionRef addresses a region registered elsewhere. Host regions and CUDA
tensors (device regions) need the sync Client, which registers them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any, Self, Unpack

import grpc
import grpc.aio

from . import health as _health
from . import ops as _ops
from ._proto import pb, pb_grpc
from .client import ChannelArgs, open_channel
from .errors import AttndError
from .tensors import RegionRef, TensorCodec


def _no_region(address: int, nbytes: int) -> None:
    return None


def _no_device_region(tensor: Any) -> RegionRef:
    raise ValueError("CUDA tensors need the sync Client (it registers device regions)")


def _aio_channel(
    target: str, credentials: grpc.ChannelCredentials | None, options: list[tuple[str, Any]]
) -> grpc.aio.Channel:
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials, options=options)
    return grpc.aio.insecure_channel(target, options=options)


class AsyncClient(_ops.OpCalls[Coroutine[Any, Any, _ops.OpResult]]):
    """One grpc.aio channel to attnd. Use it from the event loop it was created in."""

    def __init__(self, target: str, **args: Unpack[ChannelArgs]) -> None:
        """Arguments as for Client (client.ChannelArgs)."""
        self.target = target
        self._channel, self.timeout = open_channel(target, _aio_channel, args)
        self._stub = pb_grpc.AttentionStub(self._channel)
        self._health = _health.AsyncHealthStub(self._channel)
        self._codec = TensorCodec(_no_region, _no_device_region)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    async def _rpc(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        try:
            return await method(request, timeout=self._timeout(timeout))
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None

    # ---- service ----

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Returns once the channel is connected and health reports SERVING (AttndError else)."""
        deadline = time.monotonic() + timeout
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except TimeoutError:
            raise AttndError(
                grpc.StatusCode.UNAVAILABLE, f"{self.target}: not connected after {timeout} s"
            ) from None
        status = None
        while time.monotonic() < deadline:
            status = await self.health(timeout=max(0.1, deadline - time.monotonic()))
            if status == "SERVING":
                return
            await asyncio.sleep(0.05)
        raise AttndError(grpc.StatusCode.UNAVAILABLE, f"{self.target}: health is {status}")

    async def health(self, service: str = "", timeout: float | None = None) -> str:
        """grpc.health.v1 status name: "SERVING", "NOT_SERVING", ..."""
        try:
            return await self._health.check(service, timeout=self._timeout(timeout))
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None

    def watch_health(self, service: str = "", timeout: float | None = None) -> AsyncIterator[str]:
        """Status names as they change (`async for`; leave the loop to end the call)."""
        return self._health.watch(service, timeout=timeout)

    async def info(self, timeout: float | None = None) -> pb.GetInfoResponse:
        """attnd.v1.GetInfoResponse: version, backend, devices, ops, limits."""
        return await self._rpc(self._stub.GetInfo, pb.GetInfoRequest(), timeout)

    async def list_regions(self, timeout: float | None = None) -> list[pb.RegionInfo]:
        """[attnd.v1.RegionInfo] of this client's regions (its uid's on the unix socket)."""
        response = await self._rpc(self._stub.ListRegions, pb.ListRegionsRequest(), timeout)
        return list(response.regions)

    # ---- ops ----

    async def call(
        self,
        op: str,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str | bytes]] | None = None,
        **arguments: Any,
    ) -> _ops.OpResult:
        """Runs an op call and returns its OpResult (AttndError on failure); cancelling the
        awaiting task cancels the RPC."""
        spec = _ops.spec(op)
        request, sinks = _ops.build_request(spec, self._codec, arguments)
        method = getattr(self._stub, spec.rpc)
        try:
            response = await method(request, timeout=self._timeout(timeout), metadata=metadata)
        except grpc.RpcError as e:
            raise AttndError.from_rpc_error(e) from None
        return _ops.decode_response(spec, response, sinks)

    def submit(
        self, op: str, timeout: float | None = None, **arguments: Any
    ) -> asyncio.Task[_ops.OpResult]:
        """Starts an op call as a task of the running loop (await it, or cancel() it)."""
        return asyncio.ensure_future(self.call(op, timeout=timeout, **arguments))
