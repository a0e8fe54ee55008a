"""AttndError: what every failed attnd call raises, with the gRPC status code and message.

try:
    client.sparse_mla(q=q, kv=kv, indices=idx, sm_scale=0.07)
except AttndError as e:
    if e.code == grpc.StatusCode.INVALID_ARGUMENT: print(e.details)
"""

from typing import Self

import grpc

_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def status_code(value: int) -> grpc.StatusCode:
    """grpc.StatusCode of a google.rpc.Code number (SessionResponse.code)."""
    return _BY_VALUE.get(int(value), grpc.StatusCode.UNKNOWN)


class AttndError(Exception):
    """A call failed: `code` is a grpc.StatusCode, `details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> Self:
        """The AttndError of a failed gRPC call (its code and details, UNKNOWN when absent)."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")
