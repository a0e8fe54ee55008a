"""grpc.health.v1.Health through its generated stubs: grpcio-health-checking's grpc_health.v1
(what an installed attnd_client depends on), else the in-tree stubs that the CMake target
attn_python_stubs generates into _gen/ for a Python without it (Debian's).

    status = HealthStub(channel).check("")      # "SERVING", "NOT_SERVING", ...
    for status in HealthStub(channel).watch(""): ...
    status = await AsyncHealthStub(aio_channel).check("")
"""

from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

import grpc
import grpc.aio

try:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
except ImportError:  # pragma: no cover - depends on the environment
    from ._gen import health_pb2, health_pb2_grpc  # type: ignore[no-redef]

# The module the messages come from ("grpc_health.v1" or "attnd_client._gen").
SOURCE = health_pb2.__name__.rsplit(".", 1)[0]


def status_name(response: Any) -> str:
    """The ServingStatus name of a HealthCheckResponse ("SERVING", ...; the number when unknown)."""
    enum = health_pb2.HealthCheckResponse.ServingStatus
    try:
        return enum.Name(response.status)
    except ValueError:
        return str(response.status)


class HealthWatch(Protocol):
    """What HealthStub.watch returns: status names as they change; cancel() ends the call."""

    def __iter__(self) -> Iterator[str]: ...

    def __next__(self) -> str: ...

    def cancel(self) -> bool: ...


class _Watch:
    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return status_name(next(self._call))

    def cancel(self) -> bool:
        return self._call.cancel()


class HealthStub:
    """Check and Watch on a grpc.Channel, answering status names."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = health_pb2_grpc.HealthStub(channel)

    def check(self, service: str = "", timeout: float | None = None) -> str:
        request = health_pb2.HealthCheckRequest(service=service)
        return status_name(self._stub.Check(request, timeout=timeout))

    def watch(self, service: str = "", timeout: float | None = None) -> HealthWatch:
        """An iterator of status names (a grpc call: .cancel() ends it)."""
        request = health_pb2.HealthCheckRequest(service=service)
        return _Watch(self._stub.Watch(request, timeout=timeout))


class AsyncHealthStub:
    """Check and Watch on a grpc.aio.Channel, answering status names."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = health_pb2_grpc.HealthStub(channel)

    async def check(self, service: str = "", timeout: float | None = None) -> str:
        request = health_pb2.HealthCheckRequest(service=service)
        return status_name(await self._stub.Check(request, timeout=timeout))

    async def watch(self, service: str = "", timeout: float | None = None) -> AsyncIterator[str]:
        """Status names as they change (leave the loop, or cancel the task, to end the call)."""
        call = self._stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        try:
            async for response in call:
                yield status_name(response)
        finally:
            call.cancel()
