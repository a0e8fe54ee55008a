"""grpc.health.v1.Health without its generated stubs: the two tiny messages are encoded by hand
(HealthCheckRequest {string service = 1}, HealthCheckResponse {ServingStatus status = 1}).

    status = HealthStub(channel).check("")      # "SERVING", "NOT_SERVING", ...
    for status in HealthStub(channel).watch(""): ...
"""

from collections.abc import Iterator
from typing import Protocol

import grpc

STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_request(service: str) -> bytes:
    data = service.encode()
    return b"\x0a" + _varint(len(data)) + data if data else b""


def decode_response(data: bytes) -> str:
    """The ServingStatus name in a HealthCheckResponse (unknown fields skipped)."""
    status, i = 0, 0
    while i < len(data):
        tag = data[i]
        i += 1
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            value, shift = 0, 0
            while True:
                byte = data[i]
                i += 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            if field == 1:
                status = value
        elif wire == 2:
            length, shift = 0, 0
            while True:
                byte = data[i]
                i += 1
                length |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            i += length
        else:
            raise ValueError(f"HealthCheckResponse: unexpected wire type {wire}")
    return STATUS_NAMES.get(status, str(status))


class HealthWatch(Protocol):
    """What HealthStub.watch returns: a gRPC call that iterates status names; cancel() ends it."""

    def __iter__(self) -> Iterator[str]: ...

    def __next__(self) -> str: ...

    def cancel(self) -> bool: ...


class HealthStub:
    def __init__(self, channel: grpc.Channel) -> None:
        self._check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=encode_request,
            response_deserializer=decode_response,
        )
        self._watch = channel.unary_stream(
            "/grpc.health.v1.Health/Watch",
            request_serializer=encode_request,
            response_deserializer=decode_response,
        )

    def check(self, service: str = "", timeout: float | None = None) -> str:
        return self._check(service, timeout=timeout)

    def watch(self, service: str = "", timeout: float | None = None) -> HealthWatch:
        """An iterator of status names (a grpc call: .cancel() ends it)."""
        return self._watch(service, timeout=timeout)
