"""attnd_client.health: the hand-encoded grpc.health.v1 messages."""

import pytest

from attnd_client import health


def test_request_encoding():
    assert health.encode_request("") == b""
    assert health.encode_request("attnd.v1.Attention") == b"\x0a\x12attnd.v1.Attention"
    long = "s" * 200
    assert health.encode_request(long)[:3] == b"\x0a\xc8\x01"


@pytest.mark.parametrize(
    "data,want",
    [
        (b"", "UNKNOWN"),
        (b"\x08\x01", "SERVING"),
        (b"\x08\x02", "NOT_SERVING"),
        (b"\x08\x03", "SERVICE_UNKNOWN"),
        (b"\x12\x02ab\x08\x01", "SERVING"),  # unknown field
        (b"\x08\x81\x01", "129"),
    ],
)
def test_response_decoding(data, want):
    assert health.decode_response(data) == want
