"""attnd_client.health: the generated grpc.health.v1 messages (grpcio-health-checking's, or the
in-tree ones from CMake) and the status names the client reports."""

import pytest

from attnd_client import health


def test_messages_are_generated_grpc_health_v1():
    assert health.SOURCE in ("grpc_health.v1", "attnd_client._gen")
    request = health.health_pb2.HealthCheckRequest(service="attnd.v1.Attention")
    assert request.DESCRIPTOR.full_name == "grpc.health.v1.HealthCheckRequest"
    # The wire form of the standard protocol: field 1, a string.
    assert request.SerializeToString() == b"\x0a\x12attnd.v1.Attention"
    assert health.health_pb2.HealthCheckRequest().SerializeToString() == b""


@pytest.mark.parametrize(
    "data,want",
    [
        (b"", "UNKNOWN"),
        (b"\x08\x01", "SERVING"),
        (b"\x08\x02", "NOT_SERVING"),
        (b"\x08\x03", "SERVICE_UNKNOWN"),
        (b"\x12\x02ab\x08\x01", "SERVING"),  # unknown field
        (b"\x08\x81\x01", "129"),  # an unknown enum value keeps its number
    ],
)
def test_status_names(data, want):
    response = health.health_pb2.HealthCheckResponse.FromString(data)
    assert health.status_name(response) == want
