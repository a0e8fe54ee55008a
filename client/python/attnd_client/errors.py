"""AttndError: what every failed attnd call raises, with the gRPC status code and message, and the
structured causes attnd sends with it (docs/SERVICE.md "Status codes"), read from the
google.rpc.Status in the call's `grpc-status-details-bin` trailer:

try:
    client.sparse_mla(q=q, kv=kv, indices=idx, sm_scale=0.07)
except AttndError as e:
    if e.code == grpc.StatusCode.INVALID_ARGUMENT: print(e.details)
    for v in e.field_violations: print(v.field, v.description)     # "q.shape[2]", ...
    if e.resource_name: print(e.resource_type, e.resource_name)    # "attnd.v1.Region", ...
    if e.retry_delay is not None: time.sleep(e.retry_delay)        # seconds, then try again

The details are parsed with googleapis-common-protos' google.rpc classes when they are installed
(the pip package depends on them), else with the small decoder below (the wire format of those
messages: Debian has no package with them).
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Self

import grpc

_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}

STATUS_DETAILS_KEY = "grpc-status-details-bin"
_TYPE_PREFIX = "type.googleapis.com/google.rpc."


def status_code(value: int) -> grpc.StatusCode:
    """grpc.StatusCode of a google.rpc.Code number (SessionResponse.code)."""
    return _BY_VALUE.get(int(value), grpc.StatusCode.UNKNOWN)


@dataclass(frozen=True)
class FieldViolation:
    """One google.rpc.BadRequest.FieldViolation: the request field at fault and why."""

    field: str
    description: str


@dataclass(frozen=True)
class ErrorDetails:
    """The google.rpc details of a failed call that attnd sends (empty when none)."""

    field_violations: tuple[FieldViolation, ...] = ()
    resource_type: str = ""
    resource_name: str = ""
    retry_delay: float | None = None  # seconds; None: do not retry the same call as it is
    reason: str = ""
    domain: str = ""


class AttndError(Exception):
    """A call failed: `code` is a grpc.StatusCode, `details` the server's message; the
    structured causes (field_violations, resource_type/resource_name, retry_delay) are empty
    when the server sent none."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        error_details: ErrorDetails | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.error_details = error_details or ErrorDetails()

    @property
    def field_violations(self) -> tuple[FieldViolation, ...]:
        return self.error_details.field_violations

    @property
    def resource_type(self) -> str:
        return self.error_details.resource_type

    @property
    def resource_name(self) -> str:
        return self.error_details.resource_name

    @property
    def retry_delay(self) -> float | None:
        return self.error_details.retry_delay

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> Self:
        """The AttndError of a failed gRPC call (its code and details, UNKNOWN when absent, and
        the google.rpc details of its trailer)."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "", details_of(error))


def details_of(error: Any) -> ErrorDetails:
    """The ErrorDetails in a failed call's trailing metadata (sync or grpc.aio); empty when
    there are none or they do not parse."""
    try:
        trailer = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    except Exception:  # noqa: BLE001 - a call without metadata: no details
        return ErrorDetails()
    for key, value in trailer or ():
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes | bytearray):
            return parse_status_details(bytes(value))
    return ErrorDetails()


def parse_status_details(data: bytes) -> ErrorDetails:
    """ErrorDetails of a serialized google.rpc.Status (unknown detail types are skipped)."""
    try:
        return _parse_with_googleapis(data) if _GOOGLEAPIS else _parse_wire(data)
    except Exception:  # noqa: BLE001 - a malformed trailer is no reason to lose the error
        return ErrorDetails()


# ---- googleapis-common-protos ----

try:
    from google.rpc import error_details_pb2, status_pb2

    _GOOGLEAPIS = True
except ImportError:  # pragma: no cover - depends on the environment
    _GOOGLEAPIS = False


def _parse_with_googleapis(data: bytes) -> ErrorDetails:
    status = status_pb2.Status.FromString(data)
    violations: list[FieldViolation] = []
    out: dict[str, Any] = {}
    for any_ in status.details:
        if any_.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            any_.Unpack(bad)
            violations += [FieldViolation(v.field, v.description) for v in bad.field_violations]
        elif any_.Is(error_details_pb2.ResourceInfo.DESCRIPTOR):
            info = error_details_pb2.ResourceInfo()
            any_.Unpack(info)
            out["resource_type"] = info.resource_type
            out["resource_name"] = info.resource_name
        elif any_.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            any_.Unpack(retry)
            out["retry_delay"] = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
        elif any_.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            any_.Unpack(info)
            out["reason"] = info.reason
            out["domain"] = info.domain
    return ErrorDetails(field_violations=tuple(violations), **out)


# ---- the wire format, for a Python without googleapis-common-protos ----
# google.rpc.Status: details = 3 (repeated google.protobuf.Any: type_url = 1, value = 2);
# BadRequest: field_violations = 1 (field = 1, description = 2); ResourceInfo: resource_type = 1,
# resource_name = 2; RetryInfo: retry_delay = 1 (google.protobuf.Duration: seconds = 1,
# nanos = 2); ErrorInfo: reason = 1, domain = 2.


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field: an int for varints, bytes for length-delimited."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise ValueError("truncated field")
            yield number, data[pos : pos + size]
            pos += size
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")


def _strings(data: bytes) -> dict[int, str]:
    return {n: v.decode("utf-8", "replace") for n, v in _fields(data) if isinstance(v, bytes)}


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _parse_wire(data: bytes) -> ErrorDetails:
    violations: list[FieldViolation] = []
    out: dict[str, Any] = {}
    for number, any_bytes in _fields(data):
        if number != 3 or not isinstance(any_bytes, bytes):
            continue
        parts = dict(_fields(any_bytes))
        type_url, value = parts.get(1, b""), parts.get(2, b"")
        if not isinstance(type_url, bytes) or not isinstance(value, bytes):
            continue
        name = type_url.decode("utf-8", "replace")
        if not name.startswith(_TYPE_PREFIX):
            continue
        name = name[len(_TYPE_PREFIX) :]
        if name == "BadRequest":
            for n, v in _fields(value):
                if n == 1 and isinstance(v, bytes):
                    s = _strings(v)
                    violations.append(FieldViolation(s.get(1, ""), s.get(2, "")))
        elif name == "ResourceInfo":
            s = _strings(value)
            out["resource_type"] = s.get(1, "")
            out["resource_name"] = s.get(2, "")
        elif name == "RetryInfo":
            seconds = nanos = 0
            for n, v in _fields(value):
                if n == 1 and isinstance(v, bytes):
                    d = {k: x for k, x in _fields(v) if isinstance(x, int)}
                    seconds, nanos = _signed(d.get(1, 0)), _signed(d.get(2, 0))
            out["retry_delay"] = seconds + nanos / 1e9
        elif name == "ErrorInfo":
            s = _strings(value)
            out["reason"] = s.get(1, "")
            out["domain"] = s.get(2, "")
    return ErrorDetails(field_violations=tuple(violations), **out)
