"""Errors carry google.rpc.Status details end to end (docs/SERVICE.md "Status codes"), on a real
CPU daemon through the Python client: a bad tensor is a BadRequest naming the tensor and the
dimension, an unknown region a ResourceInfo with the name as sent, a full queue a RetryInfo; the
plain message is the same as without details, and the raw grpc-status-details-bin trailer parses
as a standard google.rpc.Status (with the in-package decoder, and with googleapis-common-protos
where it is installed)."""

import grpc
import pytest

import attnd_client as ac
from attnd_client import errors
from attnd_client._proto import pb, pb_grpc

import cases
from slow import SlowCall


def _trailer(error):
    for key, value in error.trailing_metadata() or ():
        if key == errors.STATUS_DETAILS_KEY:
            return value
    return None


def test_bad_tensor_is_bad_request_naming_the_dimension(client, rng):
    case = cases.make_case("sparse_mla", rng)
    q = case.inputs["q"][:, :, :575]  # d_qk 575: neither 512 nor 576
    with pytest.raises(ac.AttndError) as info:
        client.sparse_mla(q=q, kv=case.inputs["kv"], indices=case.inputs["indices"], sm_scale=0.1)
    e = info.value
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "q: dim 2 is 575" in e.details
    assert str(e) == f"INVALID_ARGUMENT: {e.details}"  # the message as before
    assert [v.field for v in e.field_violations] == ["q.shape[2]"]
    assert e.field_violations[0].description == e.details
    assert e.retry_delay is None and e.resource_name == ""


def test_session_errors_carry_the_same_details(client, rng):
    case = cases.make_case("sparse_mla", rng)
    q = case.inputs["q"][:, :, :575]
    with client.session() as session:
        with pytest.raises(ac.AttndError) as info:
            session.call(
                "sparse_mla",
                q=q,
                kv=case.inputs["kv"],
                indices=case.inputs["indices"],
                sm_scale=0.1,
            )
        e = info.value
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT
        assert [v.field for v in e.field_violations] == ["q.shape[2]"]
        with pytest.raises(ac.AttndError) as info:
            session.unregister_region("no-such-region")
        assert info.value.code == grpc.StatusCode.NOT_FOUND
        assert info.value.resource_name == "no-such-region"


def test_bad_dtype_names_the_dtype_field(client, rng):
    case = cases.make_case("sparse_mla", rng)
    args = case.arguments()
    args["indices"] = ac.typed(case.inputs["indices"].astype("float32"), "f32")
    with pytest.raises(ac.AttndError) as info:
        client.sparse_mla(**args)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in info.value.field_violations] == ["indices.dtype"], info.value


def test_unknown_region_is_resource_info(client):
    with pytest.raises(ac.AttndError) as info:
        client.unregister_region("status-details-no-such-region")
    e = info.value
    assert e.code == grpc.StatusCode.NOT_FOUND
    assert e.resource_type == "attnd.v1.Region"
    assert e.resource_name == "status-details-no-such-region"
    assert e.field_violations == () and e.retry_delay is None


def test_raw_trailer_is_a_standard_google_rpc_status(daemon):
    channel = grpc.insecure_channel(daemon.unix_target)
    stub = pb_grpc.AttentionStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.UnregisterRegion(pb.UnregisterRegionRequest(name="raw-missing"), timeout=30)
    channel.close()
    raw = _trailer(info.value)
    assert raw, "no grpc-status-details-bin trailer"
    wire = errors._parse_wire(raw)
    assert (wire.resource_type, wire.resource_name) == ("attnd.v1.Region", "raw-missing")
    try:
        from google.rpc import status_pb2
    except ImportError:
        return  # Debian's Python has no googleapis-common-protos: the decoder above did it
    status = status_pb2.Status.FromString(raw)
    assert status.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert status.message == info.value.details()
    assert [d.type_url for d in status.details] == ["type.googleapis.com/google.rpc.ResourceInfo"]
    assert errors._parse_with_googleapis(raw) == wire


def test_queue_full_carries_retry_info(make_daemon):
    d = make_daemon("--workers=1", "--cpu-threads=1", "--queue-capacity=1", tcp=False)
    c = d.client()
    slow = SlowCall(c, "status-details-busy", seconds=1.5, hold=False)
    try:
        futures = [slow.submit() for _ in range(6)]  # 1 running + 1 queued fit
        failures = [e for e in (f.exception(timeout=300) for f in futures) if e is not None]
    finally:
        slow.close()
    full = [e for e in failures if e.code == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert full, [e.code for e in failures]
    for e in full:
        assert "request queue is full" in e.details
        assert e.retry_delay == pytest.approx(0.1)  # docs/SERVICE.md "Status codes"
        assert e.field_violations == ()


def test_wire_decoder_matches_the_fields():
    """The fallback decoder on a message built by hand (field numbers of google.rpc)."""

    def ld(number, payload):
        return bytes([number << 3 | 2, len(payload)]) + payload

    bad = ld(1, ld(1, b"kv.shape[1]") + ld(2, b"kv: dim 1 is 3, want 576"))
    # nanos as a varint: 500_000_000 = 0xdcd6500 -> 80 ca b5 ee 01
    retry = ld(1, bytes([1 << 3, 2, 2 << 3, 0x80, 0xCA, 0xB5, 0xEE, 0x01]))
    status = (
        bytes([1 << 3, 3])
        + ld(2, b"msg")
        + ld(3, ld(1, b"type.googleapis.com/google.rpc.BadRequest") + ld(2, bad))
        + ld(3, ld(1, b"type.googleapis.com/google.rpc.RetryInfo") + ld(2, retry))
        + ld(3, ld(1, b"type.example.com/other.Thing") + ld(2, b"\x08\x01"))
    )
    d = errors.parse_status_details(status)
    assert d.field_violations == (errors.FieldViolation("kv.shape[1]", "kv: dim 1 is 3, want 576"),)
    assert d.retry_delay == pytest.approx(2.5)
    assert errors.parse_status_details(b"\xff\xff") == errors.ErrorDetails()


@pytest.mark.parametrize("length", [4000, 20000])
def test_a_name_no_region_can_have_is_invalid_and_not_echoed(client, length):
    """A region name longer than registration allows (256 bytes) cannot name a region: the
    answer is INVALID_ARGUMENT with the naming rule's short message, not a NOT_FOUND echoing
    the name (at 20,000 bytes the echo alone passed gRPC's 8 KiB metadata limit and the client
    saw RESOURCE_EXHAUSTED instead)."""
    name = "n" * length
    with pytest.raises(ac.AttndError) as info:
        client.unregister_region(name)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert name not in info.value.details
    assert len(info.value.details) < 512
    assert info.value.resource_name == ""
